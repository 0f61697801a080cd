"""llama.cpp `qwen35` / `qwen35moe` GGUF tensors -> logical Qwen3.5 parameters (HF conventions).

What llama.cpp's converter does to a Qwen3.5 checkpoint, undone here (its Qwen3Next and
`_LinearAttentionVReorderBase` rules, as documented by public reverse converters):
* every `*norm.weight` except the GDN `ssm_norm` is stored as w + 1 (ggml's plain RMSNorm);
  ours computes (1 + w), so 1 is subtracted;
* `ssm_a` holds -exp(A_log); A_log = log(-ssm_a);
* linear-attention value heads are reordered from grouped-by-key-head to tiled order in
  `attn_qkv` (value rows only), `attn_gate` (z), `ssm_alpha`/`ssm_beta`, `ssm_a`, `ssm_dt`,
  `ssm_conv1d` (value channels) and `ssm_out` (columns);
* `ssm_conv1d` is [C, K]; ours is tap-major [K, C].
`attn_q` keeps HF's per-head [query | gate] rows (Qwen uses NeoX RoPE: no q/k permutation).
The first MTP (`nextn`) block becomes `mtp/...` (llama.cpp appends it as block
`num_hidden_layers`; `nextn_predict_layers` counts it). This belongs with the model's loader; it lives here until
`engine.models.qwen3_5` offers `weights_from_gguf`, which `from_gguf` then prefers.
"""
from __future__ import annotations

import numpy as np

from engine.errors import NinferError

_BLOCK = {
    "attn_norm": "input_norm", "post_attention_norm": "post_attention_norm",
    "attn_k": "attention/key", "attn_v": "attention/value", "attn_output": "attention/output",
    "attn_q_norm": "attention/query_norm", "attn_k_norm": "attention/key_norm",
    "ssm_norm": "gdn/norm", "ffn_gate": "mlp/gate", "ffn_up": "mlp/up", "ffn_down": "mlp/down",
    "ffn_gate_inp": "moe/router", "ffn_gate_inp_shexp": "moe/shared_score",
    "ffn_gate_shexp": "moe/shared/gate", "ffn_up_shexp": "moe/shared/up", "ffn_down_shexp": "moe/shared/down",
}
# nextn tensor -> (logical name, stored as w + 1)
_NEXTN = {"nextn.eh_proj": ("mtp/input_projection", False), "nextn.enorm": ("mtp/embedding_norm", True),
          "nextn.hnorm": ("mtp/hidden_norm", True), "nextn.shared_head_norm": ("mtp/final_norm", True)}
_PLUS_ONE = ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _arch(reader) -> str:
    return str(_field(reader, "general.architecture"))


def config_from_gguf(reader) -> dict:
    """HF-style Qwen3.5 text config from qwen35/qwen35moe metadata."""
    a = _arch(reader)

    def f(key, default=None):
        return _field(reader, f"{a}.{key}", default)

    names = {t.name for t in reader.tensors}
    n_blocks = int(f("block_count"))
    n_layers = n_blocks - int(f("nextn_predict_layers", 0) or 0)
    heads = int(f("attention.head_count"))
    qnorm = next((t for t in reader.tensors if t.name.endswith("attn_q_norm.weight")), None)
    head_dim = int(f("attention.key_length", 0) or (int(qnorm.shape[0]) if qnorm is not None else 0)
                   or int(f("embedding_length")) // heads)
    rope_dim = int(f("rope.dimension_count", head_dim // 4))
    sections = [int(s) for s in (f("rope.dimension_sections") or [])]
    while sections and sections[-1] == 0:
        sections.pop()
    v_heads = int(f("ssm.time_step_rank"))
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    cfg = {
        "architectures": ["Qwen3_5MoeForCausalLM" if a == "qwen35moe" else "Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_moe_text" if a == "qwen35moe" else "qwen3_5_text",
        "hidden_size": int(f("embedding_length")),
        "vocab_size": int(emb.shape[1]),
        "tie_word_embeddings": "output.weight" not in names,
        "num_hidden_layers": n_layers,
        "layer_types": ["linear_attention" if f"blk.{i}.ssm_a" in names else "full_attention" for i in range(n_layers)],
        "max_position_embeddings": int(f("context_length", 262144)),
        "rms_norm_eps": float(f("attention.layer_norm_rms_epsilon", 1e-6)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(f("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rope_parameters": {"rope_theta": float(f("rope.freq_base", 10_000_000.0)),
                            "partial_rotary_factor": rope_dim / head_dim, **({"mrope_section": sections} if sections else {})},
        "linear_num_key_heads": int(f("ssm.group_count")),
        "linear_key_head_dim": int(f("ssm.state_size")),
        "linear_num_value_heads": v_heads,
        "linear_value_head_dim": int(f("ssm.inner_size")) // v_heads,
        "linear_conv_kernel_dim": int(f("ssm.conv_kernel", 4)),
    }
    if a == "qwen35moe":
        cfg.update(num_experts=int(f("expert_count")), num_experts_per_tok=int(f("expert_used_count")),
                   moe_intermediate_size=int(f("expert_feed_forward_length")),
                   shared_expert_intermediate_size=int(f("expert_shared_feed_forward_length", 0) or 0))
    else:
        cfg["intermediate_size"] = int(f("feed_forward_length"))
    return cfg


def _untile_rows(w: np.ndarray, k_heads: int, per_k: int, head_dim: int) -> np.ndarray:
    """Tiled [per_k, k_heads, head_dim, ...] rows -> HF grouped [k_heads, per_k, head_dim, ...]."""
    if per_k <= 1:
        return w
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(per_k, k_heads, head_dim, *rest).swapaxes(0, 1).reshape(w.shape))


def weights_from_gguf(reader):
    """Yield (logical name, float32 array) for a qwen35/qwen35moe GGUF, in file order."""
    from gguf.quants import dequantize

    cfg = config_from_gguf(reader)
    kh, vh = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if vh % kh:
        raise NinferError(f"linear value heads {vh} are not a multiple of key heads {kh}")
    per_k, vd = vh // kh, cfg["linear_value_head_dim"]
    qk_rows = 2 * kh * cfg["linear_key_head_dim"]
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape([int(n) for n in reversed(t.shape)])
        name = t.name.removesuffix(".weight")
        if name == "token_embd":
            yield "text/token_embedding", w
            continue
        if name == "output_norm":
            yield "text/final_norm", w - np.float32(1)
            continue
        if name == "output":
            yield "text/output_head", w
            continue
        if not name.startswith("blk."):
            continue
        _, idx, kind = name.split(".", 2)
        p = f"text/layers/{idx}/"
        if int(idx) > cfg["num_hidden_layers"]:
            continue  # a second MTP block: the engine runs one
        if int(idx) == cfg["num_hidden_layers"]:  # the MTP block: a full-attention layer plus nextn.*
            p = "mtp/layers/0/"
            if kind.startswith("nextn."):
                if kind in _NEXTN:
                    role, minus_one = _NEXTN[kind]
                    yield role, (w - np.float32(1)) if minus_one else w
                continue  # embed_tokens / shared_head_head repeat the main model's
        with np.errstate(divide="ignore", invalid="ignore"):  # the shape-only pass feeds zeros
            if kind in _PLUS_ONE:
                yield p + _BLOCK[kind], w - np.float32(1)
            elif kind == "attn_q":
                yield from _split_query(p, w, cfg)
            elif kind == "attn_qkv":
                kd = kh * cfg["linear_key_head_dim"]
                yield p + "gdn/query", w[:kd]
                yield p + "gdn/key", w[kd:qk_rows]
                yield p + "gdn/value", _untile_rows(w[qk_rows:], kh, per_k, vd)
            elif kind == "attn_gate":
                yield p + "gdn/z", _untile_rows(w, kh, per_k, vd)
            elif kind in ("ssm_alpha", "ssm_beta"):
                yield p + ("gdn/a_projection" if kind == "ssm_alpha" else "gdn/b_projection"), _untile_rows(w, kh, per_k, 1)
            elif kind == "ssm_a":
                yield p + "gdn/a_log", np.log(-_untile_rows(w.reshape(-1), kh, per_k, 1)).astype(np.float32)
            elif kind == "ssm_dt" or kind == "ssm_dt.bias":
                yield p + "gdn/dt_bias", _untile_rows(w.reshape(-1), kh, per_k, 1)
            elif kind == "ssm_conv1d":
                c = w.reshape(w.shape[0], -1)  # [C, K]
                c = np.concatenate([c[:qk_rows], _untile_rows(c[qk_rows:], kh, per_k, vd)])
                yield p + "gdn/convolution", np.ascontiguousarray(c.T)
            elif kind == "ssm_out":
                n = w.shape[0]
                yield p + "gdn/output", np.ascontiguousarray(
                    w.reshape(n, per_k, kh, vd).swapaxes(1, 2).reshape(n, -1))
            elif kind == "ffn_gate_up_exps":  # fused [E, 2I, H]: gate rows first
                inter = w.shape[1] // 2
                for e in range(w.shape[0]):
                    yield p + f"moe/experts/{e}/gate", w[e, :inter]
                    yield p + f"moe/experts/{e}/up", w[e, inter:]
            elif kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                role = kind.split("_")[1]
                for e in range(w.shape[0]):
                    yield p + f"moe/experts/{e}/{role}", w[e]
            elif kind == "ffn_gate_inp_shexp":
                yield p + "moe/shared_score", w.reshape(1, -1)
            elif kind in _BLOCK:
                yield p + _BLOCK[kind], w


def _split_query(p: str, w: np.ndarray, cfg: dict):
    heads, hd = cfg["num_attention_heads"], cfg["head_dim"]
    per_head = w.reshape(heads, 2 * hd, w.shape[-1])
    yield p + "attention/query", np.ascontiguousarray(per_head[:, :hd].reshape(heads * hd, -1))
    yield p + "attention/gate", np.ascontiguousarray(per_head[:, hd:].reshape(heads * hd, -1))
