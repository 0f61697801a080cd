"""Qwen3.5 decoder blocks: gated attention, dense SwiGLU, sparse MoE, and the layer that joins them.

Each block takes its weights by logical name at construction (fusing matrices that read the same input),
lists what it holds in `arrays()`, and runs on NumPy or CuPy arrays through `engine.ops.ref`.
"""
from __future__ import annotations

import numpy as np

from engine.cache import KVCache
from engine.config import LINEAR, ModelArgs
from engine.models.gdn import GatedDeltaNet
from engine.ops import ref


class GatedAttention:
    """Full attention with (1+w) q/k norms, partial NeoX RoPE, GQA and a sigmoid output gate (§1.3)."""

    def __init__(self, args: ModelArgs, weights, prefix: str, xp=np):
        self.args, self.xp = args, xp
        f32 = lambda n: xp.ascontiguousarray(xp.asarray(weights[prefix + n], dtype=np.float32))  # noqa: E731
        self.hq, self.hkv, self.hd = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        q = self.hq * self.hd
        kv = self.hkv * self.hd
        self.cuts = (q, 2 * q, 2 * q + kv)
        self.w_in = xp.concatenate([f32("query"), f32("gate"), f32("key"), f32("value")], axis=0)
        self.q_norm, self.k_norm = f32("query_norm"), f32("key_norm")
        self.w_out = f32("output")

    def make_state(self, max_len=None) -> KVCache:
        return KVCache(self.hkv, self.hd, max_len, xp=self.xp)

    def arrays(self) -> list:
        return [self.w_in, self.q_norm, self.k_norm, self.w_out]

    def __call__(self, h, kv: KVCache | None, pos0: int):
        """h [T, H] (input-normed) at positions pos0.. -> [T, H]; appends to `kv` when given."""
        t = h.shape[0]
        a = self.args
        out = ref.linear(h, self.w_in)
        c1, c2, c3 = self.cuts
        q = ref.rmsnorm(out[:, :c1].reshape(t, self.hq, self.hd), self.q_norm, a.rms_norm_eps)
        gate = out[:, c1:c2]
        k = ref.rmsnorm(out[:, c2:c3].reshape(t, self.hkv, self.hd), self.k_norm, a.rms_norm_eps)
        v = out[:, c3:].reshape(t, self.hkv, self.hd)
        pos = np.arange(pos0, pos0 + t)
        q = ref.rope(q, pos, a.rotary_dim, a.rope_theta)
        k = ref.rope(k, pos, a.rotary_dim, a.rope_theta)
        if kv is not None:
            k, v = kv.update(k, v)
        o = ref.attention(q, k, v, 1.0 / np.sqrt(self.hd), q_start=pos0 if kv is not None else 0)
        return ref.linear(o.reshape(t, -1) * ref.sigmoid(gate), self.w_out)


class DenseMLP:
    """down(silu(gate h) * up h) (§1.5)."""

    def __init__(self, weights, prefix: str, xp=np):
        f32 = lambda n: xp.asarray(weights[prefix + n], dtype=np.float32)  # noqa: E731
        gate = f32("gate")
        self.inter = gate.shape[0]
        self.w_gu = xp.ascontiguousarray(xp.concatenate([gate, f32("up")], axis=0))
        self.w_down = xp.ascontiguousarray(f32("down"))

    def arrays(self) -> list:
        return [self.w_gu, self.w_down]

    def unread_bytes(self) -> int:
        return 0

    def __call__(self, h):
        gu = ref.linear(h, self.w_gu)
        return ref.linear(ref.swiglu(gu[:, : self.inter], gu[:, self.inter :]), self.w_down)


class SparseMoE:
    """Softmax router, top-k renormalized experts, plus a shared expert behind a sigmoid score (§1.5)."""

    def __init__(self, args: ModelArgs, weights, prefix: str, xp=np):
        self.xp, self.top_k, self.n_exp = xp, args.num_experts_per_tok, args.num_experts
        f32 = lambda n: xp.asarray(weights[prefix + n], dtype=np.float32)  # noqa: E731
        sg = f32("shared/gate")
        self.shared_inter = sg.shape[0]
        # router | shared score | shared gate | shared up all read the same input: one matmul
        self.w_in = xp.ascontiguousarray(
            xp.concatenate([f32("router"), f32("shared_score").reshape(1, -1), sg, f32("shared/up")], axis=0)
        )
        self.w_shared_down = xp.ascontiguousarray(f32("shared/down"))
        gates = [f32(f"experts/{e}/gate") for e in range(self.n_exp)]
        self.inter = gates[0].shape[0]
        self.w_gu = xp.ascontiguousarray(
            xp.stack([xp.concatenate([g, f32(f"experts/{e}/up")], axis=0) for e, g in enumerate(gates)])
        )  # [E, 2I, H]
        self.w_down = xp.ascontiguousarray(xp.stack([f32(f"experts/{e}/down") for e in range(self.n_exp)]))

    def arrays(self) -> list:
        return [self.w_in, self.w_shared_down, self.w_gu, self.w_down]

    def unread_bytes(self) -> int:
        """Bytes of the routed experts a decoded token does not touch (all but top_k of E)."""
        return int((self.w_gu.nbytes + self.w_down.nbytes) * (1 - self.top_k / self.n_exp))

    def __call__(self, h):
        e, si = self.n_exp, self.shared_inter
        r = ref.linear(h, self.w_in)
        shared = ref.linear(ref.swiglu(r[:, e + 1 : e + 1 + si], r[:, e + 1 + si :]), self.w_shared_down)
        out = shared * ref.sigmoid(r[:, e : e + 1])
        idx, w = ref.moe_route(r[:, :e], self.top_k)  # [T, k]
        idx_host = idx.get() if hasattr(idx, "get") else idx
        for ex in np.unique(idx_host):
            tok, slot = np.nonzero(idx_host == ex)  # a token picks an expert at most once
            gu = ref.linear(h[tok], self.w_gu[ex])
            y = ref.linear(ref.swiglu(gu[:, : self.inter], gu[:, self.inter :]), self.w_down[ex])
            out[tok] += y * w[tok, slot][:, None]
        return out


class DecoderLayer:
    """x += mixer(norm(x)); x += ffn(norm(x)) with (1+w) RMSNorms (§1.2)."""

    def __init__(self, args: ModelArgs, weights, prefix: str, kind: str, xp=np, gdn_mode="chunked"):
        self.args, self.kind = args, kind
        f32 = lambda n: xp.asarray(weights[prefix + n], dtype=np.float32)  # noqa: E731
        self.in_norm, self.post_norm = f32("input_norm"), f32("post_attention_norm")
        if kind == LINEAR:
            self.mixer = GatedDeltaNet(args, weights, prefix + "gdn/", xp=xp, mode=gdn_mode)
        else:
            self.mixer = GatedAttention(args, weights, prefix + "attention/", xp=xp)
        self.ffn = SparseMoE(args, weights, prefix + "moe/", xp) if args.is_moe else DenseMLP(weights, prefix + "mlp/", xp)

    def make_state(self, max_len=None):
        return self.mixer.make_state() if self.kind == LINEAR else self.mixer.make_state(max_len)

    def arrays(self) -> list:
        """Every weight array this layer holds."""
        return [self.in_norm, self.post_norm, *self.mixer.arrays(), *self.ffn.arrays()]

    def __call__(self, x, state, pos0: int):
        eps = self.args.rms_norm_eps
        h = ref.rmsnorm(x, self.in_norm, eps)
        x = x + (self.mixer(h, state) if self.kind == LINEAR else self.mixer(h, state, pos0))
        return x + self.ffn(ref.rmsnorm(x, self.post_norm, eps))
