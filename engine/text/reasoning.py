"""Reasoning controls: thinking on/off, effort mapped onto what a template accepts, the thinking budget,
and splitting a streamed answer into reasoning and content (runtime spec §3.8, ux spec §3).

ninfer's effort scale is off|low|medium|high. Templates differ: Qwen3.8 takes `reasoning_effort` in
{low, medium, xhigh} (and rejects `high`), Qwen3.6 only `enable_thinking`. We read the template's own
list of accepted values instead of hard-coding one model.
"""
from __future__ import annotations

import re

from engine.errors import NinferError

EFFORTS = ("off", "low", "medium", "high")
_ALIASES = {
    "off": "off", "none": "off", "disable": "off", "disabled": "off", "false": "off", "no": "off",
    "minimal": "low", "low": "low", "medium": "medium", "on": "high", "true": "high",
    "high": "high", "xhigh": "high", "max": "high",
}
# What each ninfer level may be called in a template, best first.
_TEMPLATE_NAMES = {"low": ("low", "minimal"), "medium": ("medium",), "high": ("high", "xhigh", "max")}
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Qwen's documented early-close text for a thinking budget (spec §3.8).
THINKING_BUDGET_CLOSE = ("\n\nConsidering the limited time by the user, I have to give the solution based on "
                         "the thinking directly now.\n</think>\n\n")


def normalize_effort(value: str | None) -> str | None:
    """`off|low|medium|high` from any common spelling (none, minimal, xhigh, max, ...); None stays None."""
    if value is None:
        return None
    key = str(getattr(value, "value", value)).strip().lower()
    if key not in _ALIASES:
        raise NinferError(f"unknown reasoning effort {value!r}", "use off, low, medium or high")
    return _ALIASES[key]


def accepted_efforts(template_source: str) -> tuple[str, ...]:
    """The `reasoning_effort` values a template lists as allowed (empty when it takes none)."""
    if "reasoning_effort" not in template_source:
        return ()
    m = re.search(r"reasoning_effort\s+not\s+in\s*\(([^)]*)\)", template_source)
    if m is None:
        m = re.search(r"resolved_reasoning_effort\s+not\s+in\s*\(([^)]*)\)", template_source)
    if m is None:
        return ("low", "medium", "high")
    return tuple(re.findall(r"['\"]([A-Za-z_]+)['\"]", m.group(1)))


def supports_thinking(template_source: str | None) -> bool:
    """Whether a template knows about thinking at all (`enable_thinking` or `<think>`)."""
    return bool(template_source) and ("enable_thinking" in template_source or THINK_OPEN in template_source)


def template_kwargs(template_source: str | None, *, think: bool | None = None, effort: str | None = None,
                    preserve: bool | None = None) -> dict:
    """Template variables for the requested reasoning mode; {} means "the model's default".

    `think=False` or effort `off` turns thinking off; an effort the template cannot express is an error
    naming the levels it can.
    """
    src = template_source or ""
    effort = normalize_effort(effort)
    if think is False:
        effort = "off"
    kwargs: dict = {}
    if effort is None and think is None and preserve is None:
        return kwargs
    if not supports_thinking(src):
        return kwargs  # a model without thinking: nothing to switch
    if effort == "off":
        kwargs["enable_thinking"] = False
    elif effort is not None or think:
        kwargs["enable_thinking"] = True
    if effort not in (None, "off"):
        accepted = accepted_efforts(src)
        if accepted:
            name = next((n for n in _TEMPLATE_NAMES[effort] if n in accepted), None)
            if name is None:
                raise NinferError(f"this model's template does not offer reasoning effort {effort}",
                                  "use one of: off, " + ", ".join(accepted))
            kwargs["reasoning_effort"] = name
    if preserve is not None and "preserve_thinking" in src:
        kwargs["preserve_thinking"] = bool(preserve)
    return kwargs


def starts_in_thinking(prompt: str) -> bool:
    """Whether the generation prompt leaves a `<think>` block open (the model's first words are reasoning)."""
    last_turn = prompt[prompt.rfind("<|im_start|>"):] if "<|im_start|>" in prompt else prompt[-200:]
    return last_turn.rfind(THINK_OPEN) > last_turn.rfind(THINK_CLOSE)


class ReasoningSplitter:
    """Streams text into (reasoning, content) deltas, cutting at `</think>`.

    A tag split across two deltas is held back until it is complete. When the prompt did not open a
    think block, a `<think>` at the very start of the output opens one.
    """

    def __init__(self, starts_in_thinking: bool = False):
        self.thinking = starts_in_thinking
        self._may_open = not starts_in_thinking
        self._hold = ""
        self._trim_reasoning = True  # newlines right after <think> are template layout, not reasoning
        self._trim_content = False  # likewise the blank line after </think>
        self._newlines = ""
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str) -> tuple[str, str]:
        """New (reasoning, content) text after `text` arrives."""
        buf = self._hold + text
        self._hold = ""
        r_out, c_out = "", ""
        while buf:
            if self._may_open:
                stripped = buf.lstrip()
                if not stripped or THINK_OPEN.startswith(stripped):
                    self._hold = buf
                    break
                self._may_open = False
                if stripped.startswith(THINK_OPEN):
                    self.thinking = True
                    buf = stripped[len(THINK_OPEN):]
                    continue
            if not self.thinking:
                if self._trim_content:
                    buf = buf.lstrip("\n")
                    self._trim_content = not buf
                c_out += buf
                break
            idx = buf.find(THINK_CLOSE)
            keep = 0 if idx >= 0 else partial_suffix(buf, THINK_CLOSE)
            piece = buf[:idx] if idx >= 0 else buf[:len(buf) - keep]
            if self._trim_reasoning:
                piece = piece.lstrip("\n")
                self._trim_reasoning = not piece
            # Newlines just before </think> are layout too: withhold trailing ones until more text comes.
            piece = self._newlines + piece
            body = piece.rstrip("\n")
            self._newlines = piece[len(body):]
            r_out += body
            if idx < 0:
                self._hold = buf[len(buf) - keep:]
                break
            self.thinking, self._trim_content, self._newlines = False, True, ""
            buf = buf[idx + len(THINK_CLOSE):]
        self.reasoning += r_out
        self.content += c_out
        return r_out, c_out

    def flush(self) -> tuple[str, str]:
        """Whatever is held back, as reasoning when inside a think block, else content."""
        hold, self._hold = self._hold, ""
        if self.thinking:
            hold, self._newlines = self._newlines + hold, ""
            self.reasoning += hold
            return hold, ""
        self.content += hold
        return "", hold


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkingBudget:
    """Counts reasoning tokens; `exceeded` once `limit` of them were generated inside the think block."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.used = 0

    def count(self, in_thinking: bool) -> bool:
        """Count one generated token; True when the budget is now spent and the block must be closed."""
        if self.limit is None or not in_thinking:
            return False
        self.used += 1
        return self.used >= self.limit
