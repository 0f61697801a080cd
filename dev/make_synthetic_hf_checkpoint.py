"""Write a large random Qwen3.5 checkpoint folder (bf16 safetensors shards) to time `ninfer convert`.

    PYTHONPATH=. .venv/bin/python dev/make_synthetic_hf_checkpoint.py OUT_DIR [--layers 8 --hidden 2048 ...]

Random weights under the Hugging Face names a real Qwen3.5 checkpoint uses; no torch needed.
"""
from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np

from engine.artifact.formats import f32_to_bf16_bits


def tensors(cfg: dict):
    """(HF name, shape) of a Qwen3.5 text checkpoint with this config."""
    h, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    kd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    vd = cfg["linear_num_value_heads"] * cfg["linear_value_head_dim"]
    yield "model.embed_tokens.weight", (cfg["vocab_size"], h)
    for i in range(L):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "post_attention_layernorm.weight", (h,)
        if cfg["layer_types"][i] == "full_attention":
            yield p + "self_attn.q_proj.weight", (2 * q, h)
            yield p + "self_attn.k_proj.weight", (kv, h)
            yield p + "self_attn.v_proj.weight", (kv, h)
            yield p + "self_attn.o_proj.weight", (h, q)
            yield p + "self_attn.q_norm.weight", (cfg["head_dim"],)
            yield p + "self_attn.k_norm.weight", (cfg["head_dim"],)
        else:
            yield p + "linear_attn.in_proj_qkv.weight", (2 * kd + vd, h)
            yield p + "linear_attn.in_proj_z.weight", (vd, h)
            yield p + "linear_attn.in_proj_a.weight", (cfg["linear_num_value_heads"], h)
            yield p + "linear_attn.in_proj_b.weight", (cfg["linear_num_value_heads"], h)
            yield p + "linear_attn.A_log", (cfg["linear_num_value_heads"],)
            yield p + "linear_attn.dt_bias", (cfg["linear_num_value_heads"],)
            yield p + "linear_attn.conv1d.weight", (2 * kd + vd, 1, cfg["linear_conv_kernel_dim"])
            yield p + "linear_attn.norm.weight", (cfg["linear_value_head_dim"],)
            yield p + "linear_attn.out_proj.weight", (h, vd)
        yield p + "mlp.gate_proj.weight", (cfg["intermediate_size"], h)
        yield p + "mlp.up_proj.weight", (cfg["intermediate_size"], h)
        yield p + "mlp.down_proj.weight", (h, cfg["intermediate_size"])
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (cfg["vocab_size"], h)


def write_shard(path: Path, items: list, rng) -> None:
    header, offset = {}, 0
    for name, shape in items:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, shape in items:
            x = rng.standard_normal(shape, dtype=np.float32) * 0.02
            f.write(f32_to_bf16_bits(x).tobytes())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--shard-bytes", type=int, default=1 << 30)
    a = ap.parse_args()
    cfg = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": a.hidden,
           "num_hidden_layers": a.layers, "vocab_size": a.vocab, "tie_word_embeddings": False,
           "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(a.layers)],
           "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": a.intermediate,
           "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": 32,
           "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 262144,
           "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "config.json").write_text(json.dumps(cfg, indent=2))
    rng = np.random.default_rng(0)
    shards, cur, size = [], [], 0
    for name, shape in tensors(cfg):
        cur.append((name, shape))
        size += int(np.prod(shape)) * 2
        if size >= a.shard_bytes:
            shards.append(cur)
            cur, size = [], 0
    if cur:
        shards.append(cur)
    weight_map = {}
    for i, items in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(a.out / fname, items, rng)
        weight_map.update({n: fname for n, _ in items})
    (a.out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    total = sum(p.stat().st_size for p in a.out.glob("*.safetensors"))
    print(f"{a.out}: {len(weight_map)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
