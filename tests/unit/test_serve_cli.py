"""`ninfer serve`'s checks before anything loads: no open server off loopback, the serve extra, the port."""
from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from ninfer_cli.commands.serve import is_loopback
from ninfer_cli.main import app


@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.delenv("NINFER_API_KEY", raising=False)
    monkeypatch.delenv("NINFER_DEBUG", raising=False)
    resolved = []

    def no_model(ref, **kw):
        from engine.errors import NinferError

        resolved.append(ref)
        raise NinferError("stop here: the checks passed")

    monkeypatch.setattr("ninfer_cli.model_session.resolve_model", no_model)
    return CliRunner(), resolved


@pytest.mark.parametrize("host, local", [("127.0.0.1", True), ("127.8.9.1", True), ("localhost", True),
                                         ("::1", True), ("[::1]", True), ("0.0.0.0", False), ("::", False),
                                         ("192.168.1.5", False), ("example.com", False)])
def test_is_loopback(host, local):
    assert is_loopback(host) is local


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::"])
def test_open_bind_without_key_refuses_before_loading(cli, host):
    runner, resolved = cli
    r = runner.invoke(app, ["serve", "--host", host])
    assert r.exit_code == 1 and "refusing to listen on" in r.stderr and "--api-key" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2 and resolved == []


def test_a_key_from_the_environment_allows_an_open_bind(cli, monkeypatch):
    runner, resolved = cli
    monkeypatch.setenv("NINFER_API_KEY", "secret")
    r = runner.invoke(app, ["serve", "--host", "0.0.0.0", "some-model"])
    assert "stop here" in r.stderr and resolved == ["some-model"]
    r = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--api-key", "", "m"], env={"NINFER_API_KEY": ""})
    assert "refusing" in r.stderr  # an empty key is no key


def test_without_the_serve_extra_says_how_to_install(cli, monkeypatch):
    import importlib.util

    runner, resolved = cli
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a))
    r = runner.invoke(app, ["serve"])
    assert r.exit_code == 1 and "pip install 'ninfer[serve]'" in r.stderr and resolved == []


def test_port_in_use_is_one_line(monkeypatch):
    from engine.errors import NinferError
    from ninfer_cli.commands.serve import _listen

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(NinferError) as exc:
            _listen("127.0.0.1", taken.getsockname()[1])
        assert "cannot listen on 127.0.0.1" in exc.value.message and "--port" in exc.value.next_action
    finally:
        taken.close()
