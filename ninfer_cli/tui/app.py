"""`ninfer chat`'s Textual app: a chat log, an input box, a status bar and a footer of keys.

The model runs in thread workers (`_load`, `_generate`) that only fill a `TurnBuffer` and post
messages; every widget is touched from the main thread, in the message handlers below. One lock
keeps the model to one turn at a time, so a new turn waits for a stopped one to let go.

The app opens before the model is ready (on a first run the default model is pulled inside it, its
progress shown in the chat) and takes input from its first frame: what is sent before the model can
answer, or while it answers, waits in a queue and goes out in order.
"""
from __future__ import annotations

import gc
import os
import threading
import time
import traceback
from typing import Iterable

from textual import events, on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer

from ninfer_cli.model_session import NO_THINKING
from ninfer_cli.tui import slash
from ninfer_cli.tui.actions import SlashHandler
from ninfer_cli.tui.conversations import Conversation, ConversationStore
from ninfer_cli.tui.messages import (
    Arrived, LoadProgress, ModelFailed, ModelLoaded, TurnBuffer, TurnDone, TurnFailed, TurnStats, error_text,
)
from ninfer_cli.tui.session import EFFORTS, ChatSession, ChatSettings
from ninfer_cli.tui.typeahead import split_typed
from ninfer_cli.tui.widgets import (
    AssistantMessage, LoadPhases, NoteMessage, PromptInput, QueuedLine, SlashHints, StatusBar, UserMessage,
)

RATE_REFRESH_S = 0.2  # live tok/s redraws 5 times a second (the issue asks for at least 4)
PROGRESS_S = 0.1  # load progress messages at most 10 a second


def freeze_heap() -> None:
    """Move what is alive now out of the cyclic GC's reach. Full collections over Textual's and
    the engine's long-lived objects took 60-240 ms each while streaming, stalling key presses."""
    gc.collect()
    gc.freeze()


class ChatApp(App):
    """The chat TUI over any `ChatSession` (the engine, or a fake in tests)."""

    CSS_PATH = "app.tcss"
    TITLE = "ninfer chat"
    BINDINGS = [
        Binding("escape", "stop", "stop", priority=True),
        # ollama and llama-cli users stop an answer with Ctrl+C; when idle it stays the input's copy.
        Binding("ctrl+c", "interrupt", show=False, priority=True),
        Binding("ctrl+t", "cycle_effort", "think", priority=True),
        Binding("ctrl+y", "copy", "copy", priority=True),
        Binding("ctrl+q", "quit", "quit", priority=True),
    ]

    def __init__(self, session: ChatSession, *, settings: ChatSettings | None = None,
                 store: ConversationStore | None = None, conversation: Conversation | None = None,
                 autosave: bool = True, typed: str = "", open_model=None, asked_reasoning: bool = False) -> None:
        """`typed`: what was typed at the terminal before the app started (sent when the model is ready);
        `open_model(ref)`: a new ChatSession for `/model` (None: one model only); `asked_reasoning`:
        reasoning flags were given (a model without thinking then says once that they do nothing)."""
        super().__init__()
        self.session = session
        self.open_model = open_model
        self.asked_reasoning = asked_reasoning
        self.queued: list[str] = []
        self._typed = typed
        self._input_ready = False
        self._early_keys: list[events.Key] = []
        self._phases: LoadPhases | None = None
        self._progress_at = (None, 0.0)  # (label, time) of the last progress message (load worker only)
        self.store = store if store is not None else ConversationStore()
        self.autosave = autosave
        self.conversation = conversation or Conversation(model=session.info.name)
        if settings is None:
            settings = ChatSettings.from_dict(self.conversation.settings)
        self.settings = settings
        self.loaded = False
        self.load_error: str | None = None
        self.last_stats: TurnStats | None = None
        self.context_used = 0
        self.buffer: TurnBuffer | None = None
        self.cancel: threading.Event | None = None
        self.stop_latency: float | None = None  # Esc to the answer closed on screen
        self.engine_stop_latency: float | None = None  # Esc to the worker's last record
        self._stopped: dict[int, tuple[dict, AssistantMessage, float]] = {}
        self._turn = 0
        self._current: AssistantMessage | None = None
        self._engine_lock = threading.Lock()
        self._load_failed: str | None = None  # written by the load worker, read by turn workers
        self._slash = SlashHandler(self)

    # ---------------------------------------------------------------- layout

    def compose(self) -> ComposeResult:
        yield VerticalScroll(id="chat")
        yield SlashHints(id="hints")
        yield QueuedLine(id="queued")
        yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        self.status = self.query_one(StatusBar)
        self.query_one("#hints").display = False
        self.query_one(QueuedLine).display = False
        self.chat.anchor()
        self.status.show_model(self.session.info, "[dim]loading…[/dim]")
        self.status.show_effort(self.settings.effort, self.session.info.thinking)
        self.status.show_spec(self.settings.spec)
        self.status.show_context(0, self.session.info.context_max)
        self.status.show_rate(None)
        self.refresh_memory()
        self.set_interval(RATE_REFRESH_S, self.refresh_rate)
        self.set_interval(1.0, self.refresh_memory)
        await self.show_conversation()
        prompt = self.query_one(PromptInput)
        prompt.sent = [m["content"] for m in self.conversation.messages if m["role"] == "user"]
        prompt.focus()
        lines, rest = split_typed(self._typed)
        if rest:
            prompt.load_text(rest)
            prompt.move_cursor(prompt.document.end)
        self._input_ready = True
        for key in self._early_keys:  # pressed before the input box existed
            self.post_message(events.Key(key.key, key.character))
        self._early_keys.clear()
        for line in lines:
            await self.send(line)
        freeze_heap()
        self._load()

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not self._input_ready:
            self._early_keys.append(event)
            return
        await super().on_event(event)

    @property
    def chat(self) -> VerticalScroll:
        return self.query_one("#chat", VerticalScroll)

    @property
    def generating(self) -> bool:
        return self.buffer is not None

    async def show_conversation(self) -> None:
        """Render the whole conversation (after resume, /load, /clear)."""
        await self.chat.remove_children()
        widgets = []
        for m in self.conversation.messages:
            if m["role"] == "user":
                widgets.append(UserMessage(m["content"], classes="user"))
            elif m["role"] == "assistant":
                stats = TurnStats(**m["stats"]) if m.get("stats") else None
                widgets.append(AssistantMessage(m["content"], m.get("reasoning", ""), stats))
        if widgets:
            await self.chat.mount_all(widgets)
        last = next((m for m in reversed(self.conversation.messages) if m.get("stats")), None)
        self.last_stats = TurnStats(**last["stats"]) if last else None
        self.context_used = self.last_stats.prompt_tokens + self.last_stats.generation_tokens if last else 0
        self.status.show_context(self.context_used, self.session.info.context_max)
        self.status.show_last(self.last_stats)
        self.status.show_spec(self.settings.spec, self.last_stats.spec if self.last_stats else None)

    async def note(self, text: str, *, error: bool = False) -> None:
        """Show app text (help, stats, errors) in the chat log."""
        await self.chat.mount(NoteMessage(text, classes="note error" if error else "note"))

    def refresh_rate(self) -> None:
        buf = self.buffer
        if buf is None:
            self.status.show_rate(None)
        else:
            self.status.show_rate(buf.live_rate())
            if buf.prompt_tokens:  # the context fills as the answer streams
                self.status.show_context(buf.prompt_tokens + buf.tokens, self.session.info.context_max)

    def refresh_memory(self) -> None:
        try:
            self.status.show_memory(self.session.memory())
        except Exception:  # a gauge must never take the app down
            pass

    # ---------------------------------------------------------------- model loading

    @work(thread=True, group="load")
    def _load(self) -> None:
        with self._engine_lock:
            try:
                self.session.load(progress=self._report_progress)
            except BaseException as exc:  # shown in the app, never as a traceback
                self._debug_log(exc)
                self._load_failed = error_text(exc)
                self.post_message(ModelFailed(self._load_failed))
                return
        self.post_message(ModelLoaded())

    def _report_progress(self, label: str, done: int, total: int | None) -> None:
        """The session's progress callback (load worker thread): throttled into LoadProgress messages."""
        now = time.perf_counter()
        last_label, last_at = self._progress_at
        if label == last_label and now - last_at < PROGRESS_S and done != total:
            return
        self._progress_at = (label, now)
        self.post_message(LoadProgress(label, done, total))

    async def on_load_progress(self, message: LoadProgress) -> None:
        if self._phases is None:
            name = self.session.info.name.removesuffix(":latest")
            self._phases = LoadPhases(f"[b]First run:[/b] getting {_markup_safe(name)} ready. Type your question "
                                      "now: it is sent when the model is ready.", classes="note")
            await self.chat.mount(self._phases)
            self.status.show_model(self.session.info, "[dim]pulling…[/dim]")
        self._phases.report(message.label, message.done, message.total)

    async def on_model_loaded(self, _: ModelLoaded) -> None:
        self.loaded = True
        freeze_heap()
        if self._phases is not None:
            self._phases.finish()
        info = self.session.info
        self.status.show_model(info)
        self.status.show_effort(self.settings.effort, info.thinking)
        self.status.show_context(self.context_used, info.context_max)
        if not self.conversation.model:
            self.conversation.model = info.name
        if not info.thinking and (self.asked_reasoning or self.settings.effort is not None
                                  or self.settings.thinking_budget is not None):
            await self.note(f"Note: {NO_THINKING}.")
        await self._slash.check_spec()
        await self._send_queued()

    async def on_model_failed(self, message: ModelFailed) -> None:
        self.load_error = message.text
        self.status.show_model(self.session.info, "[red]failed[/red]")
        await self.note(f"**Model failed to load:** {message.text}", error=True)
        if self.queued:  # nothing typed is lost: back into the input box, unsent
            box = self.query_one(PromptInput)
            box.load_text("\n".join([*self.queued, box.text]).strip("\n"))
            self.queued.clear()
            self._show_queue()

    # ---------------------------------------------------------------- input

    @on(PromptInput.Changed)
    def _typing(self, event: PromptInput.Changed) -> None:
        self.query_one(SlashHints).show_for(event.text_area.text)

    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        self.query_one(SlashHints).display = False
        text = event.text.strip()
        parsed = slash.parse(text)
        if parsed is not None:
            await self._slash.run(*parsed)
            return
        if text.startswith("//"):
            text = text[1:]
        await self.send(text)

    async def send(self, text: str) -> None:
        """Add a user message and answer it; until the model is ready, or while it answers, queue it."""
        if self.load_error is None and (not self.loaded or self.generating or self.queued):
            self.queued.append(text)
            self._show_queue()
            await self._send_queued()
            return
        self.conversation.messages.append({"role": "user", "content": text})
        await self.chat.mount(UserMessage(text, classes="user"))
        await self.start_turn()

    def _show_queue(self) -> None:
        why = "sent when the model is ready" if not self.loaded else "sent when this answer ends"
        self.query_one(QueuedLine).show(self.queued, why)

    async def _send_queued(self) -> None:
        """Send the next queued message, if the model is free for it."""
        if self.queued and self.loaded and not self.generating and self.load_error is None:
            text = self.queued.pop(0)
            self._show_queue()
            self.conversation.messages.append({"role": "user", "content": text})
            await self.chat.mount(UserMessage(text, classes="user"))
            await self.start_turn()

    def prompt_messages(self) -> list[dict]:
        """What the model sees: the system prompt, then user/assistant turns (reasoning kept aside)."""
        out = [{"role": "system", "content": self.settings.system}] if self.settings.system else []
        for m in self.conversation.messages:
            item = {"role": m["role"], "content": m["content"]}
            if m.get("reasoning"):
                item["reasoning_content"] = m["reasoning"]
            out.append(item)
        return out

    async def start_turn(self) -> None:
        """Stream an answer to the conversation as it stands (its last message is the user's)."""
        if self.load_error is not None:
            await self.note(f"No model to answer with: {self.load_error}", error=True)
            return
        self._turn += 1
        self._current = AssistantMessage()
        await self.chat.mount(self._current)
        self.buffer = TurnBuffer(self._turn)
        self.cancel = threading.Event()
        self.status.show_rate(0.0)
        settings = ChatSettings.from_dict(self.settings.to_dict())
        self._generate(self.buffer, self.prompt_messages(), settings, self.cancel)

    @work(thread=True, group="generate")
    def _generate(self, buf: TurnBuffer, messages: list[dict], settings: ChatSettings,
                  cancel: threading.Event) -> None:
        final = None
        with self._engine_lock:
            if self._load_failed is not None:  # the turn was queued while the model was loading
                self.post_message(TurnFailed(buf.turn, f"no model to answer with: {self._load_failed}"))
                return
            buf.started = time.perf_counter()  # TTFT from when the model is ours, not from the key press
            try:
                for r in self.session.send(messages, settings, cancel):
                    if getattr(r, "prompt_tokens", 0):
                        buf.prompt_tokens = r.prompt_tokens
                    reasoning, text = getattr(r, "reasoning", "") or "", r.text or ""
                    tokens = r.generation_tokens or (buf.tokens + 1 if (reasoning or text) else buf.tokens)
                    if buf.push(reasoning, text, tokens):
                        self.post_message(Arrived(buf.turn))
                    if r.finish_reason is not None:
                        final = r
            except BaseException as exc:
                self._debug_log(exc)
                self.post_message(TurnFailed(buf.turn, error_text(exc)))
                return
        self.post_message(TurnDone(buf.turn, buf.stats(final, cancel.is_set())))

    async def on_arrived(self, message: Arrived) -> None:
        buf = self.buffer
        if buf is None or message.turn != buf.turn:
            return
        await self._show_pending(buf)

    async def _show_pending(self, buf: TurnBuffer) -> None:
        reasoning, text = buf.drain()
        if reasoning:
            await self._current.add_reasoning(reasoning)
        if text:
            await self._current.add_text(text)

    async def on_turn_done(self, message: TurnDone) -> None:
        stopped = self._stopped.pop(message.turn, None)
        if stopped is not None:  # Esc already closed the turn on screen; now the engine has let go
            entry, msg, requested = stopped
            self.engine_stop_latency = time.perf_counter() - requested
            stats = message.stats
            stats.finish_reason = "cancelled"
            entry["stats"] = stats.to_dict()
            if msg.is_attached:  # /regen or /clear may have removed it meanwhile
                await msg.finish(stats)
            if not self.generating:
                self._show_turn_figures(stats)
            self.save()
            return
        buf = self.buffer
        if buf is None or message.turn != buf.turn:
            return
        await self._show_pending(buf)
        await self._close_turn(message.stats)

    async def _close_turn(self, stats: TurnStats) -> dict:
        """Finish the current answer on screen and in the conversation; returns its entry."""
        msg = self._current
        await msg.finish(stats)
        self.buffer, self.cancel = None, None
        entry = {"role": "assistant", "content": msg.content, "stats": stats.to_dict()}
        if msg.reasoning:
            entry["reasoning"] = msg.reasoning
        self.conversation.messages.append(entry)
        self._show_turn_figures(stats)
        self.save()
        self.call_later(self._send_queued)
        return entry

    def _show_turn_figures(self, stats: TurnStats) -> None:
        self.last_stats = stats
        self.context_used = stats.prompt_tokens + stats.generation_tokens
        self.status.show_last(stats)
        self.status.show_spec(self.settings.spec, stats.spec)
        self.status.show_rate(None)
        self.status.show_context(self.context_used, self.session.info.context_max)

    async def on_turn_failed(self, message: TurnFailed) -> None:
        buf = self.buffer
        if buf is None or message.turn != buf.turn:
            return
        await self._current.finish(None, note=f"[red]error:[/red] {message.text}")
        self.buffer, self.cancel = None, None
        self.status.show_rate(None)
        await self.note(f"**Error:** {message.text} (/regen tries again)", error=True)
        self.save()
        await self._send_queued()

    def save(self) -> None:
        """Autosave the conversation (errors become a notification, never a crash)."""
        if not self.autosave or not self.conversation.messages:
            return
        self.conversation.settings = self.settings.to_dict()
        try:
            self.store.save(self.conversation)
        except OSError as exc:
            self.notify(f"could not save the conversation: {exc}", severity="error")

    # ---------------------------------------------------------------- actions

    async def action_stop(self) -> None:
        """Esc: closes what is open (the keys panel, the command hints), else stops the answer. The answer
        ends on screen at once (kept as shown, marked stopped); the worker lets go of the model at its
        next token, and its final figures then replace the provisional ones."""
        if self.screen.query("HelpPanel"):
            self.action_hide_help_panel()
            return
        hints = self.query_one(SlashHints)
        if hints.display:
            hints.display = False
            return
        buf, cancel = self.buffer, self.cancel
        if buf is None or cancel is None:
            return
        requested = time.perf_counter()
        cancel.set()
        msg = self._current
        entry = await self._close_turn(buf.stats(None, cancel.is_set()))
        self._stopped[buf.turn] = (entry, msg, requested)
        self.stop_latency = time.perf_counter() - requested

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "interrupt":
            return self.generating
        if action == "stop" and len(self.screen_stack) > 1:
            return None  # a screen above the chat (the command palette) takes Esc itself
        return True

    async def action_interrupt(self) -> None:
        await self.action_stop()

    def action_cycle_effort(self) -> None:
        """Ctrl+T: (model default ->) off -> low -> medium -> high -> off."""
        if not self.session.info.thinking:
            self.notify(NO_THINKING, timeout=2)
            return
        current = self.settings.effort
        self.set_effort("off" if current is None else EFFORTS[(EFFORTS.index(current) + 1) % len(EFFORTS)])
        self.notify(f"reasoning effort: {self.settings.effort}", timeout=1.5)

    def set_effort(self, effort: str | None) -> None:
        self.settings.effort = effort
        self.status.show_effort(effort, self.session.info.thinking)

    async def action_copy(self) -> None:
        await self._slash.run("/copy", [])

    def get_system_commands(self, screen) -> "Iterable[SystemCommand]":
        """The command palette (Ctrl+P): our slash commands with their choices, the installed models,
        and the keys panel, instead of Textual's generic list."""
        for title, help_text, name, args in slash.palette_entries(self._installed_models()):
            yield SystemCommand(title, help_text, lambda n=name, a=args: self._slash.run(n, a))
        showing = bool(screen.query("HelpPanel"))
        yield SystemCommand("Keys", ("hide" if showing else "show") + " the keys of the focused widget (Esc closes)",
                            self.action_hide_help_panel if showing else self.action_show_help_panel)

    def _installed_models(self) -> list[str]:
        if self.open_model is None:
            return []
        try:
            from ninfer_cli.store import Store

            return Store().refs()
        except Exception:  # a broken store must not break the palette
            return []

    async def action_quit(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
        self.save()
        self.exit()

    def _debug_log(self, exc: BaseException) -> None:
        if os.environ.get("NINFER_DEBUG") == "1":
            self.log.error("".join(traceback.format_exception(exc)))


def _markup_safe(text: str) -> str:
    return text.replace("[", r"\[")
