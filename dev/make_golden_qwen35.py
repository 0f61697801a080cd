"""Build tiny random Qwen3.5 models with transformers and save golden logits for tests/model.

Needs torch and transformers (dev extra); CI does not run this, it reads the committed fixtures:
    tests/fixtures/golden/qwen35_dense.npz, qwen35_moe.npz
Each holds the weights under their Hugging Face names (`w:<name>`), the config (`config_json`),
40 token ids (`tokens`) and the fp32 logits transformers computes for them (`logits [40, vocab]`).

Usage: PYTHONPATH=. .venv/bin/python dev/make_golden_qwen35.py
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "golden"
SEQ = 40

COMMON = dict(
    vocab_size=384,
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_num_value_heads=4,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 1, 1]},
    initializer_range=0.08,
)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """transformers initialises norm weights to 0 or 1; randomise them so the (1+w) vs w convention is tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g))


def build(kind: str, seed: int):
    torch.manual_seed(seed)
    if kind == "dense":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        cfg = Qwen3_5TextConfig(**COMMON, intermediate_size=96)
        model = Qwen3_5ForCausalLM(cfg)
    else:
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

        cfg = Qwen3_5MoeTextConfig(**COMMON, num_experts=8, num_experts_per_tok=3,
                                   moe_intermediate_size=32, shared_expert_intermediate_size=40)
        model = Qwen3_5MoeForCausalLM(cfg)
    model = model.float().eval()
    _perturb(model, seed + 1)
    return cfg, model


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for kind, seed in (("dense", 11), ("moe", 12)):
        cfg, model = build(kind, seed)
        tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, SEQ)
        with torch.no_grad():
            logits = model(torch.from_numpy(tokens)[None]).logits[0].float().numpy()
        arrays = {f"w:{k}": v.detach().float().numpy() for k, v in model.state_dict().items()}
        config = cfg.to_dict()
        path = OUT / f"qwen35_{kind}.npz"
        np.savez_compressed(path, config_json=np.array(json.dumps(config)), tokens=tokens.astype(np.int64),
                            logits=logits.astype(np.float32), **arrays)
        n = sum(v.size for v in arrays.values())
        print(f"{path.name}: {n} params, {path.stat().st_size / 1e6:.2f} MB, logits std {logits.std():.3f}")


if __name__ == "__main__":
    main()
