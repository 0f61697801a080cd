"""A conversation with a model: messages -> chat template -> token ids -> the engine's stream ->
reasoning/content deltas, thinking budget, tool calls. `ninfer run`, the REPL, the TUI and the server
all talk to a model through this, so they agree on prompts and on what counts as reasoning.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

from engine.text.chat_template import ChatTemplate, simple_prompt
from engine.text.reasoning import (
    THINK_CLOSE,
    THINKING_BUDGET_CLOSE,
    ReasoningSplitter,
    ThinkingBudget,
    starts_in_thinking,
    template_kwargs,
)
from engine.text.reasoning import partial_suffix
from engine.text.tools import OPEN as TOOL_OPEN
from engine.text.tools import parse_tool_calls


@dataclass
class Delta:
    """One piece of a streamed answer: `reasoning` and/or `content` text, then a final record with `done`."""

    reasoning: str = ""
    content: str = ""
    done: bool = False
    finish_reason: str | None = None
    stats: "TurnStats | None" = None
    tool_calls: list = field(default_factory=list)
    answer: str = ""  # final record only: the whole content (tool-call blocks removed)
    answer_reasoning: str = ""  # final record only: the whole reasoning


@dataclass
class TurnStats:
    """Figures of one answer (times in seconds, rates in tokens/s)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    reasoning_tokens: int = 0
    ttft_s: float = 0.0
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    total_s: float = 0.0
    finish_reason: str | None = None
    spec: dict | None = None  # engine.speculative.SpecStats.as_dict() of the turn's rounds, when it speculated

    def line(self) -> str:
        """The one-line summary printed after an answer."""
        think = f" ({self.reasoning_tokens} thinking)" if self.reasoning_tokens else ""
        spec = ""
        if self.spec and self.spec["rounds"]:
            spec = (f" · mtp:{self.spec['k']} acceptance {100 * self.spec['acceptance']:.0f}% "
                    f"{self.spec['tokens_per_round']:.2f} tok/round")
        elif self.spec and self.spec.get("plain"):
            spec = f" · mtp:{self.spec['k']} off: {self.spec['plain']}"
        return (f"{self.generation_tokens} tokens{think} · {self.generation_tps:.1f} tok/s{spec} · "
                f"prompt {self.prompt_tokens} tokens at {self.prompt_tps:.1f} tok/s · "
                f"first token {self.ttft_s:.2f} s · {self.finish_reason or 'stop'}")

    def to_dict(self) -> dict:
        """JSON form (`ninfer run --json`)."""
        return dict(self.__dict__)


class ChatSession:
    """Messages plus reasoning settings for one model; `send()` streams an answer and records it."""

    def __init__(self, engine, tokenizer=None, template: ChatTemplate | None = None, *, system: str | None = None,
                 think: bool | None = None, effort: str | None = None, preserve_thinking: bool | None = None,
                 thinking_budget: int | None = None, tools: list[dict] | None = None):
        self.engine = engine
        self.tokenizer = tokenizer or engine.tokenizer
        if template is None and getattr(self.tokenizer, "chat_template", None):
            template = ChatTemplate(self.tokenizer.chat_template, bos_token=self.tokenizer.bos_token,
                                    eos_token=self.tokenizer.eos_token)
        self.template = template
        self.system = system
        self.think, self.effort, self.preserve_thinking = think, effort, preserve_thinking
        self.thinking_budget = thinking_budget
        self.tools = tools
        self.messages: list[dict] = []
        template_kwargs(self._source(), think=think, effort=effort)  # fail early on an effort the model lacks

    def _source(self) -> str:
        return self.template.source if self.template else ""

    def clear(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.messages = []

    def set_reasoning(self, *, think: bool | None = None, effort: str | None = None) -> None:
        """Change thinking/effort for the next turns (checked against the template now)."""
        template_kwargs(self._source(), think=think, effort=effort)
        self.think, self.effort = think, effort

    def conversation(self, user_text: str | None = None) -> list[dict]:
        """System + history (+ the new user message)."""
        msgs = ([{"role": "system", "content": self.system}] if self.system else []) + list(self.messages)
        if user_text is not None:
            msgs.append({"role": "user", "content": user_text})
        return msgs

    def render(self, messages: list[dict]) -> str:
        """The prompt text for `messages` with the current reasoning settings and tools."""
        if self.template is None:
            return simple_prompt(messages)
        kwargs = template_kwargs(self._source(), think=self.think, effort=self.effort,
                                 preserve=self.preserve_thinking)
        return self.template.render(messages, tools=self.tools, add_generation_prompt=True, **kwargs)

    def send(self, user_text: str, config, cancel: threading.Event | None = None):
        """Stream the answer to `user_text` as `Delta`s; the exchange is added to the history at the end."""
        messages = self.conversation(user_text)
        answer = yield from self.complete(messages, config, cancel)
        if answer is not None:
            self.messages.append({"role": "user", "content": user_text})
            turn = {"role": "assistant", "content": answer.answer}
            if answer.answer_reasoning:
                turn["reasoning_content"] = answer.answer_reasoning
            if answer.tool_calls:
                turn["tool_calls"] = answer.tool_calls
            self.messages.append(turn)

    def complete(self, messages: list[dict], config, cancel: threading.Event | None = None):
        """Stream an answer to a full message list (no history kept); returns the final `Delta`."""
        prompt = self.render(messages)
        ids = self.tokenizer.encode(prompt, add_special=True)
        return (yield from self.stream_ids(ids, config, cancel, in_thinking=starts_in_thinking(prompt)))

    def stream_ids(self, ids: list[int], config, cancel: threading.Event | None = None, *, in_thinking=False):
        """Stream from prompt token ids; handles the thinking budget and tool-call parsing."""
        stops = tuple(dict.fromkeys((*config.stop_token_ids, *self.tokenizer.eos_token_ids)))
        config = replace(config, stop_token_ids=stops)
        constraint = getattr(config, "constraint", None)
        if constraint is not None:  # it binds the answer: the thinking before it stays free
            config = replace(config, constraint=constraint.starting_after(THINK_CLOSE if in_thinking else None))
        splitter = ReasoningSplitter(in_thinking)
        hold = _ToolCallHold() if self.tools else None
        budget = ThinkingBudget(self.thinking_budget)
        stats = TurnStats(prompt_tokens=len(ids))
        t0 = time.perf_counter()
        generated: list[int] = []
        finish = None
        spec = None  # the rounds of the streams before this one (a spent thinking budget starts another)
        while True:
            inner_cancel = threading.Event()
            last_spec = None
            forced = False
            watch = _Linked(cancel, inner_cancel)
            remaining = config.max_tokens - len(generated)
            for resp in self.engine.stream(ids + generated, replace(config, max_tokens=max(1, remaining)),
                                           cancel=watch):
                if not generated and not stats.ttft_s:
                    stats.ttft_s = time.perf_counter() - t0
                    stats.prompt_tps = resp.prompt_tps or stats.prompt_tps
                if resp.token is not None and resp.finish_reason in (None, "length"):
                    generated.append(int(resp.token))
                if splitter.thinking:
                    stats.reasoning_tokens += 1
                r, c = splitter.feed(resp.text or "")
                c = hold.feed(c) if hold else c
                if r or c:
                    yield Delta(reasoning=r, content=c)
                stats.generation_tps = resp.generation_tps or stats.generation_tps
                last_spec = getattr(resp, "spec", None) or last_spec
                finish = resp.finish_reason
                if finish is None and budget.count(splitter.thinking) and splitter.thinking:
                    inner_cancel.set()
                    forced = True
            if last_spec is not None:
                spec = last_spec if spec is None else spec + last_spec
            if not forced or (cancel is not None and cancel.is_set()):
                break
            # Budget spent: close the think block ourselves and let the model answer.
            r, c = splitter.feed(THINKING_BUDGET_CLOSE)
            c = hold.feed(c) if hold else c
            yield Delta(reasoning=r, content=c)
            generated += self.tokenizer.encode(THINKING_BUDGET_CLOSE)
            budget.limit = None
            if constraint is not None:
                config = replace(config, constraint=constraint.starting_after(None))
            if len(generated) >= config.max_tokens:
                finish = "length"
                break
        r, c = splitter.flush()
        c = hold.feed(c) if hold else c
        content, calls = parse_tool_calls(splitter.content) if "<tool_call>" in splitter.content else (
            splitter.content, [])
        if hold and not calls:
            c += hold.release()  # no well-formed call: what was held back is plain content after all
        if r or c:
            yield Delta(reasoning=r, content=c)
        stats.generation_tokens = len(generated)
        stats.spec = spec.as_dict() if spec is not None else None
        stats.total_s = time.perf_counter() - t0
        stats.finish_reason = finish or ("cancelled" if cancel is not None and cancel.is_set() else "stop")
        final = Delta(done=True, finish_reason=stats.finish_reason, stats=stats, tool_calls=calls, answer=content,
                      answer_reasoning=splitter.reasoning)
        yield final
        return final


class _ToolCallHold:
    """With tools offered, streamed content stops at `<tool_call>`: the call arrives parsed in the final
    record instead of as raw XML (and is released as text if it turns out malformed)."""

    def __init__(self):
        self.held = ""
        self.inside = False

    def feed(self, text: str) -> str:
        buf = self.held + text
        if self.inside:
            self.held = buf
            return ""
        at = buf.find(TOOL_OPEN)
        if at >= 0:
            self.inside, self.held = True, buf[at:]
            return buf[:at]
        keep = partial_suffix(buf, TOOL_OPEN)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def release(self) -> str:
        out, self.held = self.held, ""
        return out


class _Linked:
    """An Event-like view that is set when either the caller's or our own event is set."""

    def __init__(self, outer: threading.Event | None, inner: threading.Event):
        self.outer, self.inner = outer, inner

    def is_set(self) -> bool:
        return self.inner.is_set() or (self.outer is not None and self.outer.is_set())

    def set(self) -> None:
        self.inner.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.inner.wait(timeout) or self.is_set()
