"""Sampling presets by model and prompt mode, as each model's card recommends (runtime spec §3.7).

Flags the user sets override a preset; a preset never overrides a flag.
"""
from __future__ import annotations

_QWEN_THINK = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0}
_QWEN_NOTHINK = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5}


def sampling_preset(config: dict | None, thinking: bool) -> dict:
    """GenerationConfig fields for a model (HF-style text config) in thinking or non-thinking mode."""
    config = config or {}
    mtype = str(config.get("model_type", ""))
    if mtype.startswith("qwen3_5"):
        preset = dict(_QWEN_THINK if thinking else _QWEN_NOTHINK)
        if "moe" in mtype or config.get("num_experts"):
            preset["presence_penalty"] = 1.5  # Qwen3.6-35B-A3B uses 1.5 in both modes
        return preset
    if mtype == "llama":
        return dict(_SMOLLM2_CARD)
    return {"temperature": 0.7}


# SmolLM2-135M-Instruct's model card samples with exactly these (no penalties).
_SMOLLM2_CARD = {"temperature": 0.2, "top_p": 0.9}


def preset_source(config: dict | None) -> str:
    """Where `sampling_preset`'s values come from, for `ninfer show`."""
    mtype = str((config or {}).get("model_type", ""))
    if mtype.startswith("qwen3_5"):
        return "Qwen3.6/3.8 model cards (thinking and non-thinking modes)"
    if mtype == "llama":
        return "SmolLM2-135M-Instruct model card"
    return "ninfer's generic default"
