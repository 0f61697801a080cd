"""Save tiny random Qwen3.5 checkpoints with transformers, as Hugging Face folders, for the importer tests.

Needs torch + transformers (dev extra); CI reads the committed folders:
    tests/fixtures/artifact/hf_dense/      Qwen3_5ForCausalLM, bf16 shards split in two (+ index), MTP tensors
    tests/fixtures/artifact/hf_moe/        Qwen3_5MoeForCausalLM as transformers saves it (bf16)
    tests/fixtures/artifact/hf_moe_split/  the same weights, one tensor per expert, fp32
Each folder also holds a small byte-level BPE tokenizer.json, tokenizer_config.json with the Qwen3.5
chat template, and generation_config.json.

Usage: PYTHONPATH=. .venv/bin/python dev/make_hf_checkpoints.py
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from make_golden_qwen35 import _perturb  # the same perturbation as the golden checkpoints (dev/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "artifact"
TEMPLATE = Path("/work/shared/data/chat_template.qwen3_5-small.jinja")

COMMON = dict(
    vocab_size=320, hidden_size=64, num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    linear_num_key_heads=2, linear_key_head_dim=16, linear_num_value_heads=4, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 1, 1]},
    bos_token_id=None, eos_token_id=257,
)


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
            "ninfer converts checkpoints into the .ninfer container."] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(str(folder / "tokenizer.json"))
    template = TEMPLATE.read_text() if TEMPLATE.is_file() else "{{ messages }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": template}, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 257, "temperature": 0.7}))




def _mtp_tensors(state: dict, hidden: int, seed: int) -> dict:
    """Real Qwen3.5 checkpoints carry an MTP head (transformers drops it); add one shaped like theirs."""
    g = torch.Generator().manual_seed(seed)
    layer = {k.removeprefix("model.layers.3."): v for k, v in state.items() if k.startswith("model.layers.3.")}
    out = {"mtp.fc.weight": torch.randn(hidden, 2 * hidden, generator=g) * 0.05,
           "mtp.pre_fc_norm_embedding.weight": torch.randn(hidden, generator=g) * 0.1,
           "mtp.pre_fc_norm_hidden.weight": torch.randn(hidden, generator=g) * 0.1,
           "mtp.norm.weight": torch.randn(hidden, generator=g) * 0.1}
    for k, v in layer.items():
        out[f"mtp.layers.0.{k}"] = v.clone() + 0.01 * torch.randn(v.shape, generator=g)
    return out


def _write_folder(folder: Path, cfg, state: dict, dtype, shards: int) -> None:
    from safetensors.torch import save_file

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    config = cfg.to_dict()
    config["architectures"] = [type(cfg).__name__.replace("TextConfig", "ForCausalLM")]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    names = list(state)
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for i, group in enumerate(groups):
        fname = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: state[k].to(dtype).contiguous() for k in group}, str(folder / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in group})
    if shards > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _tokenizer(folder)


def main() -> None:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    torch.manual_seed(21)
    cfg = Qwen3_5TextConfig(**COMMON, intermediate_size=96)
    model = Qwen3_5ForCausalLM(cfg).float().eval()
    _perturb(model, 22)
    state = dict(model.state_dict())
    state.update(_mtp_tensors(state, cfg.hidden_size, 23))
    cfg.mtp_num_hidden_layers = 1
    _write_folder(OUT / "hf_dense", cfg, state, torch.bfloat16, shards=2)

    torch.manual_seed(31)
    mcfg = Qwen3_5MoeTextConfig(**COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                shared_expert_intermediate_size=48)
    moe = Qwen3_5MoeForCausalLM(mcfg).float().eval()
    _perturb(moe, 32)
    mstate = dict(moe.state_dict())
    _write_folder(OUT / "hf_moe", mcfg, mstate, torch.bfloat16, shards=1)
    split = {}
    for k, v in mstate.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base, inter = k.removesuffix("gate_up_proj"), v.shape[1] // 2
            for e in range(v.shape[0]):
                split[f"{base}{e}.gate_proj.weight"] = v[e, :inter]
                split[f"{base}{e}.up_proj.weight"] = v[e, inter:]
        elif k.endswith("mlp.experts.down_proj"):
            base = k.removesuffix("down_proj")
            for e in range(v.shape[0]):
                split[f"{base}{e}.down_proj.weight"] = v[e]
        else:
            split[k] = v
    _write_folder(OUT / "hf_moe_split", mcfg, split, torch.float32, shards=1)
    for name in ("hf_dense", "hf_moe", "hf_moe_split"):
        size = sum(p.stat().st_size for p in (OUT / name).iterdir())
        print(f"{name}: {size / 1e3:.0f} KB; keys e.g. {sorted(np.array(list(state)))[:2]}")


if __name__ == "__main__":
    main()
