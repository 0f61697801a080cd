"""`ninfer chat` in a real terminal (tmux) on the default model: a question typed before the app is up is
answered, the tok/s figure and a context gauge that fills while the answer streams are on the captured
screen, Ctrl+P opens our own palette and Esc closes it, and the conversation is saved on quit."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _default_model_present() -> bool:
    from ninfer_cli.model_session import DEFAULT_MODEL
    from ninfer_cli.store import Store

    found = Store().find(DEFAULT_MODEL)
    return found is not None and found.artifact_path.exists()


def _tmux(socket: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    # A server of our own: an existing one would hand the window its own environment, not ours.
    return subprocess.run(["tmux", "-L", socket, *args], **kwargs)


def _screen(session: str) -> str:
    return _tmux(session, "capture-pane", "-p", "-t", session, capture_output=True, text=True).stdout


def _wait_screen(session: str, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, _screen(session))
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"{pattern!r} not on screen after {timeout} s:\n{_screen(session)}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_chat_in_tmux_answers_and_shows_tok_s(tmp_path):
    if not _default_model_present():
        pytest.skip("the default model is not in the store (ninfer pull smollm2-135m)")
    session = f"ninfer-e2e-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "NINFER_CHATS": str(tmp_path / "chats"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TERM": "xterm-256color"}
    # The shell sleeps first, as a slow first start would: the question is typed before the app is up.
    command = f"sleep 1.5; {shlex.quote(sys.executable)} -m ninfer_cli.main chat --temperature 0; sleep 5"
    _tmux(session, "-f", os.devnull, "new-session", "-d", "-s", session, "-x", "110", "-y", "30", command,
          check=True, env=env, cwd=ROOT)
    try:
        question = "What is the capital of France? Answer in one sentence."
        _tmux(session, "send-keys", "-t", session, question, check=True)
        _tmux(session, "send-keys", "-t", session, "Enter", check=True)
        _wait_screen(session, r"ctx \S+ \d+/\d+k", timeout=60)
        _wait_screen(session, r"Paris", timeout=120)
        rate = _wait_screen(session, r"last (\d+\.\d) tok/s TTFT (\d+\.\d+)s", timeout=120)
        assert float(rate.group(1)) > 0 and float(rate.group(2)) > 0
        assert re.search(r"\d+ tokens · \d+\.\d tok/s · TTFT", _screen(session))
        assert question in _screen(session)  # typed before the app, sent whole

        # A long answer: the gauge moves while it streams (not only when it ends).
        _tmux(session, "send-keys", "-t", session, "Write a long story about a cat who learns to fly.", check=True)
        _tmux(session, "send-keys", "-t", session, "Enter", check=True)
        _wait_screen(session, r"\d+\.\d tok/s\s", timeout=60)  # the live rate: streaming
        first = int(_wait_screen(session, r"ctx \S+ (\d+)/", timeout=10).group(1))
        time.sleep(2.0)
        later = int(_wait_screen(session, r"ctx \S+ (\d+)/", timeout=10).group(1))
        assert later > first, (first, later)
        _tmux(session, "send-keys", "-t", session, "Escape", check=True)

        _wait_screen(session, r"stopped", timeout=10)
        _tmux(session, "send-keys", "-t", session, "C-p", check=True)
        _wait_screen(session, r"/clear", timeout=10)  # our commands, listed before anything is typed
        _tmux(session, "send-keys", "-t", session, "think", check=True)
        _wait_screen(session, r"/think high", timeout=10)
        assert "Screenshot" not in _screen(session) and "Maximize" not in _screen(session)
        _tmux(session, "send-keys", "-t", session, "Escape", check=True)
        deadline = time.monotonic() + 10
        while "/think high" in _screen(session) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert "/think high" not in _screen(session)

        _tmux(session, "send-keys", "-t", session, "C-q", check=True)
        _wait_screen(session, r"conversation saved: ninfer chat --resume \S+", timeout=30)
    finally:
        _tmux(session, "kill-server", capture_output=True)
    saved = list((tmp_path / "chats").glob("*.json"))
    assert len(saved) == 1
    messages = json.loads(saved[0].read_text())["messages"]
    assert messages[0]["content"] == question and "Paris" in messages[1]["content"]
