"""`ninfer env`: without a GPU, with a faked one, and (marker gpu) on a real one."""
from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from ninfer_cli.commands import env as env_cmd
from ninfer_cli.main import app

runner = CliRunner()


def test_env_text_without_gpu(monkeypatch, tmp_path):
    for k in [k for k in os.environ if k.startswith("NINFER_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.setattr(env_cmd, "gpu_facts", lambda: {"cupy": None, "cupy_error": "not installed", "cuda_runtime": None,
                                                       "cuda_driver": None, "driver": None, "gpus": []})
    r = runner.invoke(app, ["env"], prog_name="ninfer")
    assert r.exit_code == 0, r.output
    out = dict(line.split(None, 1) if " " in line else (line, "") for line in r.stdout.replace("model store", "model_store")
               .replace("store free disk", "store_free").replace("device (auto)", "device").splitlines())
    assert out["gpu"] == "no GPU: NumPy backend"
    assert out["cupy"] == "not installed"
    assert out["model_store"] == str(tmp_path)
    assert out["store_free"].endswith("B") and out["numpy"][0].isdigit()
    assert out["kernels"]
    assert out["cpu"].endswith("GiB RAM") and out["overrides"] == f"NINFER_HOME={tmp_path}"


def test_env_json_with_a_fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    gpu = {"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0", "vram_free": 140 * 2**30, "vram_total": 141 * 2**30}
    monkeypatch.setattr(env_cmd, "gpu_facts", lambda: {"cupy": "14.2.0", "cuda_runtime": "13.0", "cuda_driver": "13.0",
                                                       "driver": "580.1", "gpus": [gpu]})
    data = json.loads(runner.invoke(app, ["env", "--json"]).stdout)
    assert data["gpus"][0]["name"] == "NVIDIA H200" and data["store"] == str(tmp_path)
    assert isinstance(data["store_free_bytes"], int) and data["store_free_bytes"] > 0
    text = runner.invoke(app, ["env"]).stdout
    assert "NVIDIA H200 (sm 9.0), 140.00 GiB free of 141.00 GiB" in text and "no GPU" not in text


def test_gpu_facts_never_raises():
    facts = env_cmd.gpu_facts()
    assert isinstance(facts["gpus"], list)
    assert facts["cupy"] is not None or "cupy_error" in facts


def test_kernel_path_reports_what_dispatch_describes(monkeypatch):
    import sys
    import types

    import engine.ops

    fake = types.ModuleType("engine.ops.dispatch")
    monkeypatch.setitem(sys.modules, "engine.ops.dispatch", fake)
    monkeypatch.setattr(engine.ops, "dispatch", fake, raising=False)
    fake.describe = lambda: {"backend": "cuda", "gemv": "q4 row-split"}
    assert env_cmd.kernel_path() == "backend=cuda, gemv=q4 row-split"
    fake.describe = lambda: "numpy reference"
    assert env_cmd.kernel_path() == "numpy reference"

    def broken():
        raise RuntimeError("nvrtc missing")

    fake.describe = broken
    assert env_cmd.kernel_path() == "unknown (dispatch.describe() failed: RuntimeError: nvrtc missing)"


def test_cuda_version_format():
    assert env_cmd._cuda_version(12080) == "12.8" and env_cmd._cuda_version(13000) == "13.0"


@pytest.mark.gpu
def test_env_on_a_gpu_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    data = json.loads(runner.invoke(app, ["env", "--json"]).stdout)
    assert data["cupy"] and data["cuda_runtime"] and data["cuda_driver"]
    gpu = data["gpus"][0]
    assert "error" not in gpu, gpu
    assert gpu["name"] and 0 < gpu["vram_free"] <= gpu["vram_total"]
    assert data["device_auto"] == "gpu"
    text = runner.invoke(app, ["env"]).stdout
    assert gpu["name"] in text and "no GPU" not in text


def test_env_prints_the_decode_plan_without_a_gpu(monkeypatch):
    """`ninfer env --plan GEOMETRY --gpu CLASS`: the CUDA decode plan of a geometry on a GPU class, no GPU needed."""
    monkeypatch.delenv("NINFER_PLAN", raising=False)
    monkeypatch.setattr(env_cmd, "gpu_facts", lambda: {"cupy": None, "cuda_runtime": None, "cuda_driver": None,
                                                       "driver": None, "gpus": []})
    r = runner.invoke(app, ["env", "--plan", "qwen3.6-35b-a3b", "--gpu", "sm_86", "--kv", "int8", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["gpu"] == "sm_86" and plan["kv"] == "int8" and plan["moe_fused"] and not plan["tuned"]
    assert plan["norm"] == "residual_rmsnorm_mb2" and plan["attn"] == "attn_decode_mma<8,true,3,1>"
    assert isinstance(plan["kernels"], int) and plan["kernels"] > 10
    r = runner.invoke(app, ["env", "--plan", "qwen3.6-27b"])  # (no GPU: the sm_90 class)
    assert r.exit_code == 0 and "residual_rmsnorm_cl" in r.stdout and "gdn_delta_gated_cl" in r.stdout
    r = runner.invoke(app, ["env", "--plan", "nope"])
    assert r.exit_code == 1 and "qwen3.6-27b" in r.output
