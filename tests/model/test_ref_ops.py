"""engine.ops.ref against plain float64 formulas written from spec/model.md, and chunked vs recurrent GDN."""
import numpy as np
import pytest

from engine.ops import ref
from tests.model.tolerance import check

rng = np.random.default_rng(1234)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_rmsnorm_offset_and_plain():
    x, w = randn(5, 16), randn(16)
    x64 = x.astype(np.float64)
    base = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6)
    check(ref.rmsnorm(x, w, 1e-6), base * (1 + w), "fp32_transcendental")
    check(ref.rmsnorm(x, w, 1e-6, offset=False), base * w, "fp32_transcendental")
    z = randn(5, 16)
    check(ref.gated_rmsnorm(x, z, w, 1e-6), base * w * z / (1 + np.exp(-z.astype(np.float64))), "fp32_transcendental")


def test_l2norm_and_activations():
    x = randn(3, 4, 8)
    x64 = x.astype(np.float64)
    check(ref.l2norm(x), x64 / np.sqrt((x64**2).sum(-1, keepdims=True) + 1e-6), "fp32_transcendental")
    big = np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0], np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        s = ref.silu(big)
    assert np.isfinite(s).all() and s[0] == 0 and s[-1] == 1000
    check(ref.softplus(big[1:4]), np.log1p(np.exp(big[1:4].astype(np.float64))), "fp32_transcendental")


@pytest.mark.parametrize("rotary_dim", [8, 16])
def test_rope_is_a_complex_rotation_of_pairs(rotary_dim):
    t, h, d, theta = 7, 3, 16, 1e7
    x, pos = randn(t, h, d), np.arange(100, 100 + t)
    half = rotary_dim // 2
    z = x[..., :half].astype(np.float64) + 1j * x[..., half:rotary_dim]
    phi = pos[:, None] * theta ** (-2.0 * np.arange(half) / rotary_dim)
    z = z * np.exp(1j * phi)[:, None, :]
    want = x.astype(np.float64).copy()
    want[..., :half], want[..., half:rotary_dim] = z.real, z.imag
    check(ref.rope(x, pos, rotary_dim, theta), want, "fp32_transcendental")


def test_causal_conv_prefill_equals_steps_and_formula():
    t, c, k = 9, 6, 4
    x, w, st0 = randn(t, c), randn(k, c), randn(c, k - 1)
    y, st = ref.causal_conv1d(x, st0, w)
    s = st0
    for i in range(t):
        yi, s = ref.causal_conv1d_step(x[i], s, w)
        check(yi, y[i], "fp32_transcendental")
    np.testing.assert_array_equal(s, st)
    np.testing.assert_array_equal(st, x[-(k - 1) :].T)
    full = np.concatenate([st0.T, x]).astype(np.float64)
    pre = np.stack([(w * full[i : i + k]).sum(0) for i in range(t)])
    check(y, pre / (1 + np.exp(-pre)), "fp32_transcendental")


def test_gdn_gates_formula():
    a, b, a_log, dt = randn(5, 4), randn(5, 4), randn(4), randn(4)
    g, beta = ref.gdn_gates(a, b, a_log, dt)
    sp = np.log1p(np.exp(a.astype(np.float64) + dt))
    check(g, -np.exp(a_log.astype(np.float64)) * sp, "gdn_control_fp32")
    check(beta, 1 / (1 + np.exp(-b.astype(np.float64))), "gdn_control_fp32")


def _gdn_inputs(t, hk=2, hv=6, dk=16, dv=8, state=True):
    q, k = ref.l2norm(randn(t, hk, dk)), ref.l2norm(randn(t, hk, dk))
    v = randn(t, hv, dv)
    g, beta = ref.gdn_gates(randn(t, hv), randn(t, hv), np.log(rng.uniform(1, 16, hv)).astype(np.float32), randn(hv))
    s0 = randn(hv, dv, dk) * 0.3 if state else None
    return q, k, v, g, beta, s0


def _gdn_plain(q, k, v, g, beta, s0):
    """The delta rule exactly as spec/model.md §1.4 writes it, per head, float64."""
    t, hv, dv = v.shape
    hk, dk = q.shape[1:]
    s = np.zeros((hv, dv, dk)) if s0 is None else s0.astype(np.float64).copy()
    o = np.zeros((t, hv, dv))
    for i in range(t):
        for j in range(hv):
            kk, qq = k[i, j // (hv // hk)].astype(np.float64), q[i, j // (hv // hk)].astype(np.float64)
            sbar = np.exp(g[i, j]) * s[j]
            u = beta[i, j] * (v[i, j] - sbar @ kk)
            s[j] = sbar + np.outer(u, kk)
            o[i, j] = s[j] @ qq / np.sqrt(dk)
    return o, s


def test_gdn_recurrent_matches_plain_formula():
    args = _gdn_inputs(20)
    o, s = ref.gdn_recurrent(*args)
    o64, s64 = _gdn_plain(*args)
    check(o, o64, "gdn_state_fp32")
    check(s, s64, "gdn_state_fp32")


@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "carried_state"])
def test_gdn_chunked_equals_recurrent(t, with_state):
    args = _gdn_inputs(t, state=with_state)
    o_r, s_r = ref.gdn_recurrent(*args)
    o_c, s_c = ref.gdn_chunked(*args)
    assert o_c.shape == (t, 6, 8) and s_c.shape == (6, 8, 16)
    check(o_c, o_r, "gdn_state_fp32")
    check(s_c, s_r, "gdn_state_fp32")
    if with_state:  # the input state is an input, not an output buffer
        assert not np.shares_memory(s_c, args[-1])


def test_gdn_chunked_strong_decay_and_full_write():
    """alpha -> 0 (state forgotten each step) and beta -> 1 stress the triangular solve."""
    t, hv = 130, 4
    q, k, v, _, _, s0 = _gdn_inputs(t, hk=2, hv=hv)
    g = np.full((t, hv), -30.0, np.float32)
    beta = np.ones((t, hv), np.float32)
    o_r, s_r = ref.gdn_recurrent(q, k, v, g, beta, s0)
    o_c, s_c = ref.gdn_chunked(q, k, v, g, beta, s0)
    check(o_c, o_r, "gdn_state_fp32")
    check(s_c, s_r, "gdn_state_fp32")


def _attention_plain(q, k, v, scale, q_start):
    t, hq, d = q.shape
    s, hkv, _ = k.shape
    out = np.zeros((t, hq, v.shape[-1]))
    for i in range(t):
        for h in range(hq):
            kv = h // (hq // hkv)
            n = q_start + i + 1
            sc = k[:n, kv].astype(np.float64) @ q[i, h] * scale
            p = np.exp(sc - sc.max())
            out[i, h] = (p / p.sum()) @ v[:n, kv]
    return out


@pytest.mark.parametrize("t,s,q_start", [(1, 1, 0), (1, 9, 8), (5, 5, 0), (4, 11, 7)])
def test_attention_causal_gqa(t, s, q_start):
    q, k, v = randn(t, 6, 16), randn(s, 2, 16), randn(s, 2, 16)
    check(ref.attention(q, k, v, 0.25, q_start), _attention_plain(q, k, v, 0.25, q_start), "fp32_transcendental")


def test_moe_route_topk_renormalized_ties_to_lower_id():
    logits = np.array([0.5, 2.0, 2.0, -1.0, 1.0, 2.0], np.float32)
    idx, w = ref.moe_route(logits, 3)
    assert idx.tolist() == [1, 2, 5]
    np.testing.assert_allclose(w, [1 / 3] * 3, rtol=1e-6)
    batch = randn(4, 10)
    idx, w = ref.moe_route(batch, 4)
    p = np.exp(batch - batch.max(-1, keepdims=True))
    for r in range(4):
        top = np.argsort(-p[r], kind="stable")[:4]
        assert idx[r].tolist() == top.tolist()
        check(w[r], p[r, top] / p[r, top].sum(), "fp32_transcendental")


def test_linear_and_swiglu():
    x, w, gate, up = randn(3, 8), randn(5, 8), randn(3, 5), randn(3, 5)
    check(ref.linear(x, w), x.astype(np.float64) @ w.T.astype(np.float64), "fp32_transcendental")
    g64 = gate.astype(np.float64)
    check(ref.swiglu(gate, up), g64 / (1 + np.exp(-g64)) * up, "fp32_transcendental")


def test_mrope_axes_interleave_eleven_eleven_ten():
    axes = ref.mrope_axes(32)
    assert np.bincount(axes).tolist() == [11, 11, 10]
    assert axes[:6].tolist() == [0, 1, 2, 0, 1, 2] and axes[30:].tolist() == [0, 1]


def test_mrope_equal_axes_is_plain_rope_and_axes_are_used():
    x, t = randn(5, 2, 64), np.arange(7, 12)
    same = np.stack([t, t, t])
    np.testing.assert_array_equal(ref.rope(x, same, 64, 1e7), ref.rope(x, t, 64, 1e7))
    pos3 = np.stack([t, t + 100, t + 200])
    got = ref.rope(x, pos3, 64, 1e7)
    axes = ref.mrope_axes(32)
    for i in (0, 1, 2, 31):  # pair i rotates by the position of its own axis
        phi = pos3[axes[i]] * 1e7 ** (-2.0 * i / 64)
        a, b = x[:, :, i].astype(np.float64), x[:, :, i + 32].astype(np.float64)
        check(got[:, :, i], a * np.cos(phi)[:, None] - b * np.sin(phi)[:, None], "fp32_transcendental")


@pytest.mark.parametrize("a_log", [2.0, -4.0], ids=["fast_decay", "slow_decay"])
def test_gdn_chunked_at_model_head_sizes(a_log):
    """Dk = Dv = 128 and 3 v-heads per k-head, as in the 27B, over five chunks."""
    t, hk, hv, d = 300, 2, 6, 128
    q, k = ref.l2norm(randn(t, hk, d)), ref.l2norm(randn(t, hk, d))
    v = randn(t, hv, d)
    g, beta = ref.gdn_gates(randn(t, hv), randn(t, hv), np.full(hv, a_log, np.float32), randn(hv))
    o_r, s_r = ref.gdn_recurrent(q, k, v, g, beta)
    o_c, s_c = ref.gdn_chunked(q, k, v, g, beta)
    check(o_c, o_r, "gdn_state_fp32")
    check(s_c, s_r, "gdn_state_fp32")
