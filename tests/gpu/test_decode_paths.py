"""Two decode paths of the CUDA engine compared over a prompt and 40 teacher-forced steps (the logits after
each): a kernel form against the one it replaces, bit for bit where the arithmetic is the same, else close
(`assert_close_runs`)."""
import numpy as np
import pytest

from engine.synthetic import TINY_CUDA as CFG
from test_gpu_engine import quantized_weights  # noqa: E402  (tests/gpu is on sys.path under pytest)

pytestmark = pytest.mark.gpu


def forced_case(cfg, seed):
    """A quantized model of `cfg` for the path comparisons: (args, weights, a 150-token prompt, 40 forced tokens)."""
    from engine import gpu_weights
    from engine.config import ModelArgs

    args = ModelArgs.from_config(cfg)
    w = gpu_weights.from_logical(args, quantized_weights(args))
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, cfg["vocab_size"], 150)]
    forced = [int(t) for t in rng.integers(0, cfg["vocab_size"], 40)]
    return args, w, prompt, forced


def forced_logits(eng, prompt, forced):
    """The logits after `prompt` (prefilled) and after each of the teacher-forced tokens."""
    return [np.asarray(eng.prefill(prompt)).copy()] + [np.asarray(eng.decode_step(t)).copy() for t in forced]


def engine_with_o_on_pre2(eng):
    """`eng` with every o-projection on gemv_rs_pre (the 27B table's choice for its GDN out: where the gated norm's
    chunk scales and the fused o-projection apply), re-planned and captured; (eng, its ops' kernel names)."""
    ex = eng.model.executor
    ex.gemv_cfg = {**ex.gemv_cfg, **{(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}}
    ex.ops = ex._plan()
    ex.capture()
    eng.reset()
    return eng, [getattr(getattr(getattr(op, "__self__", None), "_go", op), "name", "") for op in ex.ops]


def assert_close_runs(got, want):
    """Two kernel paths' teacher-forced logits: rel-L2 under 2e-2 at every step, the same greedy choice at all
    but two."""
    errs = [float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in zip(got, want)]
    assert max(errs) < 2e-2, max(errs)
    agree = sum(int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(got, want))
    assert agree >= len(errs) - 2, agree


def test_attention_on_tensor_cores_matches_the_split_kernel(monkeypatch):
    """NINFER_ATTN_MMA=1 (attn_decode_mma<6, false, W, NS>: bf16 Q, K, P, V into fp32 MMAs) on a model with the 27B's
    grouping: the logits after a 150-token prefill and over 40 teacher-forced steps close to
    attn_decode_split's (fp32 dots), and the same greedy choices there."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w, prompt, forced = forced_case(cfg, 10)
    out = {}
    for mma in (False, True):
        monkeypatch.setattr(CudaQwen35, "ATTN_MMA", mma)
        eng = build_engine(args, w, cfg, max_context=512, prefill_cols=1)
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert any(n.startswith("attn_decode_mma<6,false,") for n in names) == mma
        out[mma] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[True], out[False])


@pytest.mark.parametrize("mma", [False, True])
def test_attn_combine_chunks_matches_the_one_scale_staging(monkeypatch, mma):
    """NINFER_ATTN_CHUNK=1 (attn_combine_chunks: the combine over the splits that hold tokens, each 32-value chunk of
    its output staged with its own scale) on a model with the 27B's grouping, attn_decode_split's and attn_decode_mma's
    split sizes (round 1 / 16): the logits after a 150-token prefill and over 40 teacher-forced steps close to
    attn_combine_stage's, the same greedy choices there; with the o-projection inside the fused MLP and as its own
    GEMV; attn_combine_chunks_b's (ATTN_COMBINE_B) bit-identical to attn_combine_chunks'."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w, prompt, forced = forced_case(cfg, 21)
    monkeypatch.setattr(CudaQwen35, "ATTN_MMA", mma)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    out = {}
    for chunk, fo, b in ((0, 1, 0), (1, 1, 0), (1, 0, 0), (1, 1, 1)):
        monkeypatch.setattr(CudaQwen35, "ATTN_CHUNK", chunk)
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O", fo)
        monkeypatch.setattr(CudaQwen35, "ATTN_COMBINE_B", b)
        eng, names = engine_with_o_on_pre2(build_engine(args, w, cfg, max_context=512, prefill_cols=1))
        combine = "attn_combine_chunks_b" if b else "attn_combine_chunks"
        assert (combine in names) == bool(chunk) and ("attn_combine_stage" in names) != bool(chunk)
        out[chunk, fo, b] = forced_logits(eng, prompt, forced)
    for key in ((1, 1, 0), (1, 0, 0)):
        assert_close_runs(out[key], out[0, 1, 0])
    # ATTN_COMBINE_B (attn_combine_chunks_b: the same combine with its loads batched): the same bits
    assert all(np.array_equal(a, b) for a, b in zip(out[1, 1, 1], out[1, 1, 0]))


def test_attention_raw_k_matches_the_decoded_k(monkeypatch):
    """NINFER_ATTN_KRAW=1 (int8 KV: K's codes into the MMAs, the group scales on the scores) on a model with the
    27B's grouping: the logits after a 150-token prefill and over 40 teacher-forced steps close to
    attn_decode_mma's decoded-K form (which rounds code x scale to fp16), and the same greedy choices there."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w, prompt, forced = forced_case(cfg, 11)
    out = {}
    # (and V's codes into the MMAs: NINFER_ATTN_VRAW; the transposed form: NINFER_ATTN_TR, one and three blocks an SM)
    for kraw, vraw, tr in ((False, 0, 0), (True, 0, 0), (True, 1, 0), (True, 0, 1), (True, 0, 5)):
        monkeypatch.setattr(CudaQwen35, "ATTN_KRAW", kraw)
        monkeypatch.setattr(CudaQwen35, "ATTN_VRAW", vraw)
        monkeypatch.setattr(CudaQwen35, "ATTN_TR", tr)
        eng = build_engine(args, w, cfg, max_context=512, prefill_cols=1, kv="int8")
        names = {getattr(op, "name", "") for op in eng.model.executor.ops}
        assert (K.attn_mma_kraw_name(6, CudaQwen35.ATTN_KRAW_FORM) in names) == (kraw and not vraw and not tr)
        assert (K.attn_mma_vraw_name(6, 0) in names) == bool(vraw)
        assert (tr == 0) or K.attn_mma_t_name(6, tr - 1) in names
        out[(kraw, vraw, tr)] = forced_logits(eng, prompt, forced)
    for key in ((True, 0, 0), (True, 1, 0), (True, 0, 1), (True, 0, 5)):
        assert_close_runs(out[key], out[(False, 0, 0)])


def test_mlp_tma_matches_the_four_kernels(monkeypatch):
    """NINFER_MLP_TMA=1 (sm_90: the post-attention norm inside gate|up's gemv_tma, the down-projection's staging
    inside its own): the logits after a 150-token prompt and over 40 teacher-forced steps close to the norm, gate|up,
    stage_x_amax and down kernels', and the same greedy choices there."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    if not (K.tma_capable() and K.XI16):
        pytest.skip("gemv_tma needs sm_90 and int16 x pairs")
    args, w, prompt, forced = forced_case(CFG, 12)
    out = {}
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED", 0)  # (mlp_fused comes first where both are on)
    for mode in (0, 1, 2):  # (2: the down-projection alone on gemv_tma)
        monkeypatch.setattr(CudaQwen35, "MLP_TMA", mode)
        eng = build_engine(args, w, CFG, max_context=512, prefill_cols=1)
        names = [getattr(getattr(getattr(op, "__self__", None), "_go", op), "name", "") for op in eng.model.executor.ops]
        assert sum(n.startswith("gemv_tma<") for n in names) == (0, 2, 1)[mode] * args.num_hidden_layers
        out[mode] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[1], out[0])
    assert_close_runs(out[2], out[0])


def test_mlp_fused_matches_the_four_kernels(monkeypatch):
    """NINFER_MLP_FUSED=1 (the post-attention norm and the dense MLP in one persistent mlp_fused launch a layer): the
    same logits, bit for bit, as the norm, gate|up, stage_x_amax and down kernels, after a 150-token prompt and over
    40 teacher-forced steps; with every block staging the down's input (MLP_FUSED_LOCAL) or a slice each; with a scale
    a 32-value chunk of the down's input (MLP_FUSED_CHUNK) close to them."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    if not K.XI16:
        pytest.skip("mlp_fused reads int16 pairs")
    args, w, prompt, forced = forced_case(CFG, 13)
    out = {}
    n = args.num_hidden_layers
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_CHUNK", 0)  # (one scale for the down's input: the four kernels' bits)
    monkeypatch.setattr(CudaQwen35, "NORM_CLUSTER", False)  # (mlp_fused's norm has the mb forms' sum order)
    for mode in (0, 1, 2):  # (1: local staging, 2: a slice a block between two barriers)
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED", min(mode, 1))
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_LOCAL", int(mode == 1))
        eng = build_engine(args, w, CFG, max_context=512, prefill_cols=1)
        names = [getattr(getattr(getattr(op, "__self__", None), "_go", op), "name", "") for op in eng.model.executor.ops]
        assert sum(n_.startswith("mlp_fused<") for n_ in names) == min(mode, 1) * n
        assert sum(n_.startswith("residual_rmsnorm") for n_ in names) == (2 * n + 1 if mode == 0 else n + 1)
        out[mode] = forced_logits(eng, prompt, forced)
    for mode in (1, 2):
        assert all(np.array_equal(a, b) for a, b in zip(out[mode], out[0])), mode
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED", 1)
    monkeypatch.setattr(CudaQwen35, "MLP_FUSED_CHUNK", 1)  # (a scale a 32-value chunk of the down's input)
    for helped in (0, 1):  # (1: the leftover chunks computed in slices by every warp)
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_HELP", helped)
        eng = build_engine(args, w, CFG, max_context=512, prefill_cols=1)
        assert (getattr(eng.model.executor, "mlp_help", None) is not None) == bool(helped)
        assert_close_runs(forced_logits(eng, prompt, forced), out[0])


def test_gated_chunk_matches_the_one_scale_staging(monkeypatch):
    """NINFER_GATED_CHUNK=1 (the GDN gated norm stages the o-projection's input a 32-value chunk at a time, the
    o-projection's gemv_rs_pre multiplies the scales in): the logits after a 150-token prompt and over 40
    teacher-forced steps close to gated_rmsnorm_stage's, the same greedy choices there (the o-projections on
    gemv_rs_pre both ways)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w, prompt, forced = forced_case(CFG, 15)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", 0)  # (the chunk staging inside the delta rule's launch: its own test)
    out = {}
    for on in (0, 1):
        monkeypatch.setattr(CudaQwen35, "GATED_CHUNK", on)
        eng, names = engine_with_o_on_pre2(build_engine(args, w, CFG, max_context=512, prefill_cols=1))
        assert ("gated_rmsnorm_chunks" in names) == bool(on)
        out[on] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[1], out[0])


def gdn_cl_case(monkeypatch):
    """forced_case(CFG, 15) on the paths gdn_delta_gated_cl takes (GDN_FUSED off, GATED_CHUNK 1, GDN_DELTA_RW 4);
    skipped where thread block clusters are missing."""
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    if not K.cluster_capable():
        pytest.skip("thread block clusters: sm_90")
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "GATED_CHUNK", 1)
    monkeypatch.setattr(CudaQwen35, "GDN_DELTA_RW", 4)
    return forced_case(CFG, 15)


def test_gdn_gated_cl_gives_the_same_logits(monkeypatch):
    """NINFER_GDN_GATED_CL (gdn_delta_gated_cl: the delta rule and the gated norm's chunk staging in one launch, a
    cluster of 4 blocks a value head): the same logits bit for bit as gdn_delta_raw_rw<4> + gated_rmsnorm_chunks after a 150-token prompt and over 40
    teacher-forced steps (the o-projections on gemv_rs_pre)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w, prompt, forced = gdn_cl_case(monkeypatch)
    monkeypatch.setattr(CudaQwen35, "GDN_AB_IN", 0)  # (the a|b projection by its GEMV both ways: GDN_AB_IN's own test)
    out = {}
    for cl in (False, True):
        monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", cl)
        eng, names = engine_with_o_on_pre2(build_engine(args, w, CFG, max_context=512, prefill_cols=1))
        assert ("gdn_delta_gated_cl" in names) == cl and ("gated_rmsnorm_chunks" in names) != cl
        out[cl] = forced_logits(eng, prompt, forced)
    assert all(np.array_equal(a, b) for a, b in zip(out[True], out[False]))


def test_gdn_ab_in_gives_close_logits(monkeypatch):
    """NINFER_GDN_AB_IN=1 (each head's a and b projections inside gdn_delta_gated_cl, no a|b GEMV, branch or join):
    the logits after a 150-token prompt and over 40 teacher-forced steps close to the a|b GEMV's, the same greedy
    choices (the sums in gemv_bf16's order; bit-identity is not promised)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35

    args, w, prompt, forced = gdn_cl_case(monkeypatch)
    monkeypatch.setattr(CudaQwen35, "GDN_GATED_CL", True)
    out = {}
    for on in (0, 1):
        monkeypatch.setattr(CudaQwen35, "GDN_AB_IN", on)
        eng, names = engine_with_o_on_pre2(build_engine(args, w, CFG, max_context=512, prefill_cols=1))
        assert "gdn_delta_gated_cl" in names
        out[on] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[1], out[0])


def test_gemv_pair_gives_the_same_logits(monkeypatch):
    """NINFER_GEMV_PAIR=1 (gemv_rs_pre_pair: the GDN v|z and q|k projections with their conv epilogue, and the
    attention gate|v and q|k, each pair as one grid; the 27B's rows a warp, all on gemv_rs_pre): the same logits bit for
    bit as the two launches a pair after a 150-token prompt and over 40 teacher-forced steps."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    args, w, prompt, forced = forced_case(CFG, 17)
    out = {}
    for on in (False, True):
        monkeypatch.setattr(CudaQwen35, "GEMV_PAIR", on)
        eng = build_engine(args, w, CFG, max_context=512, prefill_cols=1)
        ex = eng.model.executor
        rows = {"vz": 1, "qk": 2, "gv": 2}
        ex.gemv_cfg = {**ex.gemv_cfg, **{(L[k].fmt, L[k].n, L[k].k): {"pre2": True, "rows": r} for L in ex.layers
                                         for k, r in rows.items() if k in L}}
        eng, _ = engine_with_o_on_pre2(eng)
        ops = [o for op in ex.ops for o in (op.main + op.side if isinstance(op, K.Concurrent) else [op])]
        pairs = [op for op in ops if getattr(op, "name", "").startswith("gemv_rs_pre_pair<")]
        assert len(pairs) == (len(ex.layers) if on else 0)
        out[on] = forced_logits(eng, prompt, forced)
    assert all(np.array_equal(a, b) for a, b in zip(out[True], out[False]))


def test_mlp_fused_o_matches_the_separate_o_projection(monkeypatch):
    """NINFER_MLP_FUSED_O=1 (a GDN layer's o-projection inside its mlp_fused launch, from the gated norm's chunk-scaled
    pairs, before a grid barrier and the norm): the logits after a 150-token prompt and over 40 teacher-forced steps
    close to the separate o-projection GEMV's, the same greedy choices there (both with chunk-scaled o inputs)."""
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5_cuda import CudaQwen35
    from engine.ops import kernels as K

    if not K.XI16:
        pytest.skip("mlp_fused reads int16 pairs")
    args, w, prompt, forced = forced_case(CFG, 16)
    monkeypatch.setattr(CudaQwen35, "GDN_FUSED", False)
    monkeypatch.setattr(CudaQwen35, "GATED_CHUNK", 1)
    monkeypatch.setattr(CudaQwen35, "ATTN_CHUNK", 0)  # (the attention layers' o inside by chunk scales: its own test)
    out = {}
    # (xw: MLP_FUSED_XW, the norm's x and weight before the o barrier; then the o loads in flight, MLP_FUSED_OU = 3;
    # then the attention layers' o-projection inside too, MLP_FUSED_O_ATTN)
    for on, xw in ((0, 0), (1, 0), (1, 1), (1, 3), (1, 4)):
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O", on)
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_XW", int(xw > 0))
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_OU", 3 if xw == 3 else 2)
        monkeypatch.setattr(CudaQwen35, "MLP_FUSED_O_ATTN", int(xw == 4))
        eng, names = engine_with_o_on_pre2(build_engine(args, w, CFG, max_context=512, prefill_cols=1))
        ex = eng.model.executor
        gdn = sum(L["kind"] != "full_attention" for L in ex.layers)
        sfx = {0: ",true,true>", 1: ",true,true,true>", 3: ",true,true,true,3>", 4: ",true,true,true>"}[xw]
        want = len(ex.layers) if xw == 4 else gdn if on else 0
        assert gdn > 0 and sum(n.endswith(sfx) for n in names) == want
        out[on, xw] = forced_logits(eng, prompt, forced)
    for xw in (0, 1, 4):
        assert_close_runs(out[1, xw], out[0, 0])
    assert all(np.array_equal(a, b) for a, b in zip(out[1, 3], out[1, 1]))  # (the same sums in the same order)
