"""The chat screen's widgets, one concern each. All methods run on the app's main thread."""
from __future__ import annotations

import time

from textual import events
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Collapsible, Static, TextArea

from ninfer_cli.tui import slash
from ninfer_cli.tui.markdown_view import Block, MarkdownView, render
from ninfer_cli.tui.messages import TurnStats
from ninfer_cli.tui.session import Memory, ModelInfo


def human_tokens(n: int) -> str:
    """1234 -> '1.2k', 32768 -> '32k'."""
    if n < 1000:
        return str(n)
    if n % 1024 == 0:
        return f"{n // 1024}k"
    k = n / 1000
    return f"{k:.1f}k" if k < 10 else f"{k:.0f}k"


def gauge(used: float, total: float, width: int = 8) -> str:
    """A text gauge, e.g. '▰▰▰▱▱▱▱▱' for 3/8 full."""
    frac = 0.0 if total <= 0 else min(max(used / total, 0.0), 1.0)
    full = round(frac * width)
    return "▰" * full + "▱" * (width - full)


class PromptInput(TextArea):
    """The message box: Enter sends, Shift+Enter or Ctrl+J adds a line, Tab completes a command."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    # Shown in the footer; `_on_key` below handles these keys before TextArea's own handling.
    BINDINGS = [
        Binding("enter", "submit", "send"),
        Binding("ctrl+j", "newline", "new line", key_display="⇧⏎/^j"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False,
                         highlight_cursor_line=False, placeholder="Send a message (/help for commands)",
                         **kwargs)
        self.sent: list[str] = []
        self._recall: int | None = None  # index into history while walking it

    def action_submit(self) -> None:
        text = self.text
        if text.strip():
            self.sent.append(text)
            self._recall = None
            self.clear()
            self.post_message(self.Submitted(text))

    def recall(self, step: int) -> bool:
        """Up/Down on the first/last line walk through what was sent before; False if nothing to do."""
        if not self.sent:
            return False
        index = (len(self.sent) if self._recall is None else self._recall) + step
        if index < 0:
            return True
        if index >= len(self.sent):
            self._recall = None
            self.load_text("")
            return True
        self._recall = index
        self.load_text(self.sent[index])
        self.move_cursor(self.document.end)
        return True

    def action_newline(self) -> None:
        self.insert("\n")

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
            return
        if event.key in ("shift+enter", "ctrl+j", "alt+enter"):
            event.stop()
            event.prevent_default()
            self.action_newline()
            return
        row = self.cursor_location[0]
        if (event.key == "up" and row == 0 or event.key == "down" and row == self.document.line_count - 1) \
                and (self._recall is not None or not self.text) and self.recall(-1 if event.key == "up" else 1):
            event.stop()
            event.prevent_default()
            return
        if event.key == "tab" and self.suggestion:
            event.stop()
            event.prevent_default()
            self.insert(self.suggestion)
            return
        await super()._on_key(event)

    def update_suggestion(self) -> None:
        text = self.text
        at_end = self.cursor_location == self.document.end
        options = slash.complete(text) if at_end else []
        self.suggestion = options[0][len(text):] if options else ""


class SlashHints(Static):
    """The commands matching what is typed, shown above the input while typing a command."""

    def show_for(self, text: str) -> None:
        found = slash.hints(text)
        self.display = bool(found)
        if found:
            self.update("   ".join(f"[b]{c.name}[/b] [dim]{_esc(c.args)}  {c.help}[/dim]" for c in found[:6]))


def _esc(text: str) -> str:
    return text.replace("[", r"\[")


class QueuedLine(Static):
    """Messages typed before the model could take them, shown above the input until they are sent."""

    def show(self, queued: list[str], why: str) -> None:
        self.display = bool(queued)
        if queued:
            first = queued[0].splitlines()[0]
            more = f" [dim](+{len(queued) - 1} more)[/dim]" if len(queued) > 1 else ""
            self.update(f"[b]queued[/b] [dim]({why})[/dim] {_esc(first[:120])}{more}")


class LoadPhases(Static):
    """Getting the model ready (the first run's pull): one line a phase, with bytes and rate."""

    def __init__(self, title: str, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.title = title
        self.phases: list[list] = []  # [label, done, total, started, ended]

    def report(self, label: str, done: int, total: int | None) -> None:
        now = time.perf_counter()
        if not self.phases or self.phases[-1][0] != label:
            self._end(now)
            self.phases.append([label, done, total, now, None])
        else:
            self.phases[-1][1:3] = [done, total]
        self.update(self.text(now))

    def finish(self) -> None:
        now = time.perf_counter()
        self._end(now)
        self.update(self.text(now))

    def _end(self, now: float) -> None:
        if self.phases and self.phases[-1][4] is None:
            last = self.phases[-1]
            last[1], last[4] = last[2] or last[1], now

    def text(self, now: float) -> str:
        from ninfer_cli.output import human_bytes

        lines = [self.title]
        for label, done, total, started, ended in self.phases:
            secs = max((ended or now) - started, 1e-9)
            if ended is not None:
                lines.append(f"[green]✓[/green] {_esc(label)}  {human_bytes(done)} in {secs:.1f} s")
            else:
                of = f"{human_bytes(done)}/{human_bytes(total)}" if total else human_bytes(done)
                lines.append(f"[b]▸[/b] {_esc(label)}  {gauge(done, total or 0, 16)}  {of}  "
                             f"{human_bytes(done / secs)}/s")
        return "\n".join(lines)


class UserMessage(Block):
    """A message the user sent (its line breaks kept as typed)."""

    def __init__(self, text: str, **kwargs) -> None:
        super().__init__(render(text.replace("\n", "  \n")), **kwargs)
        self.message_text = text


class NoteMessage(Block):
    """Help, stats and notices from the app itself (class `error` for failures)."""

    def __init__(self, text: str, **kwargs) -> None:
        super().__init__(render(text), **kwargs)
        self.source = text


class AssistantMessage(Vertical):
    """One answer: thinking in a collapsible block, the answer as streamed markdown, a stats line."""

    def __init__(self, content: str = "", reasoning: str = "", stats: TurnStats | None = None) -> None:
        super().__init__()
        self.stats = stats
        self._thinking: Collapsible | None = None
        self._thinking_md: MarkdownView | None = None
        self._initial_reasoning = reasoning
        self._answer = MarkdownView(content, classes="answer")
        self._footer = Static("", classes="turn-stats")
        self._thinking_since: float | None = None  # set while thinking streams

    def compose(self):
        if self._initial_reasoning:
            yield self._make_thinking(self._initial_reasoning, collapsed=True, title="Thoughts")
        yield self._answer
        yield self._footer

    def on_mount(self) -> None:
        if self.stats is not None:
            self._footer.update(stats_line(self.stats))

    def _make_thinking(self, text: str, collapsed: bool, title: str) -> Collapsible:
        self._thinking_md = MarkdownView(text, classes="thinking-text")
        self._thinking = Collapsible(self._thinking_md, title=title, collapsed=collapsed, classes="thinking")
        return self._thinking

    @property
    def content(self) -> str:
        return self._answer.text

    @property
    def reasoning(self) -> str:
        return self._thinking_md.text if self._thinking_md is not None else ""

    @property
    def thinking(self) -> Collapsible | None:
        return self._thinking

    @property
    def answer(self) -> MarkdownView:
        return self._answer

    async def add_reasoning(self, text: str) -> None:
        if self._thinking is None:
            self._thinking_since = time.perf_counter()
            await self.mount(self._make_thinking("", collapsed=False, title="Thinking…"), before=self._answer)
        self._thinking_md.append(text)

    async def _close_thinking(self) -> None:
        if self._thinking_since is not None:
            await self._thinking_md.flush()
            self._thinking.title = f"Thought for {time.perf_counter() - self._thinking_since:.1f} s"
            self._thinking.collapsed = True
            self._thinking_since = None

    async def add_text(self, text: str) -> None:
        if not self._answer.text:
            await self._close_thinking()
        self._answer.append(text)

    async def finish(self, stats: TurnStats | None, note: str = "") -> None:
        """Show all text, collapse thinking, show the stats line."""
        await self._close_thinking()
        await self._answer.flush()
        self.stats = stats
        line = stats_line(stats) if stats else ""
        self._footer.update(" · ".join(p for p in (line, note) if p))


def stats_line(s: TurnStats) -> str:
    """'42 tokens · 31.5 tok/s · TTFT 0.21 s' (+ why it stopped when it did not finish)."""
    parts = [f"{s.generation_tokens} tokens", f"{s.tokens_per_second:.1f} tok/s", f"TTFT {s.ttft:.2f} s"]
    if s.finish_reason == "length":
        parts.append("cut at max tokens")
    elif s.finish_reason == "cancelled":
        parts.append("stopped")
    return " · ".join(parts)


class StatusBar(Horizontal):
    """Model · effort · speculation · context gauge · live tok/s · last TTFT and tok/s · memory gauge."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._items = {name: Static("", id=f"st-{name}", classes="status-item")
                       for name in ("model", "effort", "spec", "ctx", "rate", "last", "mem")}
        self._texts: dict[str, str] = {}

    def compose(self):
        yield from self._items.values()

    def _set(self, name: str, text: str) -> None:
        # Same length, same template: the width cannot change, so skip the screen-wide layout.
        same = len(text) == len(self._texts.get(name, ""))
        self._texts[name] = text
        item = self._items[name]
        if item.display != bool(text):
            item.display = bool(text)
        item.update(text, layout=not same)

    def show_model(self, info: ModelInfo, state: str = "") -> None:
        name = info.name.removesuffix(":latest")
        self._set("model", f"[b]{_esc(name)}[/b] [dim]{info.device}[/dim]" + (f" {state}" if state else ""))

    def show_effort(self, effort: str | None, supported: bool = True) -> None:
        self._set("effort", f"think:[b]{effort or 'auto'}[/b]" if supported else "[dim]think:n/a[/dim]")

    def show_spec(self, spec: str | None, stats: dict | None = None) -> None:
        """`mtp:3 acc 71% 2.9 tok/rnd` (the last answer's rounds) while speculation is on; nothing when off."""
        if spec in (None, "off"):
            self._set("spec", "")
            return
        text = f"[b]{_esc(spec)}[/b]"
        if stats and stats.get("rounds"):
            text += f" acc {100 * stats['acceptance']:.0f}% {stats['tokens_per_round']:.1f} tok/rnd"
        self._set("spec", text)

    def show_context(self, used: int, total: int) -> None:
        total_text = human_tokens(total) if total else "?"
        self._set("ctx", f"ctx {gauge(used, total, 5)} {human_tokens(used)}/{total_text}")

    def show_rate(self, rate: float | None) -> None:
        self._set("rate", "" if rate is None else f"[b]{rate:6.1f}[/b] tok/s")

    def show_last(self, stats: TurnStats | None) -> None:
        self._set("last", "" if stats is None else
                  f"[dim]last[/dim] {stats.tokens_per_second:.1f} tok/s TTFT {stats.ttft:.2f}s")

    def show_memory(self, mem: Memory) -> None:
        gib = 1 << 30
        self._set("mem", f"{mem.label} {gauge(mem.used, mem.total, 5)} {mem.used / gib:.1f}/{mem.total / gib:.1f}G")
