"""The plain chat REPL (`ninfer chat --plain`, or when stdin/stdout is not a terminal).

prompt_toolkit gives history (saved across runs), multi-line input (Esc+Enter or Alt+Enter for a new line,
or a block between triple quotes) and Ctrl+C handling: while an answer streams, Ctrl+C stops it and keeps
the conversation; at the prompt it clears the line; Ctrl+D or /bye leaves. The model runs in a worker
thread so an interrupt never lands in the middle of a layer.
"""
from __future__ import annotations

import queue
import sys
import threading
from dataclasses import replace

HELP = """Commands:
  /bye, /exit           leave
  /clear                forget the conversation
  /think [on|off|low|medium|high]   thinking on/off or its effort (no argument: show)
  /nothink              thinking off
  /set PARAM VALUE      temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty,
                        seed, max_tokens, thinking_budget, show_thinking, preserve_thinking, stats (on/off)
  /system [TEXT]        set (or show) the system prompt; `/system -` removes it
  /format [KIND VALUE]  constrain answers: json, schema FILE|JSON, regex RE, grammar FILE,
                        choice a,b,c; `/format off` frees them (no argument: show)
  /help                 this text
Multi-line input: Esc+Enter (or Alt+Enter) for a new line, or wrap the text in \"\"\"."""

_FLOAT = {"temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"}
_INT = {"top_k", "seed", "max_tokens"}


class Repl:
    """Reads user turns, streams answers, runs slash commands."""

    def __init__(self, session, config, *, name: str = "", out=None, err=None, interactive: bool = True,
                 show_thinking: bool = True, show_stats: bool = True, pt_input=None, pt_output=None,
                 history_file=None):
        self.session = session
        self._pt_io = {k: v for k, v in (("input", pt_input), ("output", pt_output)) if v is not None}
        self._history_file = history_file
        self.config = config
        self.name = name
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.interactive = interactive
        self.show_thinking = show_thinking
        self.show_stats = show_stats
        self._prompt = None

    # ---- input ------------------------------------------------------------------------------------

    def _make_prompt(self):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        keys = KeyBindings()

        @keys.add("escape", "enter")
        def _newline(event):
            event.current_buffer.insert_text("\n")

        try:
            from pathlib import Path

            if self._history_file is None:
                import platformdirs

                self._history_file = Path(platformdirs.user_state_dir("ninfer")) / "chat_history"
            Path(self._history_file).parent.mkdir(parents=True, exist_ok=True)
            history = FileHistory(str(self._history_file))
        except OSError:
            history = InMemoryHistory()
        return PromptSession(history=history, key_bindings=keys, multiline=False, **self._pt_io)

    def _read_interactive(self) -> str | None:
        if self._prompt is None:
            self._prompt = self._make_prompt()
        while True:
            try:
                text = self._prompt.prompt(">>> ", prompt_continuation="... ")
            except KeyboardInterrupt:
                continue  # clear the line, like a shell
            except EOFError:
                return None
            if text.strip().startswith('"""'):
                return self._triple_quoted(text, lambda: self._prompt.prompt("... "))
            return text

    def _read_plain(self, lines) -> str | None:
        try:
            text = next(lines)
        except StopIteration:
            return None
        text = text.rstrip("\n")
        if text.strip().startswith('"""'):
            def more():
                try:
                    return next(lines).rstrip("\n")
                except StopIteration:
                    raise EOFError from None
            return self._triple_quoted(text, more)
        return text

    @staticmethod
    def _triple_quoted(first: str, read_more) -> str:
        body = first.strip()[3:]
        if body.endswith('"""'):
            return body[:-3]
        parts = [body] if body else []
        while True:
            try:
                line = read_more()
            except (EOFError, KeyboardInterrupt):
                break
            if line.rstrip().endswith('"""'):
                parts.append(line.rstrip()[:-3])
                break
            parts.append(line)
        return "\n".join(parts)

    # ---- loop -------------------------------------------------------------------------------------

    def run(self, stdin=None) -> None:
        """Loop until /bye or end of input."""
        lines = iter(stdin if stdin is not None else sys.stdin) if not self.interactive else None
        if self.interactive:
            self.err.write(f"{self.name} · /help for commands · Ctrl+D or /bye to leave\n")
        while True:
            text = self._read_interactive() if self.interactive else self._read_plain(lines)
            if text is None:
                break
            if not text.strip():
                continue
            if text.lstrip().startswith("/"):
                if self.command(text.strip()) is False:
                    break
                continue
            self.answer(text)

    def answer(self, text: str) -> None:
        """Stream one answer; Ctrl+C stops it (the partial answer is kept in the history)."""
        cancel = threading.Event()
        items: queue.Queue = queue.Queue()

        def work():
            try:
                for delta in self.session.send(text, self.config, cancel):
                    items.put(delta)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                items.put(exc)
            items.put(None)

        worker = threading.Thread(target=work, name="ninfer-generate", daemon=True)
        worker.start()
        from ninfer_cli.output import AnswerPrinter  # noqa: PLC0415

        printer = AnswerPrinter(self.out, self.err, self.show_thinking)
        final = None
        while True:
            try:
                item = items.get(timeout=0.2)
            except queue.Empty:
                continue
            except KeyboardInterrupt:
                cancel.set()
                continue
            if item is None:
                break
            if isinstance(item, BaseException):
                worker.join()
                from engine.errors import NinferError

                if not isinstance(item, NinferError):
                    raise item
                # e.g. a full context: say so and keep the REPL (/clear makes room)
                self.err.write(f"\nerror: {item.message}\n" + (f"-> {item.next_action}\n" if item.next_action else ""))
                self.err.flush()
                return
            if item.done:
                final = item
                continue
            printer.feed(item)
        worker.join()
        self.out.write("\n")
        self.out.flush()
        if final is not None and final.tool_calls:
            import json

            for call in final.tool_calls:
                self.err.write(f"tool call: {json.dumps(call['function'], ensure_ascii=False)}\n")
        if final is not None and self.show_stats:
            self.err.write(f"[{final.stats.line()}]\n\n")
            self.err.flush()

    # ---- slash commands ---------------------------------------------------------------------------

    def command(self, line: str):
        """Run one slash command; False means leave."""
        from engine.errors import NinferError

        name, _, arg = line[1:].partition(" ")
        name, arg = name.lower(), arg.strip()
        try:
            if name in ("bye", "exit", "quit"):
                return False
            if name == "clear":
                self.session.clear()
                self.err.write("conversation cleared\n")
            elif name == "help" or name == "?":
                self.err.write(HELP + "\n")
            elif name == "think":
                self._think(arg)
            elif name == "nothink":
                self._think("off")
            elif name == "system":
                self._system(arg)
            elif name == "set":
                self._set(arg)
            elif name == "format":
                self._format(arg)
            else:
                self.err.write(f"unknown command /{name}; /help lists them\n")
        except NinferError as exc:
            self.err.write(f"error: {exc.message}\n" + (f"-> {exc.next_action}\n" if exc.next_action else ""))
        self.err.flush()
        return True

    def _think(self, arg: str) -> None:
        from engine.text.reasoning import normalize_effort

        s = self.session
        if not arg:
            state = "off" if s.think is False else (s.effort or "model default")
            self.err.write(f"thinking: {state}\n")
            return
        from engine.text.reasoning import supports_thinking

        level = normalize_effort(arg)
        if not supports_thinking(s.template.source if s.template else ""):
            self.err.write("this model has no thinking mode; nothing changes\n")
            return
        if level == "off":
            s.set_reasoning(think=False, effort="off")
        elif arg.lower() in ("on", "true"):
            s.set_reasoning(think=True, effort=None)
        else:
            s.set_reasoning(think=True, effort=level)
        self.err.write(f"thinking: {level if arg.lower() not in ('on', 'true') else 'on'}\n")

    def _format(self, arg: str) -> None:
        from ninfer_cli.options import parse_format

        if not arg:
            current = getattr(self.config, "constraint", None)
            self.err.write(f"output format: {current.describe() if current else 'free text'}\n")
            return
        constraint = parse_format(arg)
        self.config = replace(self.config, constraint=constraint)
        self.err.write(f"output format: {constraint.describe() if constraint else 'free text'}\n")

    def _system(self, arg: str) -> None:
        if not arg:
            self.err.write(f"system: {self.session.system or '(none)'}\n")
            return
        self.session.system = None if arg == "-" else arg
        self.err.write("system prompt " + ("removed" if arg == "-" else "set") + "\n")

    def _set(self, arg: str) -> None:
        from engine.errors import NinferError

        key, _, value = arg.partition(" ")
        key, value = key.strip().lower().replace("-", "_"), value.strip()
        aliases = {"temp": "temperature", "num_predict": "max_tokens", "budget": "thinking_budget"}
        key = aliases.get(key, key)
        if not key or not value:
            raise NinferError("usage: /set PARAM VALUE", "/help lists the parameters")
        onoff = value.lower() in ("on", "true", "1", "yes")
        if key in _FLOAT or key in _INT:
            try:
                parsed = float(value) if key in _FLOAT else int(value)
            except ValueError:
                raise NinferError(f"{key} needs a number, got {value!r}") from None
            self.config = replace(self.config, **{key: parsed})
        elif key == "thinking_budget":
            self.session.thinking_budget = None if value.lower() in ("off", "none", "0") else int(value)
        elif key == "show_thinking":
            self.show_thinking = onoff
        elif key in ("preserve_thinking", "preserve"):
            self.session.preserve_thinking = onoff
        elif key in ("stats", "verbose"):
            self.show_stats = onoff
        elif key == "system":
            self.session.system = value
        elif key in ("think", "effort", "reasoning_effort"):
            self._think(value)
            return
        else:
            raise NinferError(f"unknown parameter {key!r}", "/help lists the parameters")
        self.err.write(f"set {key} = {value}\n")
