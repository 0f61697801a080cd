"""Soak test of `ninfer serve`: N concurrent clients for a bounded time, mixed prompt and output lengths,
OpenAI Chat Completions and Anthropic Messages, streaming and not, every answer checked against its own
greedy answer (taken one request at a time before the soak).

    python bench/serve_soak.py --clients 4 --seconds 60                 # starts `ninfer serve` itself
    python bench/serve_soak.py --url http://127.0.0.1:8080 --model smollm2-135m --api-key KEY

Prints requests, errors, lost / truncated / mismatched answers, p50/p95 time to first token and latency,
and tok/s; exits 1 unless every answer arrived whole and equal to its reference.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

TOWN = ("The town of Wexmoor sits in a green valley between two rivers. Its market opens every Tuesday, when "
        "farmers bring apples, cheese and wool from the hills. The old stone bridge was built three hundred years "
        "ago and still carries carts across the northern river. ")
KINDS = [  # (prompt, max_tokens): short and long prompts, short and long answers
    ("What is the capital of France?", 16),
    ("Hi", 8),
    ("Name three colors.", 24),
    ("Write a haiku about the sea.", 48),
    ("Count from one to twenty in words.", 64),
    ("Explain in one paragraph why the sky is blue.", 96),
    (TOWN * 3 + "\nWhat is the name of the town?", 12),
    (TOWN * 8 + "\nSummarize the text above in one sentence.", 32),
]


@dataclass
class Result:
    kind: int
    api: str
    stream: bool
    ok: bool = False
    problem: str = ""  # "error" | "lost" | "truncated" | "mismatch"
    detail: str = ""
    ttft: float | None = None
    latency: float = 0.0
    tokens: int = 0
    prompt_tokens: int = 0


def _sse(response):
    """(event name, data) pairs of a server-sent event stream."""
    event = None
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            yield event, line[5:].strip()
            event = None


def ask(client: httpx.Client, base: str, model: str, kind: int, api: str, stream: bool, timeout: float) -> Result:
    """One request; the answer's text, token count and timings."""
    prompt, max_tokens = KINDS[kind]
    res = Result(kind, api, stream)
    messages = [{"role": "user", "content": prompt}]
    if api == "openai":
        url, body = base + "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": max_tokens,
                                                     "temperature": 0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
    else:
        url, body = base + "/v1/messages", {"model": model, "messages": messages, "max_tokens": max_tokens,
                                             "temperature": 0, "stream": stream}
    t0 = time.perf_counter()
    text, ended, finished, ids = "", False, False, set()
    try:
        if not stream:
            r = client.post(url, json=body, timeout=timeout)
            if r.status_code != 200:
                return _failed(res, "error", f"{r.status_code} {r.text[:200]}", t0)
            data = r.json()
            if api == "openai":
                text, res.tokens = data["choices"][0]["message"]["content"] or "", data["usage"]["completion_tokens"]
                res.prompt_tokens = data["usage"]["prompt_tokens"]
                ended = data["choices"][0]["finish_reason"] in ("stop", "length")
            else:
                text = "".join(b.get("text", "") for b in data["content"] if b["type"] == "text")
                res.tokens, ended = data["usage"]["output_tokens"], data["stop_reason"] in ("end_turn", "max_tokens")
        else:
            with client.stream("POST", url, json=body, timeout=timeout) as r:
                if r.status_code != 200:
                    return _failed(res, "error", f"{r.status_code} {r.read()[:200]!r}", t0)
                for event, raw in _sse(r):
                    if raw == "[DONE]":
                        ended = finished  # the finish reason came, then [DONE]
                        break
                    data = json.loads(raw)
                    if "error" in data and (api == "openai" or event == "error"):
                        return _failed(res, "error", raw[:200], t0)
                    piece = ""
                    if api == "openai":
                        ids.add(data["id"])
                        for choice in data["choices"]:
                            piece = choice["delta"].get("content") or ""
                            finished = finished or choice["finish_reason"] is not None
                        if data.get("usage"):
                            res.tokens = data["usage"]["completion_tokens"]
                    else:
                        if event == "message_start":
                            ids.add(data["message"]["id"])
                        elif event == "content_block_delta" and data["delta"]["type"] == "text_delta":
                            piece = data["delta"]["text"]
                        elif event == "message_delta":
                            res.tokens = data["usage"]["output_tokens"]
                        elif event == "message_stop":
                            ended = True
                    if piece and res.ttft is None:
                        res.ttft = time.perf_counter() - t0
                    text += piece
    except httpx.TimeoutException as exc:
        return _failed(res, "lost", f"no answer within {timeout:g} s ({type(exc).__name__})", t0)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return _failed(res, "error", f"{type(exc).__name__}: {exc}", t0)
    res.latency = time.perf_counter() - t0
    if not ended or len(ids) > 1:
        return _failed(res, "truncated", f"stream ended without its final event (ids {sorted(ids)})", t0)
    res.ok, res.detail = True, text
    return res


def _failed(res: Result, problem: str, detail: str, t0: float) -> Result:
    res.problem, res.detail, res.latency = problem, detail, time.perf_counter() - t0
    return res


def start_server(model: str, device: str, ctx: int, env: dict) -> tuple[subprocess.Popen, str, list[str]]:
    """`ninfer serve MODEL --port 0` in a subprocess; (process, base URL, its stderr lines)."""
    cmd = [sys.executable, "-m", "ninfer_cli.main", "serve", model, "--port", "0", "--device", device,
           "--ctx", str(ctx)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[1])
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    deadline = time.monotonic() + 300
    url = None
    while time.monotonic() < deadline:
        found = next((re.search(r"listening on (http://\S+?) ", line) for line in list(lines) if "listening" in line),
                     None)
        url = url or (found.group(1) if found else None)
        if url:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return proc, url, lines
            except httpx.HTTPError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("ninfer serve did not start:\n" + "".join(lines))


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank), 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (default: start `ninfer serve MODEL` on a free port)")
    ap.add_argument("--model", default="smollm2-135m", help="model to serve, and its id in requests")
    ap.add_argument("--api-key", default=os.environ.get("NINFER_API_KEY"))
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long clients keep starting requests")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before an unanswered request is lost")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the report to this file")
    args = ap.parse_args(argv)

    proc, lines = None, []
    env = {**os.environ}
    if args.url:
        base = args.url.rstrip("/")
    else:
        env.pop("NINFER_API_KEY", None)
        proc, base, lines = start_server(args.model, args.device, args.ctx, env)
        args.api_key = None
    model = args.model.removesuffix(":latest")
    headers = {"x-api-key": args.api_key} if args.api_key else {}
    try:
        with httpx.Client(headers=headers) as client:
            refs = []
            for kind in range(len(KINDS)):  # one at a time: each kind's own greedy answer
                ref = ask(client, base, model, kind, "openai", False, args.timeout)
                if not ref.ok:
                    raise SystemExit(f"reference request {kind} failed: {ref.problem} {ref.detail}")
                refs.append(ref)
        results: list[Result] = []
        lock = threading.Lock()
        t_start = time.perf_counter()
        deadline = t_start + args.seconds

        def client_loop(i: int) -> None:
            rng = random.Random(args.seed * 1000 + i)
            with httpx.Client(headers=headers) as client:
                while time.perf_counter() < deadline:
                    kind = rng.randrange(len(KINDS))
                    res = ask(client, base, model, kind, rng.choice(("openai", "anthropic")), rng.random() < 0.5,
                              args.timeout)
                    if res.ok and (res.detail != refs[kind].detail or res.tokens != refs[kind].tokens):
                        res.ok, res.problem = False, "mismatch"
                        res.detail = f"got {res.detail[:60]!r} ({res.tokens} tokens), expected " \
                                     f"{refs[kind].detail[:60]!r} ({refs[kind].tokens})"
                    with lock:
                        results.append(res)

        threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t_start
    finally:
        if proc is not None:
            proc.send_signal(2)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    report = summarize(results, refs, wall, args, base, model)
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report + "\n")
    return 0 if all(r.ok for r in results) and results else 1


def summarize(results: list[Result], refs: list[Result], wall: float, args, base: str, model: str) -> str:
    problems = {p: [r for r in results if r.problem == p] for p in ("error", "lost", "truncated", "mismatch")}
    ok = [r for r in results if r.ok]
    streamed = [r for r in ok if r.stream]
    ttft = [r.ttft for r in streamed if r.ttft is not None]
    lat = [r.latency for r in ok]
    tokens = sum(r.tokens for r in ok)
    decode = [r.tokens / (r.latency - r.ttft) for r in streamed if r.ttft is not None and r.latency > r.ttft
              and r.tokens > 1]
    prompt_lens = sorted(r.prompt_tokens for r in refs)
    out = [
        f"serve soak: {model} at {base}, {args.clients} clients for {args.seconds:g} s (requests started before the "
        f"end finish; wall {wall:.1f} s), {len(KINDS)} request kinds (prompts {prompt_lens[0]}-{prompt_lens[-1]} "
        f"tokens, max_tokens {min(m for _, m in KINDS)}-{max(m for _, m in KINDS)}), greedy, "
        f"Chat Completions and Messages, streaming and not",
        f"requests {len(results)} (streamed {sum(r.stream for r in results)}, not "
        f"{sum(not r.stream for r in results)}; chat {sum(r.api == 'openai' for r in results)}, messages "
        f"{sum(r.api == 'anthropic' for r in results)}) · ok {len(ok)} · errors {len(problems['error'])} · "
        f"lost {len(problems['lost'])} · truncated {len(problems['truncated'])} · "
        f"mismatched {len(problems['mismatch'])}",
        f"time to first token (streamed, {len(ttft)}; includes the wait for the engine): p50 {pct(ttft, 50):.2f} s · p95 {pct(ttft, 95):.2f} s",
        f"latency (request to last byte, {len(lat)}): p50 {pct(lat, 50):.2f} s · p95 {pct(lat, 95):.2f} s",
        f"output: {tokens} tokens in {wall:.1f} s = {tokens / wall if wall else 0:.1f} tok/s across all clients; "
        f"one stream's decode p50 {statistics.median(decode) if decode else 0:.1f} tok/s",
        f"references: {', '.join(f'{r.tokens}' for r in refs)} tokens for kinds 0-{len(refs) - 1}",
    ]
    for p, items in problems.items():
        for r in items[:5]:
            out.append(f"  {p}: kind {r.kind} {r.api} {'stream' if r.stream else 'json'}: {r.detail}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
