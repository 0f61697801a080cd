"""The CUDA decode step's attention on the CPU: which kernel, grid, block and shared memory the plan of each GPU class
takes (engine.gpu.plan.attention_form), and the op list built against the NumPy stand-in for CuPy
(tests/fake_cupy.py, kernels are no-ops). The rest of the decode step's plumbing is in test_cuda_executor_smoke.py."""
import pytest

from cuda_smoke import CFG, cp, flat as _flat, on_gpu, weights as _weights  # noqa: F401


@pytest.mark.parametrize("gpu,kv,want", [
    ("sm_90", "bf16", "attn_decode_mma<6,false,4,3>"),
    ("sm_90", "int8", "attn_decode_mma<6,true,8,2,true,true>"),  # (raw K and V codes in the MMAs)
    ("sm_80", "int8", "attn_decode_mma<6,true,4,2>"),
    ("sm_80", "bf16", "attn_decode_mma<6,false,4,2>"),
    ("sm_86", "int8", "attn_decode_mma<6,true,3,1>"),
    ("sm_89", "bf16", "attn_decode_mma<6,false,4,1>")])
def test_attention_form_follows_the_shared_memory(gpu, kv, want):
    """The tensor-core attention's first form that fits the class's shared memory a block, and its size."""
    from engine.gpu.plan import DEVICES, attention_form
    from engine.gpu import kernel_names as KN

    name, threads, smem = attention_form(6, kv, DEVICES[gpu])
    assert name == want and smem <= DEVICES[gpu].smem_optin
    w, ns = (int(v) for v in want[:-1].split(",")[2:4])
    assert threads == 32 * w and smem == KN.attn_mma_smem(kv == "int8", w, ns, vraw=want.endswith("true,true>"))
    assert KN.attn_mma_smem(True, 4, 4) == KN.attn_mma_smem(False, 4, 3) == 211_200
    assert KN.attn_mma_smem(True, 8, 2, vraw=True) == 143_616


def test_attention_split_kernels_where_the_tensor_cores_are_not_compiled():
    """Query groups attn_decode_mma is not compiled for take the split kernel, 6 and 8 heads a KV head cut in two
    blocks where they would."""
    from engine.gpu.plan import DEVICES, attention_form

    assert attention_form(2, "bf16", DEVICES["sm_90"]) == ("attn_decode_split<2,false>", 256, 0)
    assert attention_form(3, "int8", DEVICES["sm_86"]) == ("attn_decode_split<3,true>", 256, 0)
    small = type(DEVICES["sm_86"])(86, 48 * 1024, 82)  # (no tensor-core form fits)
    assert attention_form(6, "bf16", small) == ("attn_decode_split<3,false,2>", 256, 0)


@pytest.mark.parametrize("gpu,kv", [("sm_90", "int8"), ("sm_90", "bf16"), ("sm_86", "int8")])
def test_attention_launch_plumbing(cp, monkeypatch, gpu, kv):
    """The executor launches the plan's attention over (Hkv, nsplit, M) with its warps and shared memory; nsplit fills
    the SMs once with its resident blocks; the combine (with the o-projection's staging) takes the same nsplit."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    on_gpu(monkeypatch, gpu)
    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)  # 6 query heads a KV head, as the 27B
    args, w = _weights(cfg)
    ex = build_engine(args, w, cfg, max_context=2048, prefill_cols=8, prefill_gemm=0, kv=kv).model.executor
    plan = ex.plan
    ops = _flat(ex.ops)
    att = [op for op in ops if getattr(op, "name", "").startswith("attn_decode")]
    assert att and {op.name for op in att} == {plan.attn}
    assert all(op.grid == (2, ex.attention.nsplit, ex.M) and op.block == plan.attn_threads and op.smem == plan.attn_smem
               for op in att)
    waves = K.blocks_per_sm(plan.attn, plan.attn_threads, plan.attn_smem)
    assert ex.attention.nsplit == min(2048 // 64, (waves * K.sm_count()) // 2) == ex.attention.attn_ml.shape[2]
    comb = [op for op in ops if getattr(op, "name", "").startswith("attn_combine")]
    assert len(comb) == len(att) and all(int(op.args[2]) == ex.attention.nsplit for op in comb)


def test_attention_override_is_checked(cp, monkeypatch):
    """NINFER_PLAN may pick another attention form the module compiles; a name it cannot compile is refused."""
    from engine.errors import NinferError
    from engine.gpu_engine import build_engine

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w = _weights(cfg)
    on_gpu(monkeypatch, "sm_90", attn="attn_decode_split<3,true,2>")
    ex = build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv="int8").model.executor
    att = [op for op in _flat(ex.ops) if getattr(op, "name", "").startswith("attn_decode")]
    assert {op.name for op in att} == {"attn_decode_split<3,true,2>"} and all(op.grid[0] == 4 for op in att)
    on_gpu(monkeypatch, "sm_90", attn="attn_decode_tt<6,true,4>")
    with pytest.raises(NinferError, match="NINFER_PLAN"):
        build_engine(args, w, cfg, max_context=256, prefill_cols=8, prefill_gemm=0, kv="int8")
