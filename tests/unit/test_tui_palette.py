"""The chat app's own command palette, Esc closing any panel, one story for models without thinking,
and the context gauge filling while an answer streams."""
from __future__ import annotations

import re

from textual.command import CommandPalette

from ninfer_cli.model_session import NO_THINKING
from ninfer_cli.tui.session import FakeSession, ModelInfo
from ninfer_cli.tui.widgets import NoteMessage

from tui_helpers import make_app, run, send, start, submit, type_text, wait_for


def status_text(app, name: str) -> str:
    return str(app.query_one(f"#st-{name}").render())


def test_palette_lists_our_commands_and_runs_them(tmp_path):
    async def body():
        app = make_app(tmp_path, open_model=lambda ref: FakeSession(info=ModelInfo(ref, 4096, "cpu")))
        app._installed_models = lambda: ["qwen38-27b:latest", "smollm2-135m:latest"]
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.loaded)
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for wanted in ("/help", "/clear", "/regen", "/think off", "/think high", "/think default", "/export md",
                           "/export json", "/copy", "/copy code", "/load", "/stats", "/bye",
                           "/model qwen38-27b:latest", "/model smollm2-135m:latest", "Keys"):
                assert wanted in titles, wanted
            for generic in ("Theme", "Screenshot", "Maximize", "Quit"):
                assert generic not in titles
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
            await type_text(pilot, "/think high")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.settings.effort == "high")
            assert not isinstance(app.screen, CommandPalette)
            assert "think:high" in status_text(app, "effort")
            # /model from the palette loads another model for the rest of the conversation.
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
            await type_text(pilot, "model qwen38")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.session.info.name == "qwen38-27b:latest" and app.loaded)
            assert app.conversation.model == "qwen38-27b:latest"
            assert "qwen38-27b" in status_text(app, "model")
            await send(pilot, "hi")
            assert app.session.calls  # the new model answered
    run(body())


def test_escape_closes_the_palette_and_the_keys_panel(tmp_path):
    async def body():
        app = make_app(tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.loaded)
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette), timeout=2)
            keys = next(c for c in app.get_system_commands(app.screen) if c.title == "Keys")
            keys.callback()
            await pilot.pause()
            assert app.screen.query("HelpPanel")
            await pilot.press("escape")
            await pilot.pause()
            assert not app.screen.query("HelpPanel")
            # Esc still stops an answer once nothing else is open.
            app.session.tokens_per_second = 20
            await start(pilot, "long answer")
            await pilot.press("escape")
            assert not app.generating
    run(body())


def test_a_model_without_thinking_says_so_once_and_shows_n_a_everywhere(tmp_path):
    async def body():
        session = FakeSession(info=ModelInfo("plain-model", 4096, "cpu", thinking=False))
        app = make_app(tmp_path, session, asked_reasoning=True)
        toasts = []
        app.notify = lambda message, **kw: toasts.append(message)
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.loaded)
            await pilot.pause()
            notes = [n.source for n in app.query(NoteMessage)]
            assert sum(NO_THINKING in n for n in notes) == 1  # --thinking-budget / -r / --think given
            assert "think:n/a" in status_text(app, "effort")
            await pilot.press("ctrl+t")
            assert toasts == [NO_THINKING] and app.settings.effort is None
            assert "think:n/a" in status_text(app, "effort")
            await submit(pilot, "/think high")
            await pilot.pause()
            last = app.query(NoteMessage).last().source
            assert "n/a" in last and NO_THINKING in last and "high" not in last
            assert app.settings.effort is None and "think:n/a" in status_text(app, "effort")
            await submit(pilot, "/think")
            await pilot.pause()
            assert "n/a" in app.query(NoteMessage).last().source
    run(body())


def test_a_model_without_thinking_and_no_reasoning_flags_gets_no_note(tmp_path):
    async def body():
        app = make_app(tmp_path, FakeSession(info=ModelInfo("plain-model", 4096, "cpu", thinking=False)))
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.loaded)
            await pilot.pause()
            assert not [n for n in app.query(NoteMessage) if NO_THINKING in n.source]
    run(body())


def test_context_gauge_fills_while_the_answer_streams(tmp_path):
    async def body():
        app = make_app(tmp_path, FakeSession(tokens_per_second=40))
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.loaded)
            await start(pilot, "count for me")
            seen = set()
            while app.generating:
                found = re.search(r"(\d+)/4k", status_text(app, "ctx"))
                seen.add(int(found.group(1)))
                await pilot.pause(0.05)
            final = app.conversation.messages[-1]["stats"]
            end = final["prompt_tokens"] + final["generation_tokens"]
            during = sorted(n for n in seen if 0 < n < end)
            assert len(during) >= 3, seen  # it moved several times before the answer ended
            assert during[0] >= final["prompt_tokens"]  # it counts from the prompt's size
            assert f"{end}/4k" in status_text(app, "ctx")
    run(body())
