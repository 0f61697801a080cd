"""A Qwen3.5 MoE v3 artifact through engine.load on the GPU: the CUDA engine, against the NumPy engine on the same
file (which decodes the same codes), greedy and through the stream users read."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from test_gpu_engine import MOE_CFG  # noqa: E402  (tests/gpu is on sys.path under pytest)


def test_moe_artifact_through_engine_load_matches_numpy(tmp_path):
    from engine import api
    from engine.artifact.writer import write_artifact
    from engine.gpu_engine import CudaEngine
    from engine.synthetic import artifact_tensors

    path = write_artifact(tmp_path / "moe.ninfer", {"text": {"config": MOE_CFG}},
                          artifact_tensors(MOE_CFG, "groupwise-int-moe", seed=5))
    gpu = api.load(path, device="gpu", max_context=256)
    cpu = api.load(path, device="cpu", max_context=256, gdn_mode="recurrent")
    assert isinstance(gpu, CudaEngine)
    ids = [5, 17, 900, 3, 3, 42, 7, 512]
    errs, agree = [], 0
    a, b = cpu.prefill(ids), gpu.prefill(ids)
    for t in np.random.default_rng(3).integers(0, MOE_CFG["vocab_size"], 24):
        errs.append(float(np.linalg.norm(a - b) / np.linalg.norm(a)))
        agree += int(np.argmax(a) == np.argmax(b))
        a, b = cpu.decode_step(int(t)), gpu.decode_step(int(t))
    # the gates of test_gpu_engine_moe.assert_moe_gates (fp16 activations can flip a near-tied expert choice)
    assert np.median(errs) < 3e-2 and max(errs) < 0.35 and agree >= 22, (np.median(errs), max(errs), agree)
    greedy = api.GenerationConfig(max_tokens=16, temperature=0.0, ignore_eos=True)
    streamed = [r.token for r in gpu.stream(ids, greedy)]
    gpu.reset()
    first = int(np.argmax(gpu.prefill(ids)))
    assert streamed == [first] + gpu.decode_greedy(first, 15)


def test_ninfer_run_on_a_moe_artifact_takes_the_cuda_engine(tmp_path):
    """`ninfer run` on a tiny MoE file (the fixture's tokenizer and chat template) answers through the CUDA engine,
    and its stats line says so."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from engine.artifact.from_hf import _resources
    from engine.artifact.writer import write_artifact
    from engine.synthetic import artifact_tensors

    blobs, roles = _resources(Path(__file__).resolve().parents[1] / "fixtures" / "artifact" / "hf_moe")
    path = write_artifact(tmp_path / "moe.ninfer", {"text": {"config": MOE_CFG, "resources": roles}},
                          artifact_tensors(MOE_CFG, "groupwise-int-moe", seed=5), resources=blobs)
    env = dict(os.environ, NINFER_HOME=str(tmp_path / "home"))
    r = subprocess.run([sys.executable, "-m", "ninfer_cli.main", "run", str(path), "hello there", "--device", "gpu",
                        "--max-tokens", "8", "--temperature", "0", "--json"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["backend"] == "cuda-graph" and out["usage"]["completion_tokens"] >= 1
