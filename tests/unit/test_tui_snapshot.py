"""The chat screen's layout: an SVG snapshot (pytest-textual-snapshot, when installed) and a structural
check of the exported screenshot that needs no plugin."""
from __future__ import annotations

import html
import re

import pytest

from ninfer_cli.tui.conversations import Conversation
from ninfer_cli.tui.session import ChatSettings, FakeSession, Memory, ModelInfo
from ninfer_cli.tui.widgets import PromptInput

from tui_helpers import make_app, run, wait_for

ANSWER = ("Paris is the capital of **France**.\n\n- population: about 2.1 million\n- river: Seine\n\n"
          "```python\nprint('bonjour')\n```")


def layout_app(tmp_path):
    conv = Conversation(id="20260101-0000-abcd", model="qwen38-27b", messages=[
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": ANSWER, "reasoning": "The user wants a capital city.",
         "stats": {"prompt_tokens": 2900, "generation_tokens": 42, "ttft": 0.21, "tokens_per_second": 41.2,
                   "prompt_tps": 900.0, "seconds": 1.2, "finish_reason": "stop"}}])
    session = FakeSession(info=ModelInfo("qwen38-27b", 32768, "gpu"),
                          memory_reading=Memory("VRAM", int(19.8 * (1 << 30)), 24 << 30))
    return make_app(tmp_path, session, conversation=conv, settings=ChatSettings(effort="high"), autosave=False)


async def _settle(pilot) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.loaded)
    app.query_one(PromptInput).cursor_blink = False
    await pilot.pause()


def _screen_text(svg: str) -> str:
    text = " ".join(html.unescape(t) for t in re.findall(r">([^<>]*)</text>", svg))
    return text.replace("\xa0", " ")


def test_layout_has_every_part(tmp_path):
    app = layout_app(tmp_path)

    async def body():
        async with app.run_test(size=(100, 32)) as pilot:
            await _settle(pilot)
            return app.export_screenshot()
    text = _screen_text(run(body()))
    squeezed = re.sub(r"\s+", "", text)  # the SVG splits text where the style changes
    for expected in ("What is the capital of France?", "Paris is the capital of France.", "Seine",
                     "print('bonjour')", "Thoughts", "42 tokens · 41.2 tok/s · TTFT 0.21 s",
                     "qwen38-27b", "think:high", "2.9k/32k", "last 41.2 tok/s TTFT 0.21s", "VRAM", "19.8/24.0G",
                     "Send a message", "send", "new line", "stop", "think", "quit"):
        assert re.sub(r"\s+", "", expected) in squeezed, expected
    assert "capitalcity" not in squeezed  # thinking starts collapsed


def test_layout_snapshot(tmp_path, request):
    pytest.importorskip("pytest_textual_snapshot")
    snap_compare = request.getfixturevalue("snap_compare")
    assert snap_compare(layout_app(tmp_path), terminal_size=(100, 32), run_before=_settle)
