"""Messages the worker thread posts to the app, and the buffer a streaming turn fills.

The worker never touches widgets. It pushes text into a `TurnBuffer` and posts one `Arrived`
wake-up only when the buffer goes from empty to non-empty, so at 300 tok/s the app handles as many
messages as it can render, not one per token, and no text is lost in between.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from textual.message import Message

from engine.errors import NinferError


def error_text(exc: BaseException) -> str:
    """One line for the chat: the message and, for NinferError, what to do next."""
    if isinstance(exc, NinferError):
        return exc.message + (f" → {exc.next_action}" if exc.next_action else "")
    if isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__:
        return "out of memory → lower --ctx or --max-tokens, or close other programs"
    return f"{type(exc).__name__}: {exc}"


@dataclass
class TurnStats:
    """Timings of one answer, as the status bar and `/stats` show them."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: float = 0.0
    tokens_per_second: float = 0.0
    prompt_tps: float = 0.0
    seconds: float = 0.0
    finish_reason: str = ""
    spec: dict | None = None  # engine.speculative.SpecStats.as_dict() of the answer's rounds, when it speculated

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class TurnBuffer:
    """Text produced by the worker and not yet shown; written by the worker, drained by the app."""

    turn: int
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    tokens: int = 0
    prompt_tokens: int = 0  # known once the prompt is tokenized (before the first token)
    _reasoning: list[str] = field(default_factory=list)
    _text: list[str] = field(default_factory=list)
    _woken: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def push(self, reasoning: str, text: str, tokens: int) -> bool:
        """Add a record's text (worker side). True when the app must be woken up."""
        now = time.perf_counter()
        with self._lock:
            if tokens > self.tokens:
                if self.first_token_at is None:
                    self.first_token_at = now
                self.last_token_at = now
                self.tokens = tokens
            if reasoning:
                self._reasoning.append(reasoning)
            if text:
                self._text.append(text)
            if (reasoning or text) and not self._woken:
                self._woken = True
                return True
            return False

    def drain(self) -> tuple[str, str]:
        """Take everything pending (app side): (reasoning, text)."""
        with self._lock:
            r, t = "".join(self._reasoning), "".join(self._text)
            self._reasoning.clear()
            self._text.clear()
            self._woken = False
            return r, t

    def stats(self, final, cancelled: bool) -> TurnStats:
        """The turn's figures: the last Response's where the engine gave them, else what the buffer timed."""
        first, last = self.first_token_at, self.last_token_at
        rate = getattr(final, "generation_tps", 0.0) if final is not None else 0.0
        if not rate and first is not None and last is not None and self.tokens > 1:
            rate = (self.tokens - 1) / max(last - first, 1e-6)
        reason = getattr(final, "finish_reason", None) or ("cancelled" if cancelled else "stop")
        return TurnStats(prompt_tokens=getattr(final, "prompt_tokens", 0) or 0,
                         generation_tokens=getattr(final, "generation_tokens", 0) or self.tokens,
                         ttft=(first - self.started) if first is not None else 0.0,
                         tokens_per_second=rate, prompt_tps=getattr(final, "prompt_tps", 0.0) or 0.0,
                         seconds=time.perf_counter() - self.started, finish_reason=reason,
                         spec=getattr(final, "spec", None))

    def live_rate(self, now: float | None = None) -> float:
        """Tokens per second since the first token (0 before the second one)."""
        with self._lock:
            if self.first_token_at is None or self.tokens < 2:
                return 0.0
            end = now if now is not None else time.perf_counter()
            return (self.tokens - 1) / max(end - self.first_token_at, 1e-6)


class ModelLoaded(Message):
    """The session finished loading."""


class LoadProgress(Message):
    """A step of getting the model ready (the first run's pull): phase `label`, `done` of `total` bytes."""

    def __init__(self, label: str, done: int, total: int | None) -> None:
        super().__init__()
        self.label, self.done, self.total = label, done, total


class ModelFailed(Message):
    """Loading failed; `text` says why and what to do."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Arrived(Message):
    """New text waits in the turn's buffer."""

    def __init__(self, turn: int) -> None:
        super().__init__()
        self.turn = turn


class TurnDone(Message):
    """The worker finished a turn (stopped, cut at max tokens, or complete)."""

    def __init__(self, turn: int, stats: TurnStats) -> None:
        super().__init__()
        self.turn = turn
        self.stats = stats


class TurnFailed(Message):
    """The worker raised; `text` is the one-line message shown in the chat."""

    def __init__(self, turn: int, text: str) -> None:
        super().__init__()
        self.turn = turn
        self.text = text
