"""The decode plan (engine.gpu.plan) without a GPU: built for the published geometries on each GPU class, frozen,
naming only kernels the CUDA sources define, overridden through NINFER_PLAN; and on the CuPy stand-in, every kernel an
executor looks up is one the plan asked the module for (so the first GPU run compiles nothing else)."""
import dataclasses
import re
from pathlib import Path

import pytest

from cuda_smoke import CFG, cp, moe_cfg, on_gpu, weights as _weights  # noqa: F401
from engine.config import ModelArgs
from engine.errors import NinferError
from engine.gpu import plan as gpu_plan
from engine.gpu import kernel_names as KN
from engine.synthetic import GEOMETRIES

CUDA = Path(__file__).resolve().parents[1] / "cuda"


def _defined(name: str) -> bool:
    """Whether the CUDA sources define a kernel `name` (a template's name before '<')."""
    text = "\n".join(p.read_text() for p in CUDA.glob("*.cu"))
    return re.search(r"__global__[^{;]*?\b" + re.escape(name.split("<")[0]) + r"\s*\(", text) is not None


def _plan(geometry: str, gpu: str, kv: str = "bf16"):
    cfg, recipe = GEOMETRIES[geometry]
    return gpu_plan.plan_for_recipe(ModelArgs.from_config(cfg), recipe, kv, gpu)


@pytest.mark.parametrize("gpu", ["sm_90", "sm_86"])
@pytest.mark.parametrize("geometry", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_plan_is_frozen_and_names_real_kernels(geometry, gpu, monkeypatch):
    monkeypatch.delenv("NINFER_PLAN", raising=False)
    p = _plan(geometry, gpu, "int8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.norm = "residual_rmsnorm_mb"  # type: ignore[misc]
    assert p.kernels and all(_defined(n) for n in p.kernels) and not _defined("attn_decode_tt")
    assert set(p.kernels) <= set(KN.all_names())
    assert p.attn in p.kernels and (not p.gdn_scan or p.gdn_scan in p.kernels)
    tuned = gpu == "sm_90"
    assert p.tuned == tuned and p.pdl == tuned
    assert (p.norm == "residual_rmsnorm_cl") == tuned and (p.gdn == "gdn_delta_gated_cl") == tuned
    assert p.attn == ("attn_decode_mma<{g},true,8,2,true,true>" if tuned else "attn_decode_mma<{g},true,3,1>").format(
        g=6 if "27b" in geometry else 8)
    assert p.flash_warps == (8 if tuned else 4) and bool(p.gdn_scan) == tuned
    moe = "a3b" in geometry
    assert p.moe_fused == moe and p.mlp_fused == (not moe)
    assert len(p.kernels) < len(KN.all_names())


def test_plan_gemv_table_is_the_models():
    """The 27B's plan carries the tuning table's entries of its shapes; the 35B-A3B (other shapes) none."""
    p27, p35 = _plan("qwen3.6-27b", "sm_90"), _plan("qwen3.6-35b-a3b", "sm_90")
    assert len(p27.gemv) == len(KN.GEMV_TABLE) - 4  # (all but the w8 head of the 3.8-27B and its MTP layer's q8 shapes)
    assert p27.gemv_cfg()[("q5_g64_fp16", 5120, 17408)] == dict(rows=1, unroll=2, splits=2, pre2=True)
    assert p35.gemv == () and p35.describe()["kernels"] == len(p35.kernels)


def test_plan_override_from_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_PLAN", '{"branches": false, "norm": "residual_rmsnorm_mb5_1r"}')
    p = _plan("qwen3.6-27b", "sm_90")
    assert not p.branches and p.norm == "residual_rmsnorm_mb5_1r" and "residual_rmsnorm" not in "".join(p.kernels)
    f = tmp_path / "plan.json"
    f.write_text('{"gdn": "gdn_delta_raw_rw<4>"}')
    monkeypatch.setenv("NINFER_PLAN", str(f))
    p = _plan("qwen3.6-27b", "sm_90")
    assert p.gdn == "gdn_delta_raw_rw<4>" and not p.gdn_ab_in
    for bad, what in (('{"nrom": "x"}', "no plan field nrom"), ('{"branches": 1}', "takes a bool"),
                      ('{"norm": "residual_rmsnorm_cl"}', "need sm_90"), ("[1]", "not a JSON object"),
                      ('{"attn": "attn_decode_tt<6,true,4>"}', "not one the module")):
        monkeypatch.setenv("NINFER_PLAN", bad)
        with pytest.raises(NinferError, match=what):
            _plan("qwen3.6-27b", "sm_86" if "cl" in bad else "sm_90")


def test_plan_refuses_gpus_before_sm80():
    with pytest.raises(NinferError, match="compute capability 8.0"):
        gpu_plan.build_plan(ModelArgs.from_config(CFG), gpu_plan.Device(75, 64 * 1024, 40), "bf16", {})


def test_instantiation_counts():
    """The module compiled 268 instantiations for any model; a plan compiles its model's."""
    n27, n35 = len(_plan("qwen3.6-27b", "sm_90").kernels), len(_plan("qwen3.6-35b-a3b", "sm_90").kernels)
    assert n27 < 80 and n35 < 60 and len(KN.all_names()) < 268


@pytest.mark.parametrize("gpu", ["sm_90", "sm_86"])
@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_executors_look_up_only_the_plans_kernels(cp, monkeypatch, gpu, moe, kv):
    """The decode step, the columns step and the tensor-core prefill (and a prefill run) ask the module for no
    template instantiation their plan did not list: the first module compiled holds them all."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    on_gpu(monkeypatch, gpu)
    cfg = moe_cfg() if moe else CFG
    args, w = _weights(cfg)
    eng = build_engine(args, w, cfg, max_context=512, kv=kv, prefill_cols=0 if moe else 8, prefill_gemm=64)
    eng.prefill(list(range(1, 80)))
    eng.decode_greedy(3, 2)
    plan = eng.model.executor.plan
    main = [names for names, _ in K._MODULES]
    assert len(main) == 1, "a kernel outside the plan compiled a second module"
    asked = set(n for n in main[0])
    tc = {n for n in plan.kernels if n.startswith("gdn_chunk_scan_tc<")}
    assert asked == set(plan.kernels) - tc
    looked_up = {n for mod in [K.module(main[0])] for n in mod.kernels}
    assert {n for n in looked_up if "<" in n} <= set(plan.kernels)


def test_plan_override_checks_what_the_model_and_gpu_run(monkeypatch):
    """An attention kernel named alone brings its threads and shared memory; one for another grouping, KV format or a
    larger shared memory, a norm for wider rows, an unknown in-order pass or flash form are refused."""
    monkeypatch.setenv("NINFER_PLAN", '{"attn": "attn_decode_mma<6,true,4,2>"}')
    p = _plan("qwen3.6-27b", "sm_90", "int8")
    assert (p.attn, p.attn_threads, p.attn_smem) == ("attn_decode_mma<6,true,4,2>", 128, KN.attn_mma_smem(True, 4, 2))
    monkeypatch.setenv("NINFER_PLAN", '{"attn": "attn_decode_split<3,true,2>"}')
    assert (_plan("qwen3.6-27b", "sm_86", "int8").attn_threads, _plan("qwen3.6-27b", "sm_86", "int8").attn_smem) == (256, 0)
    for override, gpu, kv, what in (('{"attn": "attn_decode_mma<8,true,4,2>"}', "sm_90", "int8", "not for 6"),
                                    ('{"attn": "attn_decode_mma<6,false,4,3>"}', "sm_90", "int8", "int8 cache"),
                                    ('{"attn": "attn_decode_mma<6,true,4,4>"}', "sm_86", "int8", "shared memory"),
                                    ('{"norm": "residual_rmsnorm_mb2"}', "sm_90", "bf16", "at most 2,048"),
                                    ('{"gdn_scan": "gdn_chunk_scan_tc<16, 1>"}', "sm_90", "bf16", "in-order pass"),
                                    ('{"flash_warps": 8}', "sm_86", "bf16", "flash_warps")):
        monkeypatch.setenv("NINFER_PLAN", override)
        with pytest.raises(NinferError, match=what):
            _plan("qwen3.6-27b", gpu, kv)


@pytest.mark.parametrize("moe", [False, True])
def test_the_mtp_heads_q8_formats_leave_the_targets_plan_alone(moe):
    """The published files store the MTP head in q8 under the same roles as the target's layers (mlp/gate,
    moe/experts/up, ...): the plan is the target's formats' (its fused MLP or MoE launch stays on)."""
    from engine.gpu import weights as gpu_weights

    cfg, recipe = GEOMETRIES["qwen3.6-35b-a3b" if moe else "qwen3.8-27b"]
    args = ModelArgs.from_config(cfg)
    table = gpu_weights.RECIPES[recipe]

    class M:  # (a DevMatrix's format is all formats_of reads)
        def __init__(self, fmt):
            self.fmt = fmt

    roles = ["moe/experts/0/gate", "moe/experts/0/up", "moe/experts/0/down", "moe/shared/gate", "moe/shared/up",
             "moe/shared/down", "moe/router"] if moe else ["mlp/gate", "mlp/up", "mlp/down"]
    text = {f"text/layers/0/{r}": M(table[gpu_weights.role("text/layers/0/" + r)]) for r in roles}
    mtp = {f"mtp/layers/0/{r}": M(gpu_weights.mtp_table(table)[gpu_weights.role("text/layers/0/" + r)])
           for r in roles}
    assert gpu_plan.formats_of({**text, **mtp}) == gpu_plan.formats_of(text)
    fmts = gpu_plan.formats_of({**text, **mtp})
    ok = gpu_plan._moe_fused_ok(args, fmts) if moe else gpu_plan._mlp_fused_ok(args, fmts)
    assert ok
