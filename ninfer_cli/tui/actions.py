"""What each slash command does to the chat app (parsing and completion live in `slash.py`)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import NinferError
from ninfer_cli.model_session import NO_THINKING
from ninfer_cli.tui import slash
from ninfer_cli.tui.conversations import Conversation, to_markdown
from ninfer_cli.tui.messages import error_text
from ninfer_cli.tui.session import EFFORTS, SETTABLE, normalize_effort, set_param
from ninfer_cli.tui.widgets import AssistantMessage, human_tokens, stats_line

if TYPE_CHECKING:
    from ninfer_cli.tui.app import ChatApp

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[ \t]*$", re.S | re.M)


def last_code_block(markdown: str) -> str | None:
    """The body of the last fenced code block, or None."""
    blocks = _FENCE.findall(markdown)
    return blocks[-1][1] if blocks else None


class SlashHandler:
    """Runs `/name args` against a `ChatApp`; every outcome is shown as a note in the chat."""

    def __init__(self, app: "ChatApp") -> None:
        self.app = app

    async def run(self, name: str, args: list[str]) -> None:
        method = getattr(self, "do_" + name.lstrip("/"), None)
        if method is None or name not in slash.BY_NAME:
            await self.app.note(f"Unknown command `{name}`: /help lists them.", error=True)
            return
        try:
            await method(args)
        except (ValueError, NinferError) as exc:
            text = exc.message + (f" → {exc.next_action}" if exc.next_action else "") \
                if isinstance(exc, NinferError) else str(exc)
            await self.app.note(f"`{name}`: {text}", error=True)

    def _busy(self) -> bool:
        return self.app.generating

    async def do_help(self, args: list[str]) -> None:
        await self.app.note(slash.help_text())

    async def do_bye(self, args: list[str]) -> None:
        await self.app.action_quit()

    async def do_clear(self, args: list[str]) -> None:
        if self._busy():
            raise ValueError("still answering: press Esc first")
        app = self.app
        app.save()
        app.conversation = Conversation(model=app.session.info.name)
        await app.show_conversation()
        await app.note("New conversation.")

    async def do_regen(self, args: list[str]) -> None:
        app = self.app
        if self._busy():
            raise ValueError("still answering: press Esc first")
        msgs = app.conversation.messages
        if msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
            answers = app.chat.query(AssistantMessage)
            if answers:
                await answers.last().remove()
        if not msgs or msgs[-1]["role"] != "user":
            raise ValueError("nothing to answer yet")
        await app.start_turn()

    async def do_think(self, args: list[str]) -> None:
        app = self.app
        if app.loaded and not app.session.info.thinking:
            if args:
                normalize_effort(args[0])  # a misspelt level is still an error
            await app.note(f"Reasoning effort: **n/a**: {NO_THINKING}.")
            return
        if not args:
            await app.note(f"Reasoning effort is **{app.settings.effort or 'the model default'}** "
                           f"(one of {', '.join(EFFORTS)}, default; Ctrl+T cycles).")
            return
        app.set_effort(normalize_effort(args[0]))
        await app.note(f"Reasoning effort: **{app.settings.effort or 'model default'}**.")

    async def do_model(self, args: list[str]) -> None:
        app = self.app
        if args:
            await self.switch_model(args[0])
            return
        models = app._installed_models()
        current = app.session.info.name
        rows = "\n".join(f"- `{m}`" + (" (this one)" if m == current else "") for m in models)
        await app.note(f"Model: **{current}**.\n\n" + (f"Installed:\n{rows}\n\n`/model <name>` switches."
                                                          if rows else "`ninfer pull NAME` installs more."))

    async def do_system(self, args: list[str]) -> None:
        settings = self.app.settings
        if not args:
            current = settings.system or "(none)"
            await self.app.note(f"System prompt: {current}\n\n`/system <text>` sets it, `/system none` removes it.")
            return
        settings.system = None if args[0].lower() in ("none", "off", "clear") else args[0]
        await self.app.note("System prompt removed." if settings.system is None else "System prompt set.")

    async def do_set(self, args: list[str]) -> None:
        settings = self.app.settings
        if not args:
            rows = "\n".join(f"| {k} | {getattr(settings, k)!s} |" for k in SETTABLE)
            await self.app.note("| parameter | value |\n|---|---|\n" + rows +
                                "\n\n`None` means the model's preset for the reasoning mode.")
            return
        if len(args) != 2:
            raise ValueError("usage: /set <param> <value>")
        value = set_param(settings, args[0], args[1])
        await self.app.note(f"{args[0]} = {value}")

    async def do_format(self, args: list[str]) -> None:
        from ninfer_cli.options import parse_format

        settings = self.app.settings
        if args:
            constraint = parse_format(args[0])  # checked now, so a bad schema is reported here
            settings.format = args[0] if constraint is not None else None
        await self.app.note(f"Output format: **{settings.format or 'free text'}**.")

    async def do_spec(self, args: list[str]) -> None:
        from engine.speculative import parse_spec

        app = self.app
        if not args:
            await app.note(f"Speculative decoding: **{app.settings.spec or 'off'}** (`/spec mtp:K` drafts K = 1..5 "
                           "tokens a round with the model's MTP head and verifies them in one pass; `/spec off`).")
            return
        kind, k = parse_spec(args[0])
        spec = None if kind == "off" else f"{kind}:{k}"
        if spec is not None and app.loaded:
            check = getattr(app.session, "check_spec", None)
            if check is not None:
                check(spec)  # an engine or model that cannot run it is an error note now, not at the next answer
        app.settings.spec = spec
        app.status.show_spec(spec)
        await app.note(f"Speculative decoding: **{spec or 'off'}**" + (" from the next answer." if spec else "."))

    async def check_spec(self) -> None:
        """Once the model is loaded: speculation asked for (--spec, a resumed conversation's settings) that this
        engine or model cannot run is turned off, and a note says why."""
        app = self.app
        check = getattr(app.session, "check_spec", None)
        if app.settings.spec in (None, "off") or check is None:
            return
        try:
            check(app.settings.spec)
        except NinferError as exc:
            app.settings.spec = None
            app.status.show_spec(None)
            await app.note(f"Note: speculative decoding is off: {error_text(exc)}.")

    async def do_stats(self, args: list[str]) -> None:
        app = self.app
        info = app.session.info
        mem = app.session.memory()
        gib = 1 << 30
        lines = [f"- model: **{info.name}** on {info.device}",
                 f"- context: {human_tokens(app.context_used)} of {human_tokens(info.context_max)} tokens",
                 f"- {mem.label}: {mem.used / gib:.2f} of {mem.total / gib:.2f} GiB"]
        s = app.last_stats
        if s is not None:
            lines += [f"- last answer: {stats_line(s)}",
                      f"- prompt: {s.prompt_tokens} tokens" + (f" at {s.prompt_tps:.1f} tok/s" if s.prompt_tps else ""),
                      f"- wall time: {s.seconds:.2f} s"]
            if s.spec and s.spec.get("rounds"):
                per = ", ".join(f"{a / s.spec['rounds']:.0%}" for a in s.spec["accepted_per_position"])
                lines.append(f"- speculation: mtp:{s.spec['k']}, {s.spec['rounds']} rounds, acceptance "
                             f"{s.spec['acceptance']:.0%} (by draft position {per}), "
                             f"{s.spec['tokens_per_round']:.2f} tokens a round")
        turns = [m for m in app.conversation.messages if m.get("stats")]
        if turns:
            total = sum(m["stats"]["generation_tokens"] for m in turns)
            lines.append(f"- this conversation: {len(turns)} answers, {total} tokens generated")
        await app.note("\n".join(lines))

    async def do_save(self, args: list[str]) -> None:
        app = self.app
        if args:
            app.conversation.title = args[0]
        if not app.conversation.messages:
            raise ValueError("nothing to save yet")
        app.conversation.settings = app.settings.to_dict()
        path = app.store.save(app.conversation)
        await app.note(f"Saved as `{app.conversation.id}` ({path}).")

    async def do_load(self, args: list[str]) -> None:
        app = self.app
        if self._busy():
            raise ValueError("still answering: press Esc first")
        if not args:
            rows = app.store.rows()[:15]
            if not rows:
                await app.note("No saved conversations yet.")
                return
            table = "\n".join(f"| `{r[0]}` | {r[1]} | {r[3]} | {r[4]} |" for r in rows)
            await app.note("| id | updated | turns | title |\n|---|---|---|---|\n" + table +
                           "\n\n`/load <id>` opens one (a unique prefix is enough).")
            return
        conv = app.store.load(args[0])
        app.save()
        app.conversation = conv
        if conv.settings:
            from ninfer_cli.tui.session import ChatSettings

            app.settings = ChatSettings.from_dict(conv.settings)
            app.status.show_effort(app.settings.effort, app.session.info.thinking)
            app.status.show_spec(app.settings.spec)
        await app.show_conversation()
        await app.note(f"Loaded `{conv.id}`: {conv.title}")

    async def do_export(self, args: list[str]) -> None:
        app = self.app
        if not args or args[0] not in ("md", "json"):
            raise ValueError("usage: /export md|json [path]")
        conv = app.conversation
        conv.settings = app.settings.to_dict()
        path = Path(args[1]).expanduser() if len(args) > 1 else Path.cwd() / f"ninfer-chat-{conv.id}.{args[0]}"
        text = to_markdown(conv) if args[0] == "md" else conv.to_json()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        await app.note(f"Exported to `{path}`.")

    async def do_copy(self, args: list[str]) -> None:
        app = self.app
        answer = next((m["content"] for m in reversed(app.conversation.messages) if m["role"] == "assistant"), None)
        if answer is None:
            raise ValueError("no answer to copy yet")
        what = "answer"
        if args and args[0] == "code":
            answer = last_code_block(answer)
            what = "code block"
            if answer is None:
                raise ValueError("the last answer has no code block")
        app.copy_to_clipboard(answer)
        app.notify(f"copied the {what} ({len(answer)} characters)", timeout=2)

    async def switch_model(self, ref: str) -> None:
        """`/model REF`: load another model for the rest of the conversation."""
        app = self.app
        if app.open_model is None:
            raise ValueError("this chat runs one model; start `ninfer chat MODEL` for another")
        if app.generating:
            raise ValueError("still answering: press Esc first")
        if not app.loaded and app.load_error is None:
            raise ValueError("the model is still loading: switch once it is ready")
        session = app.open_model(ref)  # resolves now: an unknown name fails here, the old model stays
        app.session, app.loaded, app.load_error, app._load_failed = session, False, None, None
        app.conversation.model = session.info.name
        app.status.show_model(session.info, "[dim]loading…[/dim]")
        await app.note(f"Switching to **{session.info.name}**…")
        app._load()
