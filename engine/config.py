"""Frozen model arguments built from an artifact's component configs or a Hugging Face config.json.

One `ModelArgs` serves every architecture file (Qwen3.5 dense/MoE, Llama); fields an architecture does
not use keep their defaults. The layer schedule comes from `layer_types`, or from
`full_attention_interval` (every n-th layer is full attention) when the list is absent.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from engine.errors import NinferError

QWEN_VOCAB_ROWS = 248320
QWEN_TOKEN_DOMAIN = 248077  # ids >= this are reserved rows of the Qwen head (model.md §1.10)

FULL = "full_attention"
LINEAR = "linear_attention"


@dataclasses.dataclass(frozen=True)
class ModelArgs:
    """Geometry and hyper-parameters of a text model (HF names where one exists)."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    architectures: tuple[str, ...] = ()
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768
    layer_types: tuple[str, ...] = ()
    # attention
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 1.0
    attention_gated: bool = False  # Qwen3.5: q_proj carries a sigmoid output gate per head
    # Gated DeltaNet
    linear_num_key_heads: int = 0
    linear_key_head_dim: int = 0
    linear_num_value_heads: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    # feed-forward
    intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    # multi-token prediction head
    mtp_num_hidden_layers: int = 0
    # sampling domain: ids >= token_domain are never produced (None = the whole vocab)
    token_domain: int | None = None
    eos_token_id: tuple[int, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def gdn_conv_channels(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_value_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def domain(self) -> int:
        """Number of ids that sampling may produce."""
        return min(self.token_domain or self.vocab_size, self.vocab_size)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelArgs":
        """Build from an HF-style config dict (a `config.json`, a text_config, or an artifact component config)."""
        cfg = dict(config)
        if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrapper: the text part is what runs
            cfg = {**cfg["text_config"], "architectures": cfg.get("architectures", [])}
        try:
            hidden = int(cfg["hidden_size"])
            n_layers = int(cfg["num_hidden_layers"])
            vocab = int(cfg["vocab_size"])
        except KeyError as e:
            raise NinferError(f"model config lacks {e.args[0]!r}", "check the artifact or config.json") from None
        model_type = str(cfg.get("model_type", ""))
        if model_type in ("qwen3_5", "qwen3_5_moe"):
            model_type += "_text"
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        heads = int(cfg.get("num_attention_heads", 0))
        head_dim = int(cfg.get("head_dim") or (hidden // heads if heads else 0))
        qwen = model_type.startswith("qwen3_5")
        if qwen and "partial_rotary_factor" not in rope and "partial_rotary_factor" not in cfg:
            partial = 0.25  # transformers' default for Qwen3.5
        eos = cfg.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        domain = cfg.get("token_domain")
        if domain is None and qwen and vocab == QWEN_VOCAB_ROWS:
            domain = QWEN_TOKEN_DOMAIN
        return cls(
            model_type=model_type,
            hidden_size=hidden,
            num_hidden_layers=n_layers,
            vocab_size=vocab,
            architectures=tuple(cfg.get("architectures") or ()),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            layer_types=layer_schedule(cfg, n_layers),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=head_dim,
            rope_theta=theta,
            partial_rotary_factor=partial,
            attention_gated=qwen,
            linear_num_key_heads=int(cfg.get("linear_num_key_heads", 0)),
            linear_key_head_dim=int(cfg.get("linear_key_head_dim", 0)),
            linear_num_value_heads=int(cfg.get("linear_num_value_heads", 0)),
            linear_value_head_dim=int(cfg.get("linear_value_head_dim", 0)),
            linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim", 4)),
            intermediate_size=int(cfg.get("intermediate_size", 0) or 0),
            num_experts=int(cfg.get("num_experts", 0) or 0),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok", 0) or 0),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size", 0) or 0),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 0) or 0),
            mtp_num_hidden_layers=int(cfg.get("mtp_num_hidden_layers", 0) or 0),
            token_domain=None if domain is None else int(domain),
            eos_token_id=eos,
        )

    @classmethod
    def from_artifact(cls, artifact) -> "ModelArgs":
        """Build from `artifact.components["text"]["config"]`; an `mtp` component sets one MTP layer."""
        comps = artifact.components
        if "text" not in comps or "config" not in comps["text"]:
            raise NinferError("the artifact has no text component config", "re-convert the model with `ninfer convert`")
        cfg = dict(comps["text"]["config"])
        if "mtp" in comps and not cfg.get("mtp_num_hidden_layers"):
            cfg["mtp_num_hidden_layers"] = 1
        return cls.from_config(cfg)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelArgs":
        """Build from a Hugging Face `config.json` file."""
        return cls.from_config(json.loads(Path(path).read_text()))


def layer_schedule(cfg: Mapping[str, Any], n_layers: int) -> tuple[str, ...]:
    """Per-layer mixer kind: `layer_types` when given, else every `full_attention_interval`-th layer is full.

    Models without either (Llama) are all full attention.
    """
    types = cfg.get("layer_types")
    if types:
        if len(types) != n_layers:
            raise NinferError(
                f"config has {len(types)} layer_types for {n_layers} layers", "check the model config"
            )
        bad = set(types) - {FULL, LINEAR}
        if bad:
            raise NinferError(f"unknown layer types {sorted(bad)}", "this model is not supported")
        return tuple(types)
    interval = cfg.get("full_attention_interval")
    if interval is None and str(cfg.get("model_type", "")).startswith("qwen3_5"):
        interval = 4
    if interval:
        return tuple(FULL if (i + 1) % int(interval) == 0 else LINEAR for i in range(n_layers))
    return (FULL,) * n_layers
