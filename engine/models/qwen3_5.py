"""Qwen3.5 hybrid text model (dense and MoE) with its MTP head, on NumPy or CuPy arrays.

Contract (mlx-lm style): `ModelArgs`, `Model(args)`, `Model.load(weights)`, `Model.make_cache()`,
`Model(tokens, cache) -> logits [T, vocab]`. Weights are keyed by the logical names of
spec/container.md §2.3; `hf_to_logical` maps Hugging Face checkpoint tensors onto them (all
checkpoint quirks live there). Math: spec/model.md §1.2-1.6; where it and transformers differ,
transformers wins.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from engine.cache import Cache
from engine.config import LINEAR, ModelArgs
from engine.models.qwen3_5_blocks import DecoderLayer
from engine.ops import ref

__all__ = ["ModelArgs", "Model", "hf_to_logical"]


# ---------------------------------------------------------------------------------------------
# Hugging Face names -> logical names

_BLOCK_RENAMES = {
    "input_layernorm.weight": "input_norm",
    "post_attention_layernorm.weight": "post_attention_norm",
    "self_attn.k_proj.weight": "attention/key",
    "self_attn.v_proj.weight": "attention/value",
    "self_attn.o_proj.weight": "attention/output",
    "self_attn.q_norm.weight": "attention/query_norm",
    "self_attn.k_norm.weight": "attention/key_norm",
    "linear_attn.in_proj_z.weight": "gdn/z",
    "linear_attn.in_proj_a.weight": "gdn/a_projection",
    "linear_attn.in_proj_b.weight": "gdn/b_projection",
    "linear_attn.A_log": "gdn/a_log",
    "linear_attn.dt_bias": "gdn/dt_bias",
    "linear_attn.norm.weight": "gdn/norm",
    "linear_attn.out_proj.weight": "gdn/output",
    "mlp.gate_proj.weight": "mlp/gate",
    "mlp.up_proj.weight": "mlp/up",
    "mlp.down_proj.weight": "mlp/down",
    "mlp.gate.weight": "moe/router",
    "mlp.shared_expert_gate.weight": "moe/shared_score",
    "mlp.shared_expert.gate_proj.weight": "moe/shared/gate",
    "mlp.shared_expert.up_proj.weight": "moe/shared/up",
    "mlp.shared_expert.down_proj.weight": "moe/shared/down",
}
_TOP_RENAMES = {
    "lm_head.weight": "text/output_head",
    "mtp.fc.weight": "mtp/input_projection",
    "mtp.pre_fc_norm_embedding.weight": "mtp/embedding_norm",
    "mtp.pre_fc_norm_hidden.weight": "mtp/hidden_norm",
    "mtp.norm.weight": "mtp/final_norm",
}
_TEXT_PREFIXES = ("model.language_model.", "model.")
_IGNORED_PREFIXES = ("model.visual.", "visual.")
_PER_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def _geometry(config) -> ModelArgs:
    return config if isinstance(config, ModelArgs) else ModelArgs.from_config(config)


def hf_to_logical(hf_name: str, array, config: Mapping[str, Any] | ModelArgs) -> list[tuple[str, Any]]:
    """Map one Hugging Face Qwen3.5 tensor onto (logical_name, array) pairs (spec/container.md §2.3).

    Handles both `Qwen3_5ForCausalLM` (`model.layers...`) and `...ForConditionalGeneration`
    (`model.language_model.layers...`) names, and the quirks: q_proj rows interleaved per head
    [query | gate] are split into attention/query and attention/gate; in_proj_qkv is split into
    gdn/query, key, value; conv1d [C, 1, K] becomes gdn/convolution [K, C] (tap-major); fused MoE
    experts (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`) and per-expert tensors become
    moe/experts/{e}/{gate,up,down}. Vision tensors return []; unknown names raise ValueError.
    Arrays keep their dtype (only reshaped and sliced).
    """
    if hf_name in _TOP_RENAMES:
        return [(_TOP_RENAMES[hf_name], array)]
    if hf_name.startswith(_IGNORED_PREFIXES):
        return []
    m = re.match(r"mtp\.layers\.(\d+)\.(.+)$", hf_name)
    if m:
        return _block_to_logical(f"mtp/layers/{m.group(1)}/", m.group(2), array, _geometry(config))
    for prefix in _TEXT_PREFIXES:
        if hf_name.startswith(prefix):
            rest = hf_name[len(prefix) :]
            break
    else:
        raise ValueError(f"not a Qwen3.5 text tensor: {hf_name}")
    if rest == "embed_tokens.weight":
        return [("text/token_embedding", array)]
    if rest == "norm.weight":
        return [("text/final_norm", array)]
    m = re.match(r"layers\.(\d+)\.(.+)$", rest)
    if not m:
        raise ValueError(f"not a Qwen3.5 text tensor: {hf_name}")
    return _block_to_logical(f"text/layers/{m.group(1)}/", m.group(2), array, _geometry(config))


def _block_to_logical(blk: str, name: str, a, args: ModelArgs) -> list[tuple[str, Any]]:
    if name in _BLOCK_RENAMES:
        return [(blk + _BLOCK_RENAMES[name], a)]
    if name == "self_attn.q_proj.weight":
        heads, hd = args.num_attention_heads, args.head_dim
        per_head = a.reshape(heads, 2 * hd, a.shape[-1])  # rows per head: [query_hd | gate_hd]
        q = np.ascontiguousarray(per_head[:, :hd].reshape(heads * hd, -1))
        g = np.ascontiguousarray(per_head[:, hd:].reshape(heads * hd, -1))
        return [(blk + "attention/query", q), (blk + "attention/gate", g)]
    if name == "linear_attn.in_proj_qkv.weight":
        kd = args.linear_num_key_heads * args.linear_key_head_dim
        return [
            (blk + "gdn/query", a[:kd]),
            (blk + "gdn/key", a[kd : 2 * kd]),
            (blk + "gdn/value", a[2 * kd :]),
        ]
    if name == "linear_attn.conv1d.weight":
        return [(blk + "gdn/convolution", np.ascontiguousarray(a.reshape(a.shape[0], a.shape[-1]).T))]
    if name == "mlp.experts.gate_up_proj":
        inter = a.shape[1] // 2
        out = []
        for e in range(a.shape[0]):
            out += [(blk + f"moe/experts/{e}/gate", a[e, :inter]), (blk + f"moe/experts/{e}/up", a[e, inter:])]
        return out
    if name == "mlp.experts.down_proj":
        return [(blk + f"moe/experts/{e}/down", a[e]) for e in range(a.shape[0])]
    m = _PER_EXPERT.fullmatch(name)
    if m:
        return [(blk + f"moe/experts/{m.group(1)}/{m.group(2)}", a)]
    raise ValueError(f"unknown Qwen3.5 block tensor: {blk}{name}")


def logical_shapes(args: ModelArgs, mtp: bool | None = None) -> dict[str, tuple[int, ...]]:
    """Every logical parameter of a Qwen3.5 text model (and its MTP head when `mtp`) with its shape."""
    h, shapes = args.hidden_size, {}
    mtp = bool(args.mtp_num_hidden_layers) if mtp is None else mtp

    def block(p: str, kind: str) -> None:
        shapes[p + "input_norm"] = shapes[p + "post_attention_norm"] = (h,)
        if kind == LINEAR:
            kd, vd, hv = args.linear_num_key_heads * args.linear_key_head_dim, args.linear_value_dim, args.linear_num_value_heads
            shapes.update({p + "gdn/query": (kd, h), p + "gdn/key": (kd, h), p + "gdn/value": (vd, h),
                           p + "gdn/z": (vd, h), p + "gdn/a_projection": (hv, h), p + "gdn/b_projection": (hv, h),
                           p + "gdn/a_log": (hv,), p + "gdn/dt_bias": (hv,),
                           p + "gdn/convolution": (args.linear_conv_kernel_dim, args.gdn_conv_channels),
                           p + "gdn/norm": (args.linear_value_head_dim,), p + "gdn/output": (h, vd)})
        else:
            q, kv = args.num_attention_heads * args.head_dim, args.num_key_value_heads * args.head_dim
            shapes.update({p + "attention/query": (q, h), p + "attention/gate": (q, h), p + "attention/key": (kv, h),
                           p + "attention/value": (kv, h), p + "attention/query_norm": (args.head_dim,),
                           p + "attention/key_norm": (args.head_dim,), p + "attention/output": (h, q)})
        if args.is_moe:
            i, si = args.moe_intermediate_size, args.shared_expert_intermediate_size
            shapes.update({p + "moe/router": (args.num_experts, h), p + "moe/shared_score": (1, h),
                           p + "moe/shared/gate": (si, h), p + "moe/shared/up": (si, h), p + "moe/shared/down": (h, si)})
            for e in range(args.num_experts):
                shapes.update({p + f"moe/experts/{e}/gate": (i, h), p + f"moe/experts/{e}/up": (i, h),
                               p + f"moe/experts/{e}/down": (h, i)})
        else:
            i = args.intermediate_size
            shapes.update({p + "mlp/gate": (i, h), p + "mlp/up": (i, h), p + "mlp/down": (h, i)})

    shapes["text/token_embedding"] = (args.vocab_size, h)
    for li, kind in enumerate(args.layer_types):
        block(f"text/layers/{li}/", kind)
    shapes["text/final_norm"] = (h,)
    if not args.tie_word_embeddings:
        shapes["text/output_head"] = (args.vocab_size, h)
    if mtp:
        shapes.update({"mtp/input_projection": (h, 2 * h), "mtp/embedding_norm": (h,), "mtp/hidden_norm": (h,),
                       "mtp/final_norm": (h,)})
        block("mtp/layers/0/", "full_attention")
    return shapes


def random_weights(args: ModelArgs, seed: int = 0, mtp: bool | None = None,
                   proposal: int = 0) -> dict[str, np.ndarray]:
    """Synthetic float32 weights with sane scales, for tests and benchmarks without a checkpoint; `proposal` rows of a
    proposal (shortlist) head beside the MTP head (`proposal_weights`)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in logical_shapes(args, mtp).items():
        leaf = name.rsplit("/", 1)[-1]
        if leaf == "a_log":
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif leaf == "dt_bias":
            a = rng.standard_normal(shape)
        elif len(shape) == 1:  # (1+w) norms near w = 0; the plain GDN norm near w = 1
            a = 0.1 * rng.standard_normal(shape) + (1.0 if name.endswith("gdn/norm") else 0.0)
        elif leaf == "convolution":
            a = rng.standard_normal(shape) / np.sqrt(shape[0])
        else:  # float32 straight from the generator: a 0.5B model must not pass through float64
            a = rng.standard_normal(shape, dtype=np.float32)
            a *= np.float32(1.0 / np.sqrt(shape[-1]))
        out[name] = a.astype(np.float32, copy=False)
    if proposal:
        out.update(proposal_weights(out, proposal, seed=seed))
    return out


PROPOSAL_ROWS = 131072  # rows of the published artifacts' proposal head (spec/runtime.md §3.6)


def proposal_weights(weights, rows: int, seed: int = 0, domain: int | None = None) -> dict[str, np.ndarray]:
    """A proposal head as the published artifacts derive theirs: `rows` token ids of the domain in rank order (here a
    random ranking, where theirs count a corpus) and the target head's rows of those ids, in that order."""
    head = np.asarray(weights["text/output_head"] if "text/output_head" in weights
                      else weights["text/token_embedding"], dtype=np.float32)
    n = min(domain or head.shape[0], head.shape[0])
    if not 0 < rows <= n:
        raise ValueError(f"a proposal head of {rows} rows over a domain of {n} ids")
    ids = np.random.default_rng(seed + 1).permutation(n)[:rows].astype(np.int32)
    return {"proposal/head": np.ascontiguousarray(head[ids]), "proposal/token_ids": ids}


# ---------------------------------------------------------------------------------------------
# Model


class Model:
    """Qwen3.5 text model; `Model(args).load(weights)` then `model(tokens, cache)`.

    `xp` is numpy or cupy (weights are moved there at load); `gdn_mode` "chunked" or "recurrent"
    selects the prefill form of the delta rule.
    """

    def __init__(self, args: ModelArgs, xp=np, gdn_mode: str = "chunked"):
        self.args, self.xp, self.gdn_mode = args, xp, gdn_mode
        self.layers: list[DecoderLayer] = []
        self.mtp_layer: DecoderLayer | None = None
        self.proposal = None  # (head [rows, H], token ids [rows]): the MTP's shortlist head, when the weights carry one

    def load(self, weights: Mapping[str, Any]) -> "Model":
        """Take weights by logical name (arrays of any float dtype); keeps float32 copies on `xp`."""
        xp, a = self.xp, self.args
        f32 = lambda n: xp.ascontiguousarray(xp.asarray(weights[n], dtype=np.float32))  # noqa: E731
        self.embed = f32("text/token_embedding")
        self.final_norm = f32("text/final_norm")
        self.head = self.embed if (a.tie_word_embeddings or "text/output_head" not in weights) else f32("text/output_head")
        self.layers = [
            DecoderLayer(a, weights, f"text/layers/{i}/", kind, xp, self.gdn_mode) for i, kind in enumerate(a.layer_types)
        ]
        if a.mtp_num_hidden_layers and "mtp/input_projection" in weights:
            self.mtp_fc = f32("mtp/input_projection")
            self.mtp_norms = tuple(f32(f"mtp/{n}") for n in ("embedding_norm", "hidden_norm", "final_norm"))
            self.mtp_layer = DecoderLayer(a, weights, "mtp/layers/0/", "full_attention", xp, self.gdn_mode)
        if self.mtp_layer is not None and "proposal/head" in weights and "proposal/token_ids" in weights:
            ids = weights["proposal/token_ids"]
            ids = np.asarray(ids.get() if hasattr(ids, "get") else ids).astype(np.int64).reshape(-1)
            self.proposal = (f32("proposal/head"), ids)
        return self

    def make_cache(self, max_len: int | None = None) -> Cache:
        """Fresh per-sequence cache: KV per attention layer, (conv, recurrent) state per GDN layer."""
        return Cache([layer.make_state(max_len) for layer in self.layers])

    def __call__(self, tokens, cache: Cache | None = None, *, last_only: bool = False):
        """tokens int[T] -> logits [T, vocab] (or [1, vocab] with last_only); advances `cache`."""
        logits, _ = self.forward(tokens, cache, last_only=last_only)
        return logits

    def forward(self, tokens, cache: Cache | None = None, *, last_only: bool = False):
        """Like `__call__` but returns (logits, final-normed hidden [T, H]) for the MTP head."""
        xp = self.xp
        tok = np.asarray(tokens.get() if hasattr(tokens, "get") else tokens, dtype=np.int64).reshape(-1)
        pos0 = cache.position if cache is not None else 0
        x = self.embed[xp.asarray(tok)]
        for i, layer in enumerate(self.layers):
            x = layer(x, None if cache is None else cache[i], pos0)
        if cache is not None:
            cache.position += len(tok)
        h = ref.rmsnorm(x, self.final_norm, self.args.rms_norm_eps)
        return ref.linear(h[-1:] if last_only else h, self.head), h

    # --- MTP head (§1.6) -----------------------------------------------------------------------

    def make_mtp_cache(self, max_len: int | None = None) -> Cache:
        """One-layer KV cache of the MTP head."""
        if self.mtp_layer is None:
            raise ValueError("this model has no MTP weights")
        return Cache([self.mtp_layer.make_state(max_len)])

    def mtp(self, hidden, next_tokens, cache: Cache | None = None, logits: bool = True):
        """Draft logits from target hidden states and the tokens that follow them.

        hidden [T, H] final-normed target states h_0..h_{T-1} (positions cache.position..),
        next_tokens int[T] = x_1..x_T. Returns (draft logits [T, vocab] through the target's head, or None when not
        `logits`; draft hidden [T, H]); the draft hidden (after mtp/final_norm) is what a further draft step feeds
        back as `hidden`, and what `propose` drafts from.
        """
        xp, eps = self.xp, self.args.rms_norm_eps
        if self.mtp_layer is None:
            raise ValueError("this model has no MTP weights")
        tok = np.asarray(next_tokens, dtype=np.int64).reshape(-1)
        e_norm, h_norm, f_norm = self.mtp_norms
        e = ref.rmsnorm(self.embed[xp.asarray(tok)], e_norm, eps)
        h = ref.rmsnorm(xp.asarray(hidden, dtype=np.float32), h_norm, eps)
        u = ref.linear(xp.concatenate([e, h], axis=1), self.mtp_fc)  # embedding columns first
        pos0 = cache.position if cache is not None else 0
        u = self.mtp_layer(u, None if cache is None else cache[0], pos0)
        if cache is not None:
            cache.position += len(tok)
        d = ref.rmsnorm(u, f_norm, eps)
        return (ref.linear(d, self.head) if logits else None), d

    def propose(self, d, domain: int | None = None) -> int:
        """The MTP head's greedy draft from one draft hidden row d [H]: the argmax over the proposal head's rows
        (the shortlist, mapped to its token ids; the first row of a tie) when the model has one, else over the
        target's head (ids < domain; the lowest id of a tie)."""
        xp = self.xp
        d = xp.asarray(d, dtype=np.float32).reshape(1, -1)
        if self.proposal is not None:
            head, ids = self.proposal
            return int(ids[int(xp.argmax(ref.linear(d, head)[0]))])
        row = ref.linear(d, self.head)[0]
        return int(xp.argmax(row[:domain] if domain else row))

    @property
    def weight_bytes(self) -> int:
        """Bytes of the float32 weights held (a tied head counted once)."""
        top = [self.embed, self.final_norm] + ([] if self.head is self.embed else [self.head])
        arrays = top + [a for layer in self.layers for a in layer.arrays()]
        if self.mtp_layer is not None:
            arrays += [self.mtp_fc, *self.mtp_norms, *self.mtp_layer.arrays()]
        if self.proposal is not None:
            arrays.append(self.proposal[0])
        return int(sum(a.nbytes for a in arrays))

    @property
    def weight_bytes_per_token(self) -> int:
        """Weight bytes one decoded token reads: one embedding row, the layers (only the routed experts it
        uses), the final norm and the head; the MTP head is not counted."""
        row = self.embed.nbytes // self.embed.shape[0]
        total = row + self.final_norm.nbytes + self.head.nbytes
        for layer in self.layers:
            total += sum(a.nbytes for a in layer.arrays()) - layer.ffn.unread_bytes()
        return int(total)
