"""What the server writes about requests: one line each on stderr, and (with `--request-log FILE`) JSON lines
`{"event": "server_start" | "request_start" | "request_done" | "request_error", ...}`."""
from __future__ import annotations

import json
import sys
import threading
import time


class RequestLog:
    """The stderr line of each request and the optional JSON-lines file."""

    def __init__(self, path: str | None = None, stream=None):
        self.stream = stream
        self._file = open(path, "a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115
        self._lock = threading.Lock()

    def event(self, event: str, **fields) -> None:
        """One JSON line in the request log (no-op without one)."""
        if self._file is None:
            return
        record = {"event": event, "time": round(time.time(), 3), **fields}
        with self._lock:
            self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")

    def line(self, method: str, path: str, status: int, ms: float, usage: dict | None) -> None:
        """`POST /v1/chat/completions 200 · prompt 37 · output 7 tokens · 19.9 tok/s · 512 ms` on stderr."""
        parts = [f"{method} {path} {status}"]
        if usage:
            parts += [f"prompt {usage['prompt_tokens']}", f"output {usage['output_tokens']} tokens",
                      f"{usage['tokens_per_s']:.1f} tok/s"]
            if usage["finish_reason"] not in ("stop", None):
                parts.append(usage["finish_reason"])
        parts.append(f"{ms:.0f} ms")
        stream = self.stream or sys.stderr
        stream.write(" · ".join(parts) + "\n")
        stream.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def usage_of(run) -> dict | None:
    """Token counts, rate and timings (ms) of a finished run, for both logs."""
    final = getattr(run, "final", None)
    if final is None or final.stats is None:
        return None
    s = final.stats
    return {"prompt_tokens": s.prompt_tokens, "output_tokens": s.generation_tokens,
            "reasoning_tokens": s.reasoning_tokens, "tokens_per_s": round(s.generation_tps, 2),
            "finish_reason": final.finish_reason,
            "timings_ms": {"prepare": round(run.prepared.prepare_s * 1e3, 2),
                           "queue": round(run.queued_s * 1e3, 2),
                           "prefill": round(s.ttft_s * 1e3, 2),
                           "decode": round(max(s.total_s - s.ttft_s, 0.0) * 1e3, 2),
                           "generate": round(s.total_s * 1e3, 2)},
            **({"spec": s.spec} if getattr(s, "spec", None) is not None else {})}
