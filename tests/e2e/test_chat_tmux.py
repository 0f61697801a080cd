"""`ninfer chat` in a real terminal (tmux) on the default model: type a question, read the answer
and the tok/s figure from the captured screen, quit, and find the conversation saved."""
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
    command = f"{shlex.quote(sys.executable)} -m ninfer_cli.main chat --temperature 0; sleep 5"
    _tmux(session, "-f", os.devnull, "new-session", "-d", "-s", session, "-x", "110", "-y", "30", command,
          check=True, env=env, cwd=ROOT)
    try:
        _wait_screen(session, r"ctx \S+ 0/\d+k", timeout=60)
        _wait_screen(session, r"smollm2-135m cpu", timeout=60)  # loaded: "loading…" is gone
        _tmux(session, "send-keys", "-t", session, "What is the capital of France?", check=True)
        _tmux(session, "send-keys", "-t", session, "Enter", check=True)
        _wait_screen(session, r"Paris", timeout=120)
        rate = _wait_screen(session, r"last (\d+\.\d) tok/s TTFT (\d+\.\d+)s", timeout=120)
        assert float(rate.group(1)) > 0 and float(rate.group(2)) > 0
        assert re.search(r"\d+ tokens · \d+\.\d tok/s · TTFT", _screen(session))
        _tmux(session, "send-keys", "-t", session, "C-q", check=True)
        _wait_screen(session, r"conversation saved: ninfer chat --resume \S+", timeout=30)
    finally:
        _tmux(session, "kill-server", capture_output=True)
    saved = list((tmp_path / "chats").glob("*.json"))
    assert len(saved) == 1
    messages = json.loads(saved[0].read_text())["messages"]
    assert messages[0]["content"] == "What is the capital of France?" and "Paris" in messages[1]["content"]
