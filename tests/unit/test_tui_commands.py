"""Slash commands, completion, saved conversations and resume, in the app and as plain functions."""
from __future__ import annotations

import json

import pytest

from engine.errors import NinferError
from ninfer_cli.tui import slash
from ninfer_cli.tui.actions import last_code_block
from ninfer_cli.tui.conversations import Conversation, ConversationStore, to_markdown
from ninfer_cli.tui.session import ChatSettings, FakeSession, normalize_effort, set_param
from ninfer_cli.tui.widgets import AssistantMessage, NoteMessage, PromptInput, UserMessage, gauge, human_tokens

from tui_helpers import make_app, run, send, submit, type_text, wait_for


async def command(pilot, text: str) -> str:
    """Run a slash command; returns the newest note's markdown."""
    app = pilot.app
    n = len(app.query(NoteMessage))
    await submit(pilot, text)
    await pilot.pause()
    notes = app.query(NoteMessage)
    return notes.last().source if len(notes) > n else ""


def test_parse_and_complete():
    assert slash.parse("hello") is None
    assert slash.parse("//not a command") is None
    assert slash.parse("/set top_p 0.9") == ("/set", ["top_p", "0.9"])
    assert slash.parse("/system You are  terse.\nReally.") == ("/system", ["You are  terse.\nReally."])
    assert slash.parse("/exit") == ("/bye", [])
    assert slash.parse("/nothink") == ("/think", ["off"])
    assert slash.complete("/th") == ["/think"]
    assert slash.complete("/s") == ["/system", "/set", "/spec", "/stats", "/save"]
    assert slash.complete("/spec m") == [f"/spec mtp:{k}" for k in range(1, 6)]
    assert slash.complete("/think m") == ["/think medium"]
    assert slash.complete("/export ") == ["/export md", "/export json"]
    assert slash.complete("/set top") == ["/set top_p", "/set top_k"]
    assert slash.complete("plain") == [] and slash.complete("/regen now") == []
    assert {c.name for c in slash.COMMANDS} == {
        "/help", "/clear", "/regen", "/think", "/system", "/set", "/format", "/stats", "/save", "/load",
        "/model", "/export", "/copy", "/bye", "/spec"}


def test_settings_parsing():
    s = ChatSettings()
    assert set_param(s, "temperature", "0.2") == 0.2 and s.temperature == 0.2
    assert set_param(s, "top-k", "20") == 20 and s.top_k == 20
    assert set_param(s, "temperature", "none") is None and s.temperature is None
    with pytest.raises(ValueError, match="unknown parameter"):
        set_param(s, "warmth", "1")
    with pytest.raises(ValueError, match="needs a int"):
        set_param(s, "top_k", "x")
    assert normalize_effort("xhigh") == "high" and normalize_effort("None") == "off"
    assert normalize_effort("default") is None
    with pytest.raises(ValueError):
        normalize_effort("extreme")


def test_small_formatters():
    assert human_tokens(999) == "999" and human_tokens(32768) == "32k" and human_tokens(3100) == "3.1k"
    assert gauge(3, 8) == "▰▰▰▱▱▱▱▱" and gauge(5, 0) == "▱" * 8 and gauge(10, 8) == "▰" * 8
    assert last_code_block("a\n```py\nx = 1\n```\nb\n```\ny\n```\n") == "y\n"
    assert last_code_block("no code") is None


def test_tab_completes_a_command(tmp_path):
    async def body():
        app = make_app(tmp_path)
        async with app.run_test() as pilot:
            await type_text(pilot, "/reg")
            box = app.query_one(PromptInput)
            assert box.suggestion == "en"
            assert app.query_one("#hints").display
            await pilot.press("tab")
            assert box.text == "/regen"
            await type_text(pilot, " ")
            await pilot.press("escape")
            assert not app.query_one("#hints").display
    run(body())


def test_slash_commands_in_the_app(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    async def body():
        app = make_app(tmp_path)
        async with app.run_test(size=(100, 40)) as pilot:
            help_note = await command(pilot, "/help")
            assert "/regen" in help_note and "`/export md\\|json [path]`" in help_note
            assert "Unknown command" in await command(pilot, "/frobnicate")
            assert "nothing to answer" in await command(pilot, "/regen")
            assert "no answer to copy" in await command(pilot, "/copy")
            await command(pilot, "/set temperature 0.25")
            assert app.settings.temperature == 0.25
            assert "unknown parameter" in await command(pilot, "/set warmth 3")
            assert "usage" in await command(pilot, "/set temperature")
            assert "| temperature | 0.25 |" in await command(pilot, "/set")
            await command(pilot, "/think low")
            assert app.settings.effort == "low"
            assert "must be one of" in await command(pilot, "/think extreme")
            await command(pilot, "/system Answer in French.")
            assert app.settings.system == "Answer in French."
            await send(pilot, "code please")
            assert app.session.calls[-1][1].temperature == 0.25
            stats = await command(pilot, "/stats")
            assert "fake-model" in stats and "tok/s" in stats and "this conversation: 1 answers" in stats
            await command(pilot, "/copy")
            assert app.clipboard == app.conversation.messages[-1]["content"]
            await command(pilot, "/copy code")
            assert app.clipboard == "print('hello from ninfer')\n"
            note = await command(pilot, "/export md")
            md = (tmp_path / f"ninfer-chat-{app.conversation.id}.md").read_text()
            assert "Exported" in note and "## User\n\ncode please" in md and "Answer in French." in md
            await command(pilot, f"/export json {tmp_path / 'out' / 'c.json'}")
            data = json.loads((tmp_path / "out" / "c.json").read_text())
            assert data["messages"][0]["content"] == "code please"
            assert data["settings"]["effort"] == "low"
            assert "usage" in await command(pilot, "/export pdf")
            assert "Saved as" in await command(pilot, "/save My chat")
            first_id = app.conversation.id
            await command(pilot, "/clear")
            assert app.conversation.id != first_id and not app.conversation.messages
            assert not app.query(AssistantMessage)
            listing = await command(pilot, "/load")
            assert first_id in listing and "My chat" in listing
            await command(pilot, f"/load {first_id[:-1]}")
            assert app.conversation.id == first_id and app.conversation.title == "My chat"
            assert len(app.query(AssistantMessage)) == 1 and len(app.query(UserMessage)) == 1
            assert "no conversation" in await command(pilot, "/load zzz")
            await command(pilot, "/bye")
            await pilot.pause()
        assert not app.is_running
    run(body())


def test_resume_shows_history_and_continues(tmp_path):
    async def body():
        app = make_app(tmp_path)
        async with app.run_test() as pilot:
            await send(pilot, "first question")
            await command(pilot, "/think medium")
            await send(pilot, "second question")
            conv_id = app.conversation.id
        store = ConversationStore(tmp_path / "chats")
        conv = store.load()
        assert conv.id == conv_id and len(conv.messages) == 4
        resumed = make_app(tmp_path, conversation=conv)
        async with resumed.run_test() as pilot:
            await pilot.pause()
            assert len(resumed.query(AssistantMessage)) == 2
            assert resumed.settings.effort == "medium"
            assert resumed.context_used > 0
            assert resumed.query_one(PromptInput).sent == ["first question", "second question"]
            assert resumed.last_stats is not None and "tok/s" in str(resumed.query_one("#st-last").render())
            await send(pilot, "third")
            sent = resumed.session.calls[-1][0]
            assert [m["content"] for m in sent if m["role"] == "user"] == [
                "first question", "second question", "third"]
        assert len(store.load(conv_id).messages) == 6
    run(body())


def test_store_list_load_and_markdown(tmp_path):
    store = ConversationStore(tmp_path)
    with pytest.raises(NinferError, match="no saved conversations"):
        store.load()
    a = Conversation(id="20260101-0000-aaaa", model="m", messages=[{"role": "user", "content": "alpha " * 20}])
    b = Conversation(id="20260101-0000-aaab", model="m", messages=[
        {"role": "user", "content": "beta"},
        {"role": "assistant", "content": "B", "reasoning": "hmm\nok",
         "stats": {"generation_tokens": 3, "tokens_per_second": 2.0, "ttft": 0.5}}])
    store.save(a)
    store.save(b)
    (tmp_path / "broken.json").write_text("{")
    assert [c.id for c in store.list()] == [b.id, a.id]
    assert store.load().id == b.id
    with pytest.raises(NinferError, match="matches 2"):
        store.load("20260101-0000-aa")
    assert store.load("20260101-0000-aaaa").title.endswith("…")
    md = to_markdown(store.load(b.id))
    assert "> **Thinking**\n>\n> hmm\n> ok" in md and "*3 tokens, 2.0 tok/s, TTFT 0.50 s*" in md
    assert [r[3] for r in store.rows()] == ["1", "1"]
    assert not list(tmp_path.glob("*.tmp*"))


def test_cli_list_prints_saved_conversations(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ninfer_cli.main import app as cli

    monkeypatch.setenv("NINFER_CHATS", str(tmp_path))
    runner = CliRunner()
    empty = runner.invoke(cli, ["chat", "--list"])
    assert empty.exit_code == 0 and "no saved conversations" in empty.output
    ConversationStore(tmp_path).save(Conversation(id="20260102-0304-beef", model="smollm2-135m",
                                                  messages=[{"role": "user", "content": "hello there"}]))
    listed = runner.invoke(cli, ["chat", "--list"])
    assert listed.exit_code == 0
    assert "20260102-0304-beef" in listed.output and "hello there" in listed.output


SPEC = {"k": 3, "drafted": 30, "accepted": 19, "rounds": 10, "accepted_per_position": [8, 6, 5], "plain_steps": 0,
        "acceptance": 19 / 30, "tokens_per_round": 2.9}


def _status(app, name: str) -> str:
    item = app.query_one(f"#st-{name}")
    return str(item.render()) if item.display else ""


def test_spec_command_sets_the_mode_and_the_status_bar_shows_the_rounds(tmp_path):
    """/spec mtp:3 reaches the session's settings; after an answer the status bar shows its acceptance and
    tokens per round, /stats the per-position figures; /spec off hides them; a bad mode is an error note."""
    async def body():
        session = FakeSession(spec_stats=SPEC)
        app = make_app(tmp_path, session)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.loaded)
            assert _status(app, "spec") == ""
            assert "**off**" in await command(pilot, "/spec")
            assert "1..5" in await command(pilot, "/spec mtp:9")
            assert "use --spec off or --spec mtp:K" in await command(pilot, "/spec eagle")
            assert "**mtp:3** from the next answer" in await command(pilot, "/spec mtp:3")
            assert app.settings.spec == "mtp:3" and _status(app, "spec") == "mtp:3"
            await send(pilot, "hi")
            assert session.calls[-1][1].spec == "mtp:3"
            assert _status(app, "spec") == "mtp:3 acc 63% 2.9 tok/rnd"
            assert app.conversation.messages[-1]["stats"]["spec"] == SPEC
            stats = await command(pilot, "/stats")
            assert "speculation: mtp:3, 10 rounds, acceptance 63% (by draft position 80%, 60%, 50%)" in stats
            await command(pilot, "/spec mtp")  # mtp alone is mtp:3
            assert app.settings.spec == "mtp:3"
            await command(pilot, "/spec off")
            assert app.settings.spec is None and _status(app, "spec") == ""
            await send(pilot, "again")
            assert session.calls[-1][1].spec is None
            assert app.conversation.messages[-1]["stats"]["spec"] is None
    run(body())


class _NoMtpSession(FakeSession):
    def check_spec(self, spec):
        raise NinferError(f"--spec {spec} needs a model with an MTP head", "use --spec off")


def test_spec_the_model_cannot_run_is_turned_off_with_a_note(tmp_path):
    async def body():
        app = make_app(tmp_path, _NoMtpSession(), settings=ChatSettings(spec="mtp:2"))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.loaded and app.settings.spec is None)
            await pilot.pause()
            notes = [n.source for n in app.query(NoteMessage)]
            assert any("speculative decoding is off: --spec mtp:2 needs a model with an MTP head" in n for n in notes)
            assert _status(app, "spec") == ""
            assert "needs a model with an MTP head" in await command(pilot, "/spec mtp:3")
            assert app.settings.spec is None
    run(body())


def test_palette_and_help_list_spec():
    titles = [e[0] for e in slash.palette_entries()]
    assert "/spec" in titles and "/spec mtp:3" in titles and "/spec off" in titles
    assert "`/spec [off\\|mtp:K]`" in slash.help_text()
