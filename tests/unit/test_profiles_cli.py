"""`ninfer profile ls|show` and `ninfer show MODEL --memory` through the CLI (no GPU, no weights loaded)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from engine import memory_budget as mb
from engine.gpu import memory as mp
from ninfer_cli.main import app
from ninfer_cli.store import Store

runner = CliRunner()
GIB = 2**30


def invoke(*args):
    return runner.invoke(app, list(args), prog_name="ninfer")


@pytest.fixture(autouse=True)
def no_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "store"))
    monkeypatch.setattr(mb, "device_memory", lambda: None)


def test_profile_ls_lists_every_catalog_model():
    r = invoke("profile", "ls", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    by = {(x["model"], x["name"]): x for x in rows}
    assert by[("qwen38-27b", "long")]["kv"] == "int8" and by[("qwen38-27b", "default")]["ctx"] is None
    fast = by[("qwen36-35b-a3b", "fast")]
    assert fast["spec"] == "mtp" and fast["draft_tokens"] == 3 and "MTP head" in fast["status"]
    assert ("smollm2-135m", "default") in by and ("smollm2-135m", "long") not in by
    table = invoke("profile")  # ls is the default action
    assert table.exit_code == 0 and "qwen36-27b" in table.stdout and "mtp:3" in table.stdout


def test_profile_show():
    r = invoke("profile", "show", "qwen38-27b:latest", "long")
    assert r.exit_code == 0, r.output
    assert "--ctx auto --kv int8" in r.stdout and "ninfer show qwen38-27b --memory --profile long" in r.stdout
    data = json.loads(invoke("profile", "show", "qwen38-27b", "--json").stdout)
    assert data["name"] == "default" and data["flags"] == "--ctx auto --kv bf16"


def test_profile_show_errors():
    assert invoke("profile", "show").exit_code == 2
    r = invoke("profile", "show", "smollm2-135m", "fast")
    assert r.exit_code == 1 and "has no profile 'fast'" in r.stderr


def _memory(*args):
    r = invoke("show", *args, "--memory", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_show_memory_for_a_catalog_model_not_downloaded():
    d = _memory("qwen38-27b", "--vram-limit", "24GiB")
    assert d["kv_bytes_per_token"] == 65_536 and d["context"] == 98_304 and d["fits"] is True
    assert d["total_bytes"] <= d["budget"]["free"] == 24 * GIB - mp.CONTEXT_ESTIMATE
    assert d["source"] == "recipe estimate"
    long = _memory("qwen38-27b", "--vram-limit", "24GiB", "--profile", "long")
    assert long["kv"] == "int8" and long["kv_bytes_per_token"] == 33_792 and long["context"] == 163_840
    moe = _memory("qwen36-35b-a3b", "--ctx", "64k", "--kv", "int8")
    assert moe["kv_bytes_per_token"] == 10_560 and moe["context"] == 65_536 and moe["budget"] is None
    kv = next(i for i in moe["items"] if i["name"] == "KV pool: text")
    assert kv["bytes"] == 1024 * 64 * 10_560


def test_show_memory_table_and_a_context_that_does_not_fit():
    r = invoke("show", "qwen38-27b", "--memory", "--ctx", "256k", "--vram-limit", "24GiB")
    assert r.exit_code == 0, r.output
    assert "KV pool: text" in r.stdout and "17,179,869,184" in r.stdout  # 4,096 pages x 64 x 65,536 B
    assert "does NOT fit" in r.stdout and "does not fit: needs" in r.stderr


def test_show_memory_unknown_model():
    r = invoke("show", "nosuch", "--memory")
    assert r.exit_code == 1 and "no installed model" in r.stderr


def test_show_memory_of_a_stored_artifact_uses_its_object_sizes(tmp_path):
    from engine.artifact.container import write_artifact
    from engine.bench_models import TINY

    h, v = TINY["hidden_size"], TINY["vocab_size"]
    emb = np.zeros((v, h), np.float32)
    src = write_artifact(tmp_path / "tinyq.ninfer", {"text": {"config": dict(TINY)}, "mtp": {"config": {}}},
                         [("text/token_embedding", "fp32", "contiguous_le_v1", emb.shape, emb),
                          ("text/layers/0/input_norm", "bf16", "contiguous_le_v1", (h,), np.ones(h, np.float32)),
                          ("mtp/final_norm", "fp32", "contiguous_le_v1", (h,), np.ones(h, np.float32))], {})
    Store().add("tinyq", src, source="test")
    d = _memory("tinyq", "--ctx", "1024")
    weights = {i["name"]: i["bytes"] for i in d["items"] if i["name"].startswith("weights")}
    assert weights == {"weights: text": v * h * 4 + h * 4}  # the bf16 norm is uploaded as fp32; mtp not loaded
    # TINY: 1 attention layer x 2 kv heads x 32 dims x (K + V) x 2 B; 1024 tokens = 16 pages
    assert d["kv_bytes_per_token"] == 256
    assert next(i for i in d["items"] if i["name"] == "KV pool: text")["bytes"] == 16 * 64 * 256
    fast = _memory("tinyq", "--ctx", "1024", "--profile", "fast")  # the artifact has MTP: fast exists
    assert "weights: mtp" in {i["name"] for i in fast["items"]}


def test_show_memory_of_the_fast_profile_plans_the_speculation_parts():
    fast, default = _memory("qwen38-27b", "--profile", "fast"), _memory("qwen38-27b")
    names = {i["name"] for i in fast["items"]}
    assert {"ReplaySSM arena", "KV pool: mtp"} <= names and "KV pool: mtp" not in {i["name"] for i in default["items"]}
    assert "4 decode row(s)" in next(i["detail"] for i in fast["items"] if i["name"] == "activations/workspace")
    assert "weights: mtp" in names  # (the recipe table sizes the head: engine.gpu.memory.weights_from_recipe)
