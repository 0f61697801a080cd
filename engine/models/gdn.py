"""Gated DeltaNet mixer of Qwen3.5 (spec/model.md §1.4) on NumPy or CuPy arrays."""
from __future__ import annotations

import numpy as np

from engine.cache import GDNState
from engine.config import ModelArgs
from engine.models.replay_ssm import GDNRecord
from engine.ops import ref


class GatedDeltaNet:
    """in-projections -> causal conv + SiLU -> L2 q/k -> gates -> delta rule -> gated RMSNorm -> out.

    Weights (logical names under `<block>gdn/`): query/key [Hk*Dk, H], value/z [Hv*Dv, H],
    a_projection/b_projection [Hv, H], a_log/dt_bias [Hv], convolution [K, C], norm [Dv], output [H, Hv*Dv].
    `mode` picks the delta-rule form for T > 1: "chunked" (default) or "recurrent"; T == 1 is always recurrent.
    """

    def __init__(self, args: ModelArgs, weights, prefix: str, xp=np, mode: str = "chunked"):
        self.args, self.xp, self.mode = args, xp, mode
        f32 = lambda name: xp.ascontiguousarray(xp.asarray(weights[prefix + name], dtype=np.float32))  # noqa: E731
        self.hk, self.dk = args.linear_num_key_heads, args.linear_key_head_dim
        self.hv, self.dv = args.linear_num_value_heads, args.linear_value_head_dim
        # One fused in-projection: a decode step then costs one matmul instead of six.
        parts = [f32(n) for n in ("query", "key", "value", "z", "a_projection", "b_projection")]
        self.splits = np.cumsum([p.shape[0] for p in parts])[:-1].tolist()
        self.w_in = xp.concatenate(parts, axis=0)
        self.conv = f32("convolution")
        self.a_log, self.dt_bias = f32("a_log"), f32("dt_bias")
        self.norm = f32("norm")
        self.w_out = f32("output")

    def arrays(self) -> list:
        return [self.w_in, self.conv, self.a_log, self.dt_bias, self.norm, self.w_out]

    def make_state(self) -> GDNState:
        """Zero conv history and recurrent state for one sequence."""
        return GDNState(self.conv.shape[1], self.conv.shape[0], self.hv, self.dv, self.dk, xp=self.xp)

    def __call__(self, h, state: GDNState | None):
        """h [T, H] (already input-normed) -> [T, H]; updates `state` in place when given (a GDNRecord
        instead keeps what engine.models.replay_ssm folds later)."""
        t = h.shape[0]
        qkv, z, a, b = self._project(h)
        if state is not None and t == 1:
            y, new_conv = ref.causal_conv1d_step(qkv[0], state.conv, self.conv)
            y = y[None]
        else:
            y, new_conv = ref.causal_conv1d(qkv, None if state is None else state.conv, self.conv)
        kd = self.hk * self.dk
        q = ref.l2norm(y[:, :kd].reshape(t, self.hk, self.dk))
        k_raw = y[:, kd : 2 * kd].reshape(t, self.hk, self.dk)
        k = ref.l2norm(k_raw)
        v = y[:, 2 * kd :].reshape(t, self.hv, self.dv)
        g, beta = ref.gdn_gates(a, b, self.a_log, self.dt_bias)
        s0 = None if state is None else state.recurrent
        rule = ref.gdn_recurrent if (t == 1 or self.mode == "recurrent") else ref.gdn_chunked
        o, s1 = rule(q, k, v, g, beta, s0)
        if isinstance(state, GDNRecord):  # speculative verify: the committed state stays; a fold replays these
            state.record(qkv, k_raw, v, g, beta)
        elif state is not None:
            state.conv[...] = new_conv
            state.recurrent[...] = s1
        on = ref.gated_rmsnorm(o, z.reshape(t, self.hv, self.dv), self.norm, self.args.rms_norm_eps)
        return ref.linear(on.reshape(t, -1), self.w_out)

    def _project(self, h):
        out = ref.linear(h, self.w_in)
        c, zend, aend = self.splits[2], self.splits[3], self.splits[4]
        return out[:, :c], out[:, c:zend], out[:, zend:aend], out[:, aend:]
