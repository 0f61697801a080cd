"""Full-size synthetic models for benchmarks: the real geometry and recipe, random weights made
directly in device memory (no download, no disk)."""
from __future__ import annotations

from engine.config import ModelArgs
from engine.errors import NinferError

_DENSE_27B = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 5120,
    "num_hidden_layers": 64, "vocab_size": 248320, "intermediate_size": 17408, "rms_norm_eps": 1e-6,
    "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "attn_output_gate": True,
    "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": 48,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "max_position_embeddings": 262144, "tie_word_embeddings": False, "mtp_num_hidden_layers": 1,
    "rope_parameters": {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]},
}
# A small Qwen3.5 with the real head sizes (attention 256, GDN 128): what the CUDA kernels accept,
# for parity tests against the NumPy engine.
TINY_CUDA = {
    **_DENSE_27B, "hidden_size": 512, "num_hidden_layers": 4, "vocab_size": 1000, "intermediate_size": 1024,
    "num_attention_heads": 4, "num_key_value_heads": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "full_attention_interval": 2, "max_position_embeddings": 4096, "mtp_num_hidden_layers": 0,
}
GEOMETRIES = {
    "qwen3.6-27b": (_DENSE_27B, "groupwise-int"),
    "qwen3.8-27b": (_DENSE_27B, "groupwise-int-w8head"),
    "qwen3.6-35b-a3b": ({
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
        "num_hidden_layers": 40, "vocab_size": 248320, "rms_norm_eps": 1e-6, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "attn_output_gate": True, "linear_num_key_heads": 16,
        "linear_key_head_dim": 128, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "num_experts": 256,
        "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "max_position_embeddings": 262144, "tie_word_embeddings": False, "mtp_num_hidden_layers": 1,
        "rope_parameters": {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    }, "groupwise-int-moe"),
}


def geometry_config(geometry: str) -> dict:
    if geometry not in GEOMETRIES:
        raise NinferError(f"unknown synthetic geometry {geometry!r}", f"use one of {', '.join(GEOMETRIES)}")
    return dict(GEOMETRIES[geometry][0])


def build_engine(geometry: str, recipe: str | None = None, device: str = "gpu", max_context: int = 4096,
                 kv: str = "bf16", seed: int = 0, gemv_cfg: dict | None = None, **engine_kw):
    """An Engine over random weights of `geometry` in `recipe`, built directly in device memory
    (`engine_kw`: `engine.gpu_engine.build_engine` options such as prefill_gemm)."""
    from engine.backend import gpu_available  # noqa: PLC0415

    if device != "gpu" or not gpu_available():
        raise NinferError(f"--synthetic {geometry} builds full-size weights in GPU memory and needs a CUDA GPU",
                          "run it on a machine with an NVIDIA GPU and CuPy, or use --synthetic tiny here")
    if kv not in ("bf16", "int8"):
        raise NinferError(f"unknown KV format {kv!r}", "use --kv bf16 or --kv int8")
    config = geometry_config(geometry)
    args = ModelArgs.from_config(config)
    from engine.gpu import weights as gpu_weights  # noqa: PLC0415
    from engine.gpu_engine import build_engine as build  # noqa: PLC0415

    weights = gpu_weights.synthetic(args, recipe or GEOMETRIES[geometry][1], seed=seed)
    eng = build(args, weights, config, max_context=max_context, gemv_cfg=gemv_cfg, kv=kv, **engine_kw)
    eng.synthetic_depth = True  # bench -d seeks instead of prefilling (`CudaEngine.seek_synthetic`)
    return eng


def tokenizer(vocab_size: int):
    """A stand-in tokenizer over `vocab_size` ids for a synthetic engine (`ninfer run --synthetic`): id i reads as
    `t{i}` and every prompt word maps to id 0. Random weights give meaningless ids anyway; what such a run shows is
    the path and the timings of the real one."""
    import json  # noqa: PLC0415

    from engine.text.tokenizer import Tokenizer  # noqa: PLC0415

    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab_size)}, "unk_token": "t0"}}
    return Tokenizer.from_json(json.dumps(spec))


def artifact_tensors(config: dict = TINY_CUDA, recipe: str = "groupwise-int", seed: int = 4) -> list:
    """(name, fmt, layout, shape, data) for `engine.artifact.writer.write_artifact`: random text weights
    of `config`, quantized by `recipe` the way `ninfer convert` stores them (tests write small v3 files)."""
    import numpy as np  # noqa: PLC0415

    from engine.gpu import weights as gpu_weights  # noqa: PLC0415
    from engine.artifact import formats  # noqa: PLC0415
    from engine.models.qwen3_5 import random_weights  # noqa: PLC0415

    table = gpu_weights.RECIPES[recipe]
    tensors = []
    for name, v in random_weights(ModelArgs.from_config(config), seed=seed).items():
        if not name.startswith("text/"):
            continue
        v = np.asarray(v, np.float32)
        if gpu_weights.is_vector(name) or v.ndim != 2:
            tensors.append((name, "fp32", "contiguous_le_v1", v.shape, v))
        else:
            fmt = table.get(gpu_weights.role(name), "q8_g32_fp16")
            layout = "contiguous_le_v1" if fmt == "bf16" else "row_split_k128_v1"
            data = formats.f32_to_bf16_bits(v).view(np.uint8).ravel() if fmt == "bf16" else v
            tensors.append((name, fmt, layout, v.shape, data))
    return tensors
