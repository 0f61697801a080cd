"""engine.load of a Qwen3.5 MoE v3 artifact on a GPU builds the CUDA engine (on the CuPy stand-in: the plumbing of
the front door; tests/gpu/test_load_moe.py checks the numbers on a device)."""
from cuda_smoke import cp, moe_cfg  # noqa: F401


def test_moe_artifact_takes_the_cuda_engine(cp, tmp_path):
    from engine import api
    from engine.artifact.writer import write_artifact
    from engine.gpu_engine import CudaEngine
    from engine.synthetic import artifact_tensors

    cfg = moe_cfg()
    path = write_artifact(tmp_path / "moe.ninfer", {"text": {"config": cfg}},
                          artifact_tensors(cfg, "groupwise-int-moe", seed=2))
    eng = api.load(path, device="gpu", max_context=256)
    assert isinstance(eng, CudaEngine) and eng.info()["backend"] == "cuda-graph"
    names = {getattr(op, "name", "") for op in eng.model.executor.ops}
    assert any("moe" in n for n in names)  # the MoE block's kernels, not the dense MLP's
    recs = list(eng.stream([1, 2, 3], api.GenerationConfig(max_tokens=3, temperature=0.7, top_k=20, seed=1)))
    # the first token from the prompt's logits, two drawn on the device, nothing launched past max_tokens
    assert recs[-1].finish_reason == "length" and eng.position == 3 + 2


def test_the_published_moe_geometry_is_planned_for_the_cuda_engine():
    """`--ctx auto` and the profiles fit the CUDA engine's memory (they plan only for models it runs)."""
    from engine.config import ModelArgs
    from engine.gpu_engine import cuda_supported
    from engine.synthetic import geometry_config
    from ninfer_cli.profiles import _cuda_runs

    args = ModelArgs.from_config(geometry_config("qwen3.6-35b-a3b"))
    assert args.is_moe and cuda_supported(args) and _cuda_runs(args)
