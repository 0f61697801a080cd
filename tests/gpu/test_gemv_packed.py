"""gemv_tc's packed form (cuda/gemv_tc.cu tc_run_pk: up to 4 columns of q4-q6, one MMA a step) and the packed twin of
the staged pairs that the producers write beside them (cuda/common.cuh pk_word): every producer's twin against the
twin built here from its pairs, and the GEMV on the twin against the same GEMV on the pairs and the reference."""
import numpy as np
import pytest

from engine.artifact import formats
from engine.ops import ref
from engine.gpu.gemv import GemvPlan

pytestmark = pytest.mark.gpu

from kernel_checks import LINEAR, RNG, check, poisoned  # noqa: E402  (tests/gpu is on sys.path)


def twin_of(pairs: np.ndarray) -> np.ndarray:
    """The packed twin of staged pairs [rows, kpad / 2] (uint32), as common.cuh lays it out: group G's lane 4 g + t
    holds, for its steps s = 0, 1, the 8 values of slot 2 (t & 1) + s of chunk 2 G + (t >> 1): high bytes of row g
    (g < 4), low bytes of row g - 4."""
    rows, words = pairs.shape
    v = pairs.view(np.int16).reshape(rows, words * 2).astype(np.int32)
    hi = (v + 128) >> 8
    assert hi.max(initial=0) <= 127 and hi.min(initial=0) >= -128, "staged values past STAGE_MAX"
    lo = v - 256 * hi
    groups = words * 2 // 64
    out = np.zeros((groups + 4, 32, 16), dtype=np.int8)
    G = np.arange(groups)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        if (g & 3) >= rows:
            continue
        src = hi if g < 4 else lo
        for s in range(2):
            c, slot = 2 * G + (t >> 1), 2 * (t & 1) + s
            u = (c >> 5) * 128 + slot * 32 + (c & 31)  # the slot's uint4 in the slot-major pairs
            out[:groups, lane, 8 * s:8 * s + 8] = src[g & 3][(8 * u)[:, None] + np.arange(8)]
    return out.view(np.uint8).ravel()


def _twin(cp, kpad):
    return cp.zeros((kpad // 64 + 4) * 512, dtype=cp.uint8)


@pytest.mark.parametrize("m", [2, 3, 4])
def test_the_producers_write_the_twin_of_their_pairs(cp, m):
    from engine.gpu import launch as K
    from engine.gpu.gdn import gated_norm_stage
    from engine.gpu.mlp import stage_amax
    from engine.gpu.norm import residual_norm, stage_rows

    for k in (1000, 5120, 17408):
        kpad = -(-k // K.XPAD) * K.XPAD
        x = cp.asarray((RNG.standard_normal((m, k)) * 3).astype(np.float32))
        xh, xinv, pk = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32), _twin(cp, kpad)
        stage_rows(x=x, ld=k, k=k, kpad=kpad, xh=xh, ldh=kpad // 2, xinv=xinv, rows=m, blocks=3, xpk=pk)()
        assert np.array_equal(pk.get(), twin_of(xh.get())), f"stage_x_mb {k}"
        # stage_x_amax from the rows' maxima in its slot
        slot = cp.asarray(np.stack([np.abs(x.get()).max(1).astype(np.float32).view(np.uint32),
                                    np.zeros(m, np.uint32)], 1).ravel())
        xh2, xinv2, pk2 = cp.zeros_like(xh), cp.zeros_like(xinv), _twin(cp, kpad)
        stage_amax(x=x, k=k, kpad=kpad, xh=xh2, xinv=xinv2, slot=slot, rows=m, xpk=pk2)()
        assert np.array_equal(xh2.get(), xh.get()) and np.array_equal(pk2.get(), pk.get()), f"stage_x_amax {k}"
    # the residual norms, each form
    for h, s in ((1000, 3), (2048, 9), (5120, 3)):
        kpad = -(-h // K.XPAD) * K.XPAD
        x = cp.asarray(RNG.standard_normal((m, h)).astype(np.float32))
        planes = cp.asarray(RNG.standard_normal((s, m, h)).astype(np.float32))
        w = cp.asarray(RNG.standard_normal(h).astype(np.float32) * 0.1)
        forms = ["residual_rmsnorm_mb", "residual_rmsnorm_mb5_1r"] + (["residual_rmsnorm_mb2"] if h <= 2048 else [])
        forms += ["residual_rmsnorm_cl"] if K.cluster_capable() else []
        for name in forms:
            xh, xinv, pk = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32), _twin(cp, kpad)
            residual_norm(name, x_in=x, x_out=cp.zeros_like(x), planes=planes, nplanes=s, plane_stride=m * h, weight=w,
                          out=cp.zeros_like(x), hidden=h, eps=1e-6, xh=xh, xinv=xinv, kpad=kpad, rows=m, xpk=pk)()
            assert np.array_equal(pk.get(), twin_of(xh.get())), f"{name} {h}"
    # the gated norm with the o-projection's staging
    hv = 48
    k = hv * 128
    kpad = -(-k // K.XPAD) * K.XPAD
    o = cp.asarray(RNG.standard_normal((m, hv, 128)).astype(np.float32))
    z = cp.asarray(RNG.standard_normal((m, k)).astype(np.float32))
    gw = cp.asarray(RNG.standard_normal(128).astype(np.float32))
    xh, xinv, pk = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32), _twin(cp, kpad)
    gated_norm_stage(o=o, z=z, ld_z=k, weight=gw, out=cp.zeros((m, k + 256), cp.float32), ld_out=k + 256, v_heads=hv,
                     eps=1e-6, k=k, kpad=kpad, xh=xh, xinv=xinv, rows=m, xpk=pk)()
    assert np.array_equal(pk.get(), twin_of(xh.get())), "gated_rmsnorm_stage"


@pytest.mark.parametrize("fmt", ["q4_g64_fp16", "q5_g64_fp16", "q6_g64_fp16"])
@pytest.mark.parametrize("n,k", [(512, 5120), (300, 1000), (96, 17408)], ids=["512x5120", "300x1000", "96x17408"])
@pytest.mark.parametrize("m", [2, 3, 4])
def test_gemv_tc_on_the_twin_matches_the_pairs(cp, fmt, n, k, m):
    """Each compiled form (groups a run, ring stages) on the twin: store, split-K planes and SwiGLU, within fp32
    rounding of the same form on the pairs (the same integer sums, the high and low ones added in another order)."""
    from engine.gpu import kernel_names as KN
    from engine.gpu import launch as K
    from engine.gpu.norm import stage_rows
    from engine.gpu.weights import upload_matrix

    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dm = upload_matrix(cp, fmt, w)
    wq = formats.decode(fmt, "row_split_k128_v1", (n, k), cp.asnumpy(dm.buf))
    x = (RNG.standard_normal((m, k)) * 3).astype(np.float32)
    kpad = -(-k // K.XPAD) * K.XPAD
    xh, xinv, pk = cp.zeros((m, kpad // 2), dtype=cp.uint32), cp.zeros(m, dtype=cp.float32), _twin(cp, kpad)
    stage_rows(x=cp.asarray(x), ld=k, k=k, kpad=kpad, xh=xh, ldh=kpad // 2, xinv=xinv, rows=m, blocks=3, xpk=pk)()
    h = ref.linear(x, wq)
    forms = {tuple(int(v) for v in name[name.index("<") + 1:-1].split(",")[2:4])
             for name in KN.gemv_tc_names(K.FMT_IDS[fmt], m)}
    for gu, st in sorted(forms):
        for epi, splits in (("store", 1), ("partial", 3), ("swiglu", 1)):
            outs = n // 2 if epi == "swiglu" else n
            got = {}
            for packed in (False, True):
                y = poisoned(cp, (splits, m, outs))
                plan = GemvPlan(dm, None, k, y, outs, m=m, epi=epi, splits=splits, tc=(gu, st),
                                xpre=(xh, xinv, pk if packed else None))
                assert plan.packed == packed and plan.kname.endswith(",true>") == packed
                plan.launch()
                got[packed] = y[: plan.splits].get().sum(axis=0)
            want = ref.swiglu(h[:, : n // 2], h[:, n // 2:]) if epi == "swiglu" else h
            check(f"gemv_tc packed {fmt} {epi} ({gu}, {st})", got[True], want, **LINEAR)
            scale = np.abs(got[False]).max()
            assert np.abs(got[True] - got[False]).max() <= 1e-5 * scale, (gu, st, epi)


def test_the_verifications_twins_are_those_of_its_pairs(cp):
    """In the tiny model's verification (4 columns), each producer's twin (the norms, the gated norm, the attention's
    combine, the down's staging) is the twin of the pairs it wrote, checked after each producer runs."""
    from engine.config import ModelArgs
    from engine.gpu import weights as gpu_weights
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5 import random_weights
    from engine.gpu import launch as K
    from engine.synthetic import TINY_CUDA

    def flat(ops):
        return [o for op in ops for o in (flat(op.main + op.side) if isinstance(op, K.Concurrent) else [op])]

    cfg = dict(TINY_CUDA, mtp_num_hidden_layers=1)
    args = ModelArgs.from_config(cfg)
    eng = build_engine(args, gpu_weights.from_logical(args, random_weights(args, seed=7, mtp=True)), cfg,
                       max_context=256, prefill_gemm=0)
    eng.prefill([11, 305, 7, 42, 999, 3])
    v = eng.speculator(3).verify
    c = v.ctx
    pairs = {"residual_rmsnorm": (c.xh_n, c.xpk_n), "gated_rmsnorm_stage": (c.xh_att, c.xpk_att),
             "attn_combine_stage": (c.xh_att, c.xpk_att), "stage_x_amax": (c.xh_act, c.xpk_act)}
    seen = set()
    for op in flat(v.ops):
        op()
        name = getattr(op, "name", "")
        key = next((p for p in pairs if name.startswith(p)), None)
        if key is not None:
            cp.cuda.Device().synchronize()
            xh, pk = pairs[key]
            assert np.array_equal(pk.get(), twin_of(xh.get())), name
            seen.add(key)
    assert seen == set(pairs)
    assert any(getattr(getattr(op, "__self__", None), "packed", False) for op in flat(v.ops))
