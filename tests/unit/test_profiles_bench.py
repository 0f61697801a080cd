"""`ninfer bench --ctx/--vram-limit/--profile`: instances are built with the context fitted to memory."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine import memory_budget as mb
from engine.gpu import memory as mp
from engine.errors import NinferError
from ninfer_cli import profiles as P
from ninfer_cli.main import app

GIB = 2**30
runner = CliRunner()
TINY = ["bench", "--synthetic", "tiny", "-p", "16", "-n", "8", "-r", "1", "--warmup", "0", "--no-progress"]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))


def test_bench_builds_with_the_explicit_context():
    r = runner.invoke(app, TINY + ["--ctx", "2k", "-o", "json"], prog_name="ninfer")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["settings"]["contexts"] == [{"kv": None, "lanes": 1, "spec": "off", "context": 2048}]


def test_bench_context_shorter_than_the_tests_is_an_error():
    r = runner.invoke(app, TINY + ["--ctx", "16"], prog_name="ninfer")
    assert r.exit_code == 1 and "context 16 is shorter than the tests need (33)" in r.stderr


def test_bench_fitter_on_the_gpu_fits_each_kv(monkeypatch):
    monkeypatch.setattr(mb, "device_memory", lambda: (140 * GIB, 141 * GIB, 0))  # an idle H200
    monkeypatch.setattr(mb, "apply_vram_limit", lambda limit: None)
    said = []
    fit = P.bench_fitter(device="gpu", synthetic="qwen3.8-27b", vram_limit=24 * GIB, say=said.append)
    assert fit("int8") == 163840 and fit(None) == 98304
    assert said[0].startswith("[kv=int8] context auto -> 163,840")
    long = P.bench_fitter(device="gpu", synthetic="qwen3.8-27b", profile="long", vram_limit=24 * GIB)
    assert long(None) == 163840
    explicit = P.bench_fitter(device="gpu", synthetic="qwen3.8-27b", ctx=262144, vram_limit=24 * GIB)
    with pytest.raises(NinferError, match="context 262,144 needs"):
        explicit("bf16")
