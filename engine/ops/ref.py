"""Reference ops: the spec every CUDA kernel is tested against (spec/model.md §1.2-1.6).

Every function takes NumPy or CuPy arrays and returns arrays of the same module; the math is float32
unless a docstring says otherwise. Nothing here imports cupy at module level.

Shape names: T tokens, S keys, H heads, D head dim, C conv channels, K conv taps,
Hk/Hv GDN key/value heads, Dk/Dv their dims, E experts.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
GDN_CHUNK = 64


def array_module(x):
    """numpy or cupy, whichever owns `x` (cupy is imported only when `x` is a cupy array)."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy  # noqa: PLC0415

        return cupy
    return np


def _f32(xp, x):
    return xp.asarray(x, dtype=F32)


def sigmoid(x):
    """Overflow-free logistic function."""
    xp = array_module(x)
    x = _f32(xp, x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(F32)


def softplus(x):
    """log(1 + exp(x)) without overflow."""
    xp = array_module(x)
    x = _f32(xp, x)
    return (xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))).astype(F32)


def silu(x):
    """x * sigmoid(x)."""
    xp = array_module(x)
    return (_f32(xp, x) * sigmoid(x)).astype(F32)


def swiglu(gate, up):
    """silu(gate) * up."""
    return silu(gate) * up


def softmax(x, axis=-1):
    """Numerically stable softmax in float32."""
    xp = array_module(x)
    x = _f32(xp, x)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def linear(x, w):
    """x[..., K] @ w[N, K].T -> [..., N] (no bias anywhere in the text model)."""
    xp = array_module(x)
    x, w = _f32(xp, x), _f32(xp, w)
    if x.ndim == 2 and x.shape[0] == 1:  # decode: BLAS gemv on row-major w reads it ~1.6x faster than gemm
        return (w @ x[0])[None]
    return x @ w.T


def rmsnorm(x, w, eps, offset=True):
    """x / sqrt(mean(x^2) + eps) * (1 + w) when `offset` (Qwen3.5 norms), else * w (plain)."""
    xp = array_module(x)
    x = _f32(xp, x)
    w = _f32(xp, w)
    y = x * (1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + F32(eps)))
    return y * (1.0 + w) if offset else y * w


def gated_rmsnorm(o, z, w, eps):
    """Plain rmsnorm(o, w) * silu(z): the GDN output norm, applied per value head ([..., Dv])."""
    return rmsnorm(o, w, eps, offset=False) * silu(z)


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis."""
    xp = array_module(x)
    x = _f32(xp, x)
    return x * (1.0 / xp.sqrt((x * x).sum(axis=-1, keepdims=True) + F32(eps)))


def mrope_axes(half: int, mrope_section=(11, 11, 10)) -> np.ndarray:
    """Position axis (0 temporal, 1 height, 2 width) of each rotary pair, interleaved as transformers
    does: pair i reads axis i % 3 while that axis has sections left, else axis 0."""
    axes = np.zeros(half, dtype=np.int64)
    for axis in (1, 2):
        idx = np.arange(axis, min(half, 3 * mrope_section[axis]), 3)
        axes[idx] = axis
    return axes


def rope(x, positions, rotary_dim, theta, mrope_section=(11, 11, 10)):
    """NeoX split-half rotation of the first `rotary_dim` dims of x[T, H, D]; the rest pass through.

    Pair i in [0, R/2) rotates (x[i], x[i + R/2]) by angle pos * theta^(-2i/R). positions is [T], or
    [3, T] (multimodal MRoPE: pair i uses the axis `mrope_axes` gives it). Angles are formed in
    float64 so large positions stay exact; cos/sin are then rounded to float32.
    """
    xp = array_module(x)
    x = _f32(xp, x)
    half = rotary_dim // 2
    inv_freq = 1.0 / (float(theta) ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    pos = np.asarray(positions.get() if hasattr(positions, "get") else positions, dtype=np.float64)
    if pos.ndim == 2:  # [3, T]: each pair picks its axis' position
        pos_pairs = pos[mrope_axes(half, mrope_section), :].T  # [T, half]
    else:
        pos_pairs = pos.reshape(-1)[:, None]
    ang = pos_pairs * inv_freq[None, :]  # [T, half]
    cos = xp.asarray(np.cos(ang).astype(F32))[:, None, :]
    sin = xp.asarray(np.sin(ang).astype(F32))[:, None, :]
    x1, x2 = x[..., :half], x[..., half:rotary_dim]
    out = x.copy()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rotary_dim] = x2 * cos + x1 * sin
    return out


def causal_conv1d_step(x, conv_state, w):
    """One decode step of the causal depthwise conv + SiLU.

    x[C] new input, conv_state[C, K-1] the previous K-1 inputs oldest -> newest, w[K, C] tap-major.
    Returns (y[C], new_state[C, K-1]); y = silu(sum_j w[j] * window[:, j]) with window = state | x.
    """
    xp = array_module(x)
    window = xp.concatenate([_f32(xp, conv_state), _f32(xp, x)[:, None]], axis=1)  # [C, K]
    y = silu((window * _f32(xp, w).T).sum(axis=1))
    return y, window[:, 1:].copy()


def causal_conv1d(x, conv_state, w):
    """Prefill form of `causal_conv1d_step`: x[T, C], conv_state[C, K-1] or None (zeros), w[K, C].

    Returns (y[T, C], new_state[C, K-1]); equal to T successive steps.
    """
    xp = array_module(x)
    x = _f32(xp, x)
    w = _f32(xp, w)
    n_taps, channels = w.shape
    if conv_state is None:
        conv_state = xp.zeros((channels, n_taps - 1), dtype=F32)
    full = xp.concatenate([_f32(xp, conv_state).T, x], axis=0)  # [K-1+T, C]
    t = x.shape[0]
    acc = xp.zeros((t, channels), dtype=F32)
    for j in range(n_taps):
        acc += w[j] * full[j : j + t]
    return silu(acc), xp.ascontiguousarray(full[t:].T)


def gdn_gates(a, b, a_log, dt_bias):
    """Decay and write strength of the delta rule, per value head.

    g = -exp(a_log) * softplus(a + dt_bias) (log-space decay, <= 0); beta = sigmoid(b).
    a, b: [..., Hv]; a_log, dt_bias: [Hv]. Returns (g, beta), float32.
    """
    xp = array_module(a)
    g = -xp.exp(_f32(xp, a_log)) * softplus(_f32(xp, a) + _f32(xp, dt_bias))
    return g.astype(F32), sigmoid(b)


_FLUSH = -60.0  # decays below e^-60 count as 0: under fp32 resolution, and denormals stall the CPU


def _decay(xp, log_decay):
    """exp(log_decay), with log decays below -60 flushed to exactly 0."""
    return xp.exp(xp.where(log_decay > _FLUSH, log_decay, F32(-np.inf))).astype(F32)


def _expand_heads(xp, x, hv):
    """[T, Hk, D] -> [Hv, T, D]: value head j reads key head j // (Hv / Hk) (grouped order)."""
    rep = hv // x.shape[1]
    x = _f32(xp, x).transpose(1, 0, 2)
    return xp.repeat(x, rep, axis=0) if rep > 1 else x


def gdn_recurrent(q, k, v, g, beta, state=None):
    """The gated delta rule, one token at a time.

    q, k: [T, Hk, Dk] already L2-normalized; v: [T, Hv, Dv]; g, beta: [T, Hv]; state: [Hv, Dv, Dk]
    (S[h][d_v][d_k]) or None for zeros. Per token and v head:
        S <- exp(g) S;  u = beta (v - S k);  S <- S + u k^T;  o = S q / sqrt(Dk).
    Returns (o[T, Hv, Dv], new_state); the input state is not modified. Decay factors below e^-60 are
    taken as 0 (below fp32 resolution; keeps the CPU out of denormal arithmetic).
    """
    xp = array_module(v)
    t, hv, dv = v.shape
    dk = k.shape[-1]
    qh, kh = _expand_heads(xp, q, hv), _expand_heads(xp, k, hv)
    vh = _f32(xp, v)
    g = _f32(xp, g)
    beta = _f32(xp, beta)
    s = xp.zeros((hv, dv, dk), dtype=F32) if state is None else _f32(xp, state).copy()
    out = xp.empty((t, hv, dv), dtype=F32)
    scale = F32(1.0 / np.sqrt(dk))
    for i in range(t):
        s *= _decay(xp, g[i])[:, None, None]
        kv = (s @ kh[:, i, :, None])[..., 0]  # [Hv, Dv]
        u = beta[i][:, None] * (vh[i] - kv)
        s += u[:, :, None] * kh[:, i, None, :]
        out[i] = (s @ qh[:, i, :, None])[..., 0] * scale
    return out, s


def gdn_chunked(q, k, v, g, beta, state=None, chunk=GDN_CHUNK):
    """Same contract and result as `gdn_recurrent`, computed chunk by chunk (WY/UT form).

    Inside a chunk with cumulative log decay G (G_t = sum_{s<=t} g_s) and start state S0:
        (I + A) U = beta V - beta e^G (K S0^T),   A[t, s] = beta_t e^{G_t - G_s} k_t.k_s (s < t)
        O = (e^G Q S0^T + (M * Q K^T) U) / sqrt(Dk),  M[t, s] = e^{G_t - G_s} (s <= t)
        S1 = e^{G_L} S0 + U^T (e^{G_L - G} K)
    """
    xp = array_module(v)
    t, hv, dv = v.shape
    dk = k.shape[-1]
    qh, kh = _expand_heads(xp, q, hv), _expand_heads(xp, k, hv)  # [Hv, T, Dk]
    vh = _f32(xp, v).transpose(1, 0, 2)  # [Hv, T, Dv]
    gh = _f32(xp, g).T  # [Hv, T]
    bh = _f32(xp, beta).T
    s = xp.zeros((hv, dv, dk), dtype=F32) if state is None else _f32(xp, state).copy()
    out = xp.empty((hv, t, dv), dtype=F32)
    scale = F32(1.0 / np.sqrt(dk))
    for c0 in range(0, t, chunk):
        c1 = min(c0 + chunk, t)
        n = c1 - c0
        qc, kc, vc, bc = qh[:, c0:c1], kh[:, c0:c1], vh[:, c0:c1], bh[:, c0:c1]
        cum = xp.cumsum(gh[:, c0:c1], axis=1)  # [Hv, n]
        diff = cum[:, :, None] - cum[:, None, :]  # G_t - G_s
        lower = xp.tril(xp.ones((n, n), dtype=bool))
        decay = _decay(xp, xp.where(lower, diff, F32(-np.inf)))  # M, zero above the diagonal
        strict = xp.tril(xp.ones((n, n), dtype=bool), -1)
        a = xp.where(strict, decay * (kc @ kc.transpose(0, 2, 1)), F32(0)) * bc[:, :, None]
        ks0 = kc @ s.transpose(0, 2, 1)  # [Hv, n, Dv] = S0 k_t
        eg = _decay(xp, cum)[:, :, None]
        rhs = bc[:, :, None] * (vc - eg * ks0)
        u = xp.linalg.solve(a + xp.eye(n, dtype=F32), rhs).astype(F32)
        o = eg * (qc @ s.transpose(0, 2, 1)) + (decay * (qc @ kc.transpose(0, 2, 1))) @ u
        out[:, c0:c1] = o * scale
        tail = _decay(xp, cum[:, -1:] - cum)[:, :, None]  # e^{G_L - G_s}
        s = _decay(xp, cum[:, -1])[:, None, None] * s + u.transpose(0, 2, 1) @ (tail * kc)
    return out.transpose(1, 0, 2).copy(), s.astype(F32)


def attention(q, k, v, scale, q_start=0):
    """Causal grouped-query attention.

    q[T, Hq, D]; k, v[S, Hkv, D] hold positions 0..S-1; query t sits at position q_start + t and sees
    keys s <= q_start + t. Query head h reads kv head h // (Hq / Hkv). Returns [T, Hq, D] float32.
    """
    xp = array_module(q)
    t, hq, d = q.shape
    s_len, hkv, _ = k.shape
    grp = hq // hkv
    qg = _f32(xp, q).reshape(t, hkv, grp, d).transpose(1, 2, 0, 3).reshape(hkv, grp * t, d)
    kk = _f32(xp, k).transpose(1, 2, 0)  # [Hkv, D, S]
    vv = _f32(xp, v).transpose(1, 0, 2)  # [Hkv, S, Dv]
    scores = (qg @ kk).reshape(hkv, grp, t, s_len) * F32(scale)
    visible = xp.arange(s_len)[None, :] <= (q_start + xp.arange(t))[:, None]  # [T, S]
    scores = xp.where(visible, scores, F32(-np.inf))
    p = softmax(scores, axis=-1).reshape(hkv, grp * t, s_len)
    o = (p @ vv).reshape(hkv, grp, t, -1)
    return xp.ascontiguousarray(o.transpose(2, 0, 1, 3).reshape(t, hq, -1))


def moe_route(router_logits, top_k):
    """Softmax over all experts, keep the top_k (lower id first on ties), renormalize to sum 1.

    router_logits[..., E] -> (idx[..., top_k] int64, weights[..., top_k] float32), idx in descending weight.
    """
    xp = array_module(router_logits)
    p = softmax(router_logits, axis=-1)
    idx = xp.argsort(-p, axis=-1, kind="stable")[..., :top_k]
    w = xp.take_along_axis(p, idx, axis=-1)
    return idx.astype(np.int64), (w / w.sum(axis=-1, keepdims=True)).astype(F32)
