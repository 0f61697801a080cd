"""Shared helpers for the TUI tests: a fresh app on a fake session and waiting on conditions."""
from __future__ import annotations

import asyncio
import time

from ninfer_cli.tui.app import ChatApp
from ninfer_cli.tui.conversations import ConversationStore
from ninfer_cli.tui.session import ChatSettings, FakeSession


def make_app(tmp_path, session=None, **kwargs) -> ChatApp:
    session = session or FakeSession()
    return ChatApp(session, store=ConversationStore(tmp_path / "chats"), **kwargs)


def run(coro):
    """Run an async test body (no pytest-asyncio configuration needed)."""
    return asyncio.run(coro)


async def wait_for(pilot, cond, timeout: float = 10.0, step: float = 0.01) -> float:
    """Pause until `cond()` holds; returns the seconds waited, fails after `timeout`."""
    start = time.perf_counter()
    while not cond():
        if time.perf_counter() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(step)
    return time.perf_counter() - start


async def type_text(pilot, text: str) -> None:
    for ch in text:
        await pilot.press({" ": "space", "/": "slash"}.get(ch, ch))


async def submit(pilot, text: str) -> None:
    """Put `text` in the input box and press Enter (typing key by key is slow in Pilot)."""
    from ninfer_cli.tui.widgets import PromptInput

    pilot.app.query_one(PromptInput).load_text(text)
    await pilot.press("enter")


async def start(pilot, text: str) -> None:
    """Submit `text` without Pilot's wait for an idle CPU (a stream never leaves it idle)."""
    from ninfer_cli.tui.widgets import PromptInput

    box = pilot.app.query_one(PromptInput)
    box.load_text(text)
    box.action_submit()
    await wait_for(pilot, lambda: pilot.app.generating)


async def send(pilot, text: str, timeout: float = 10.0) -> None:
    """Submit `text` and wait for the answer to finish."""
    app = pilot.app
    before = len(app.conversation.messages)
    await submit(pilot, text)
    await wait_for(pilot, lambda: not app.generating and len(app.conversation.messages) > before, timeout)
    await pilot.pause()


__all__ = ["ChatSettings", "FakeSession", "make_app", "run", "send", "start", "submit", "type_text", "wait_for"]
