"""The CLI root: help panels, -h, --version, and the error funnel (exit codes 0/1/2/130)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ninfer_cli import main as cli
from ninfer_cli.store import Store

runner = CliRunner()


def invoke(*args, **kw):
    return runner.invoke(cli.app, list(args), prog_name="ninfer", **kw)


def test_help_lists_panels_in_order_and_h_is_help():
    r = invoke("--help")
    assert r.exit_code == 0
    short = invoke("-h")
    assert short.exit_code == 0 and short.stdout == r.stdout
    panels = [p for p in cli.PANELS if f"─ {p} " in r.stdout]
    assert panels[:1] == ["Models"] and "Utils" in panels
    assert panels == sorted(panels, key=cli.PANELS.index)
    for name, _, _ in cli.COMMANDS:
        assert f" {name} " in r.stdout


def test_bare_ninfer_shows_help():
    r = invoke()
    assert "Usage: ninfer" in r.output and "Models" in r.output


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version(flag):
    r = invoke(flag)
    assert r.exit_code == 0
    assert r.stdout.startswith("ninfer ") and r.stdout.split()[1][0].isdigit()


def test_every_registered_command_has_help_and_a_known_panel():
    for name, _, panel in cli.COMMANDS:
        assert panel in cli.PANELS, f"{name}: unknown panel {panel}"
        r = invoke(name, "--help")
        assert r.exit_code == 0, (name, r.output)


def test_usage_error_exits_2():
    r = invoke("no-such-command")
    assert r.exit_code == 2
    r = invoke("ls", "--no-such-flag")
    assert r.exit_code == 2


def test_ninfer_error_is_one_line_plus_next_action(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    r = invoke("show", "nothing-here")
    assert r.exit_code == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0].startswith("error: no model named 'nothing-here'")
    assert lines[1].startswith("-> ") and "ninfer ls" in lines[1]
    assert "Traceback" not in r.stderr


def _boom(exc):
    def raise_it(self):
        raise exc

    return raise_it


def test_unexpected_exception_is_an_internal_error_line(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.delenv("NINFER_DEBUG", raising=False)
    monkeypatch.setattr(Store, "scan", _boom(RuntimeError("disk on fire")))
    r = invoke("ls")
    assert r.exit_code == 1
    assert r.stderr == "internal error: RuntimeError: disk on fire (set NINFER_DEBUG=1 for the traceback)\n"


def test_debug_lets_the_traceback_through(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.setenv("NINFER_DEBUG", "1")
    monkeypatch.setattr(Store, "scan", _boom(RuntimeError("disk on fire")))
    r = invoke("ls")
    assert isinstance(r.exception, RuntimeError)


def test_ctrl_c_exits_130(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.setattr(Store, "scan", _boom(KeyboardInterrupt()))
    assert invoke("ls").exit_code == 130


def test_entry_point_funnel_in_a_real_process(tmp_path):
    env = {**os.environ, "NINFER_HOME": str(tmp_path)}
    env.pop("NINFER_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "ninfer_cli.main", "rm", "-y", "ghost"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1
    assert p.stderr.startswith("error: no model named 'ghost'") and "Traceback" not in p.stderr


def test_report_error_for_plain_exception(capsys):
    assert cli.report_error(ValueError()) == 1
    assert capsys.readouterr().err == "internal error: ValueError (set NINFER_DEBUG=1 for the traceback)\n"
    cli.report_error(OSError("line one\n  line two " + "x" * 400))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("internal error: OSError: line one line two xxx")
    assert len(err) < 400


@pytest.mark.parametrize(
    ("exc", "first_line"),
    [(PermissionError(13, "Permission denied", "/models/x"), "error: permission denied (/models/x)"),
     (OSError(28, "No space left on device", "/models/x.part"), "error: no space left on the device (/models/x.part)"),
     (MemoryError(), "error: out of host memory")],
)
def test_user_caused_system_errors_get_a_next_action(capsys, exc, first_line):
    assert cli.report_error(exc) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == first_line and lines[1].startswith("-> ") and len(lines) == 2


def test_cupy_out_of_memory_is_a_user_error():
    oom = type("OutOfMemoryError", (Exception,), {"__module__": "cupy.cuda.memory"})("out of memory allocating 2 GiB")
    err = cli.as_user_error(oom)
    assert err.message.startswith("out of GPU memory") and "--ctx" in err.next_action
    assert cli.as_user_error(ValueError("x")) is None
