"""What the chat app needs from a model, and a fake model that tests can drive.

The TUI never talks to the engine directly: it holds a `ChatSession`, calls `load()` once and
`send()` per turn from a worker thread, and reads `Response`-like records (`text`, `reasoning`,
`generation_tokens`, `prompt_tokens`, `generation_tps`, `finish_reason`). `FakeSession` streams a
fixed reply at a chosen rate; `ninfer_cli.tui.engine_session.EngineSession` wraps the real engine.
"""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Iterator, Protocol

EFFORTS = ("off", "low", "medium", "high")


@dataclass
class ModelInfo:
    """What the status bar shows about the loaded model."""

    name: str
    context_max: int = 0
    device: str = "cpu"
    thinking: bool = True  # whether the model's template can think at all


@dataclass
class Memory:
    """Memory the model lives in: VRAM on the GPU path, process memory against RAM on NumPy."""

    label: str
    used: int
    total: int


@dataclass
class ChatSettings:
    """Per-conversation generation settings; `None` sampling values mean the model's preset."""

    effort: str | None = None  # None: the model's default
    system: str | None = None
    thinking_budget: int | None = None
    max_tokens: int = 2048
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    format: str | None = None  # a `/format` argument (json, schema FILE, choice a,b ...); None: free text
    spec: str | None = None  # speculative decoding, "mtp:K" (engine.speculative.parse_spec); None or "off": none

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ChatSettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# `/set` parameters: name -> converter (None clears a sampling value back to the preset).
SETTABLE = {
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "max_tokens": int,
    "seed": int,
    "thinking_budget": int,
}


def set_param(settings: ChatSettings, name: str, value: str) -> object:
    """Parse and apply `/set name value`; returns the stored value or raises ValueError."""
    name = name.replace("-", "_")
    if name not in SETTABLE:
        raise ValueError(f"unknown parameter '{name}' (one of: {', '.join(SETTABLE)})")
    if value.lower() in ("none", "default", "auto"):
        if name == "max_tokens":
            raise ValueError("max_tokens needs a number")
        parsed = None
    else:
        try:
            parsed = SETTABLE[name](value)
        except ValueError:
            raise ValueError(f"{name} needs a {SETTABLE[name].__name__}, not '{value}'") from None
        if name in ("max_tokens",) and parsed <= 0:
            raise ValueError("max_tokens must be positive")
    setattr(settings, name, parsed)
    return parsed


def normalize_effort(value: str) -> str | None:
    """Map user spellings (none, minimal, xhigh, max, on...) onto off|low|medium|high;
    `default` gives None (the model's own default)."""
    v = value.strip().lower()
    if v in ("default", "auto"):
        return None
    aliases = {"none": "off", "disable": "off", "false": "off", "no": "off", "minimal": "low",
               "xhigh": "high", "max": "high", "on": "high", "true": "high"}
    v = aliases.get(v, v)
    if v not in EFFORTS:
        raise ValueError(f"reasoning effort must be one of {', '.join(EFFORTS)} or default, not '{value}'")
    return v


@dataclass
class Chunk:
    """A record shaped like `engine.generate.Response` for sessions that are not the engine."""

    text: str = ""
    token: int = -1
    reasoning: str = ""
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    memory: int = 0
    finish_reason: str | None = None
    spec: dict | None = None  # the final record's: engine.speculative.SpecStats.as_dict() of the answer's rounds


def spec_on(spec: str | None) -> bool:
    return spec not in (None, "off")


class ChatSession(Protocol):
    """The adapter the TUI drives. `send` runs in a worker thread; the rest is cheap."""

    info: ModelInfo

    def load(self, progress=None) -> None:
        """Load the model (slow; called from a worker thread), pulling it first where needed with
        `progress(label, done, total)` per step. Raise NinferError on failure."""

    def send(self, messages: list[dict], settings: ChatSettings,
             cancel: threading.Event) -> Iterator[Chunk]:
        """Stream the assistant's reply to `messages` (system first, then user/assistant turns)."""

    def memory(self) -> Memory:
        """Current memory use, for the gauge."""


def process_memory() -> Memory:
    """Resident memory of this process against the machine's physical RAM."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = page * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[1]) * page
    except OSError:
        import resource

        used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return Memory("RAM", used, total)


_PIECES = re.compile(r"\s*\S+|\s+")


def split_tokens(text: str) -> list[str]:
    """Split text into word-sized pieces that join back to exactly `text`."""
    return _PIECES.findall(text)


DEFAULT_REPLY = (
    "Here is a short answer to **{q}**.\n\n"
    "1. First point\n2. Second point\n\n"
    "```python\nprint('hello from ninfer')\n```\n\n"
    "That is all."
)


@dataclass
class FakeSession:
    """A deterministic stand-in for a model: streams `reply` (with thinking unless effort is off)
    at `tokens_per_second`, honouring `cancel` between tokens at once."""

    info: ModelInfo = field(default_factory=lambda: ModelInfo("fake-model", 4096, "cpu"))
    reply: str = DEFAULT_REPLY
    reasoning: str = "The user asks about {q}. I should answer briefly."
    tokens_per_second: float = 0.0
    prefill_seconds: float = 0.0
    load_seconds: float = 0.0
    load_phases: tuple = ()  # (label, total bytes) steps reported before loading, as a first pull does
    load_error: Exception | None = None
    send_error: Exception | None = None
    memory_reading: Memory = field(default_factory=lambda: Memory("RAM", 512 << 20, 8 << 30))
    spec_stats: dict | None = None  # what the final record says of speculative rounds, while settings.spec is on
    calls: list = field(default_factory=list)

    def load(self, progress=None) -> None:
        for label, total in self.load_phases:
            for step in range(5):
                if progress is not None:
                    progress(label, total * step // 4, total)
                time.sleep(self.load_seconds / max(5 * len(self.load_phases), 1))
        if self.load_seconds and not self.load_phases:
            time.sleep(self.load_seconds)
        if self.load_error is not None:
            raise self.load_error

    def memory(self) -> Memory:
        return self.memory_reading

    def send(self, messages, settings, cancel):
        self.calls.append(([dict(m) for m in messages], ChatSettings.from_dict(settings.to_dict())))
        if self.send_error is not None:
            raise self.send_error
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        q = question.strip().splitlines()[0][:60] if question.strip() else "nothing"
        prompt_tokens = sum(len(split_tokens(m["content"])) + 4 for m in messages)
        if self.prefill_seconds and cancel.wait(self.prefill_seconds):
            yield Chunk(prompt_tokens=prompt_tokens, finish_reason="cancelled")
            return
        pieces: list[tuple[str, str]] = []
        if settings.effort != "off":
            pieces += [("reasoning", p) for p in split_tokens(self.reasoning.format(q=q))]
        pieces += [("text", p) for p in split_tokens(self.reply.format(q=q))]
        limit = settings.max_tokens
        start = time.perf_counter()
        n = 0
        for kind, piece in pieces:
            if n >= limit:
                break
            if self.tokens_per_second:
                delay = start + (n + 1) / self.tokens_per_second - time.perf_counter()
                if delay > 0 and cancel.wait(delay):
                    break
            if cancel.is_set():
                break
            n += 1
            elapsed = max(time.perf_counter() - start, 1e-9)
            yield Chunk(text=piece if kind == "text" else "", reasoning=piece if kind == "reasoning" else "",
                        token=n, prompt_tokens=prompt_tokens, generation_tokens=n,
                        generation_tps=n / elapsed)
        reason = "cancelled" if cancel.is_set() else ("length" if n >= limit and n < len(pieces) else "stop")
        elapsed = max(time.perf_counter() - start, 1e-9)
        yield Chunk(prompt_tokens=prompt_tokens, generation_tokens=n, generation_tps=n / elapsed,
                    finish_reason=reason, spec=self.spec_stats if spec_on(settings.spec) else None)
