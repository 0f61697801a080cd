"""Two decode paths of the CUDA engine compared over a prompt and 40 teacher-forced steps (the logits after
each): a kernel form against the one it replaces, bit for bit where the arithmetic is the same, else close
(`assert_close_runs`)."""
import numpy as np
import pytest

from engine.synthetic import TINY_CUDA as CFG
from kernel_checks import tuned_gpu, use_plan  # noqa: E402  (tests/gpu is on sys.path under pytest)
from test_gpu_engine import quantized_weights  # noqa: E402

pytestmark = pytest.mark.gpu


def forced_case(cfg, seed):
    """A quantized model of `cfg` for the path comparisons: (args, weights, a 150-token prompt, 40 forced tokens)."""
    from engine.gpu import weights as gpu_weights
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
    ex.ctx.gemv_cfg = {**ex.ctx.gemv_cfg, **{(L["o"].fmt, L["o"].n, L["o"].k): {"pre2": True} for L in ex.layers}}
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


def names_of(ex):
    """The kernel names of an executor's graph ops (Concurrent ones opened)."""
    from engine.gpu import launch as K

    ops = [o for op in ex.ops for o in (op.main + op.side if isinstance(op, K.Concurrent) else [op])]
    return [getattr(getattr(getattr(op, "__self__", None), "_go", op), "name", "") for op in ops]


def step_names(eng, o_pre2: bool):
    """(eng, its step's kernel names), the o-projections moved onto gemv_rs_pre first where `o_pre2`."""
    return engine_with_o_on_pre2(eng) if o_pre2 else (eng, names_of(eng.model.executor))


def test_attention_on_tensor_cores_matches_the_split_kernel(monkeypatch):
    """The plan's attn_decode_mma<6, false, W, NS> (bf16 Q, K, P, V into fp32 MMAs) on a model with the 27B's grouping:
    the logits after a 150-token prefill and over 40 teacher-forced steps close to attn_decode_split's (fp32 dots; the
    plan overridden), and the same greedy choices there."""
    from engine.gpu_engine import build_engine

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w, prompt, forced = forced_case(cfg, 10)
    out = {}
    for mma in (False, True):
        use_plan(monkeypatch, **({} if mma else dict(attn="attn_decode_split<3,false,2>")))
        eng = build_engine(args, w, cfg, max_context=512, prefill_cols=1)
        assert any(n.startswith("attn_decode_mma<6,false,") for n in names_of(eng.model.executor)) == mma
        out[mma] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[True], out[False])


@pytest.mark.parametrize("mma", [False, True])
def test_attn_combine_chunks_matches_the_one_scale_staging(monkeypatch, mma):
    """attn_combine_chunks_b (the combine over the splits that hold tokens, each 32-value chunk of its output staged
    with its own scale, where the o-projection takes chunk scales) on a model with the 27B's grouping,
    attn_decode_split's and attn_decode_mma's split sizes (round 1 / 16): the logits after a 150-token prefill and
    over 40 teacher-forced steps close to attn_combine_stage's (the o-projection on gemv_rs, one scale a row), the
    same greedy choices there; with the o-projection inside the fused MLP and as its own GEMV."""
    from engine.gpu_engine import build_engine

    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w, prompt, forced = forced_case(cfg, 21)
    split = {} if mma else dict(attn="attn_decode_split<3,false,2>")
    out = {}
    for chunk, fused in ((0, True), (1, True), (1, False)):
        use_plan(monkeypatch, **split, **({} if fused else {"mlp_fused": False}))
        eng, names = step_names(build_engine(args, w, cfg, max_context=512, prefill_cols=1), o_pre2=bool(chunk))
        assert ("attn_combine_chunks_b" in names) == bool(chunk) and ("attn_combine_stage" in names) != bool(chunk)
        out[chunk, fused] = forced_logits(eng, prompt, forced)
    for key in ((1, True), (1, False)):
        assert_close_runs(out[key], out[0, True])


def test_attention_raw_kv_matches_the_decoded_kv(monkeypatch):
    """int8 KV on the sm_90 plan (attn_decode_mma<6, true, 8, 2, true, true>: K's and V's codes into the MMAs, the
    group scales on the scores and P) on a model with the 27B's grouping: the logits after a 150-token prefill and
    over 40 teacher-forced steps close to the decoded form's (the A100 class's attn_decode_mma<6, true, 4, 2>, which
    rounds code x scale to fp16), and the same greedy choices there."""
    from engine.gpu_engine import build_engine
    from engine.gpu import launch as K

    if K.smem_optin() < K.attn_mma_smem(True, 4, 4):
        pytest.skip("the raw-code form takes the sm_90 class's shared memory")
    cfg = dict(CFG, num_attention_heads=12, num_key_value_heads=2)
    args, w, prompt, forced = forced_case(cfg, 11)
    out = {}
    for raw in (False, True):
        use_plan(monkeypatch, "sm_90", **({} if raw else dict(attn="attn_decode_mma<6,true,4,2>")))
        eng = build_engine(args, w, cfg, max_context=512, prefill_cols=1, kv="int8")
        assert (K.attn_mma_vraw_name(6) in names_of(eng.model.executor)) == raw
        out[raw] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[True], out[False])


def test_mlp_fused_matches_the_four_kernels(monkeypatch):
    """The plan's mlp_fused (the post-attention norm, gate|up, the down's chunk-scaled staging and down in one
    persistent launch, the attention layers' o-projection inside it): the logits after a 150-token prompt and over 40
    teacher-forced steps close to the norm, gate|up, stage_x_amax and down kernels' (mlp_fused off), the same greedy
    choices there."""
    from engine.gpu_engine import build_engine

    args, w, prompt, forced = forced_case(CFG, 13)
    n = args.num_hidden_layers
    out = {}
    for fused in (False, True):
        use_plan(monkeypatch, **({} if fused else {"mlp_fused": False}))
        eng = build_engine(args, w, CFG, max_context=512, prefill_cols=1)
        names = names_of(eng.model.executor)
        assert sum(n_.startswith("mlp_fused<") for n_ in names) == (n if fused else 0)
        assert sum(n_.startswith("residual_rmsnorm") for n_ in names) == (n + 1 if fused else 2 * n + 1)
        out[fused] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[True], out[False])


def test_gated_chunk_matches_the_one_scale_staging(monkeypatch):
    """The GDN gated norm staging the o-projection's input a 32-value chunk at a time (gated_rmsnorm_chunks, the
    o-projection's gemv_rs_pre multiplying the scales in; the generic plan's two launches): the logits after a
    150-token prompt and over 40 teacher-forced steps close to gated_rmsnorm_stage's (the o-projection on gemv_rs),
    the same greedy choices there."""
    from engine.gpu_engine import build_engine

    args, w, prompt, forced = forced_case(CFG, 15)
    use_plan(monkeypatch, "sm_86", mlp_fused=False)
    out = {}
    for on in (0, 1):
        eng, names = step_names(build_engine(args, w, CFG, max_context=512, prefill_cols=1), o_pre2=bool(on))
        assert ("gated_rmsnorm_chunks" in names) == bool(on) and ("gated_rmsnorm_stage" in names) != bool(on)
        out[on] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[1], out[0])


def test_gdn_gated_cl_gives_the_same_logits(monkeypatch):
    """The sm_90 plan's gdn_delta_gated_cl (the delta rule and the gated norm's chunk staging in one launch, a cluster
    of 4 blocks a value head): the same logits bit for bit as gdn_delta_raw_rw<4> + gated_rmsnorm_chunks (the plan's
    gdn overridden) after a 150-token prompt and over 40 teacher-forced steps (the o-projections on gemv_rs_pre, the
    a|b projection by its GEMV both ways)."""
    from engine.gpu_engine import build_engine

    if not tuned_gpu():
        pytest.skip("thread block clusters: sm_90")
    args, w, prompt, forced = forced_case(CFG, 15)
    out = {}
    for cl in (False, True):
        use_plan(monkeypatch, gdn_ab_in=False, **({} if cl else {"gdn": "gdn_delta_raw_rw<4>"}))
        eng, names = engine_with_o_on_pre2(build_engine(args, w, CFG, max_context=512, prefill_cols=1))
        assert ("gdn_delta_gated_cl" in names) == cl and ("gated_rmsnorm_chunks" in names) != cl
        out[cl] = forced_logits(eng, prompt, forced)
    assert all(np.array_equal(a, b) for a, b in zip(out[True], out[False]))


def test_gdn_ab_in_gives_close_logits(monkeypatch):
    """The plan's gdn_ab_in (each head's a and b projections inside gdn_delta_gated_cl, no a|b GEMV, branch or join):
    the logits after a 150-token prompt and over 40 teacher-forced steps close to the a|b GEMV's, the same greedy
    choices (the sums in gemv_bf16's order; bit-identity is not promised)."""
    from engine.gpu_engine import build_engine

    if not tuned_gpu():
        pytest.skip("thread block clusters: sm_90")
    args, w, prompt, forced = forced_case(CFG, 15)
    out = {}
    for on in (False, True):
        use_plan(monkeypatch, **({} if on else {"gdn_ab_in": False}))
        eng, names = engine_with_o_on_pre2(build_engine(args, w, CFG, max_context=512, prefill_cols=1))
        assert "gdn_delta_gated_cl" in names and eng.model.executor.plan.gdn_ab_in == on
        out[on] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[True], out[False])


def test_gemv_pair_gives_the_same_logits(monkeypatch):
    """The plan's gemv_pair (gemv_rs_pre_pair: the GDN v|z and q|k projections with their conv epilogue, and the
    attention gate|v and q|k, each pair as one grid; the 27B's rows a warp, all on gemv_rs_pre): the same logits bit
    for bit as the two launches a pair after a 150-token prompt and over 40 teacher-forced steps."""
    from engine.gpu_engine import build_engine

    args, w, prompt, forced = forced_case(CFG, 17)
    out = {}
    for on in (False, True):
        use_plan(monkeypatch, gemv_pair=on)
        eng = build_engine(args, w, CFG, max_context=512, prefill_cols=1)
        ex = eng.model.executor
        rows = {"vz": 1, "qk": 2, "gv": 2}
        ex.ctx.gemv_cfg = {**ex.ctx.gemv_cfg, **{(L[k].fmt, L[k].n, L[k].k): {"pre2": True, "rows": r}
                                                 for L in ex.layers for k, r in rows.items() if k in L}}
        eng, names = engine_with_o_on_pre2(eng)
        pairs = [n for n in names_of(ex) if n.startswith("gemv_rs_pre_pair<")]
        assert len(pairs) == (len(ex.layers) if on else 0)
        out[on] = forced_logits(eng, prompt, forced)
    assert all(np.array_equal(a, b) for a, b in zip(out[True], out[False]))


def test_mlp_fused_o_matches_the_separate_o_projection(monkeypatch):
    """Every layer's o-projection inside its mlp_fused launch (the GDN layers' from the gated norm's chunk-scaled
    pairs, the attention layers' from the combine's), before a grid barrier and the norm: the logits after a 150-token
    prompt and over 40 teacher-forced steps close to the separate o-projection GEMVs' (mlp_fused off), the same greedy
    choices there."""
    from engine.gpu_engine import build_engine

    args, w, prompt, forced = forced_case(CFG, 16)
    out = {}
    for on in (False, True):
        use_plan(monkeypatch, **({} if on else {"mlp_fused": False}))
        eng, names = engine_with_o_on_pre2(build_engine(args, w, CFG, max_context=512, prefill_cols=1))
        ex = eng.model.executor
        assert sum(n.endswith(",true,true,true,3>") for n in names) == (len(ex.layers) if on else 0)
        out[on] = forced_logits(eng, prompt, forced)
    assert_close_runs(out[True], out[False])
