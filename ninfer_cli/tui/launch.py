"""From `ninfer chat`'s flags to the running app (and `--list`).

A model name is checked before the screen opens (a typo is a one-line error); pulling a missing
default model and loading happen inside the app, which opens at once and shows their progress.
"""
from __future__ import annotations

from ninfer_cli.tui.conversations import ConversationStore, print_list
from ninfer_cli.tui.session import ChatSettings, normalize_effort

LATEST = ("last", "latest")


def list_conversations(as_json: bool = False) -> None:
    """`ninfer chat --list`."""
    print_list(ConversationStore(), as_json=as_json)


def settings_from_flags(base: dict | None, *, system: str | None = None, effort: str | None = None,
                        thinking_budget: int | None = None, sampling: dict | None = None) -> ChatSettings:
    """A resumed conversation's settings with the flags given now on top."""
    settings = ChatSettings.from_dict(base or {})
    if system is not None:
        settings.system = system
    if effort is not None:
        settings.effort = normalize_effort(effort)
    if thinking_budget is not None:
        settings.thinking_budget = thinking_budget
    for key, value in (sampling or {}).items():
        if value is not None and hasattr(settings, key):
            setattr(settings, key, value)
    return settings


def run_chat_tui(model: str | None = None, *, system: str | None = None, effort: str | None = None,
                 thinking_budget: int | None = None, sampling: dict | None = None, ctx: int | None = None,
                 device: str = "auto", resume: str | None = None, think: bool | None = None,
                 **launch) -> None:
    """Open the chat app; `resume` is a conversation id (or prefix), or `last`. `think` and `launch`
    (preserve_thinking, profile, kv, vram_limit) go to the engine session."""
    from ninfer_cli.default_model import NAME as DEFAULT_NAME
    from ninfer_cli.default_model import needs_pull
    from ninfer_cli.model_session import resolve_model
    from ninfer_cli.tui.app import ChatApp
    from ninfer_cli.tui.engine_session import EngineSession
    from ninfer_cli.tui.typeahead import pending_input

    store = ConversationStore()
    conversation = None
    if resume is not None:
        conversation = store.load(None if resume.lower() in LATEST else resume)
    ref = model or (conversation.model if conversation is not None and conversation.model else None)

    def open_model(ref: str | None) -> EngineSession:
        # A missing default model is pulled inside the app; any other name is checked before it opens.
        path, name = (None, DEFAULT_NAME) if needs_pull(ref) else resolve_model(ref)
        return EngineSession(path, name, device=device, ctx=ctx, think=think, **launch)

    session = open_model(ref)
    settings = settings_from_flags(conversation.settings if conversation else None, system=system,
                                   effort=getattr(effort, "value", effort), thinking_budget=thinking_budget,
                                   sampling=sampling)
    asked = think is not None or effort is not None or thinking_budget is not None
    app = ChatApp(session, settings=settings, store=store, conversation=conversation, open_model=open_model,
                  asked_reasoning=asked, typed=pending_input())
    app.run()
    if app.conversation.messages:
        print(f"conversation saved: ninfer chat --resume {app.conversation.id}")
