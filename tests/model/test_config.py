"""engine.config.ModelArgs from HF configs and artifact components; the layer schedule."""
import types

import pytest

from engine.config import FULL, LINEAR, QWEN_TOKEN_DOMAIN, ModelArgs
from engine.errors import NinferError

BASE = {"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 248320,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 96,
        "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_num_value_heads": 6, "linear_value_head_dim": 16,
        "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25}}


def test_schedule_from_layer_types():
    types_ = [LINEAR, FULL] * 4
    a = ModelArgs.from_config({**BASE, "layer_types": types_})
    assert a.layer_types == tuple(types_) and a.full_attention_layers == (1, 3, 5, 7)


@pytest.mark.parametrize("interval,full", [(4, (3, 7)), (2, (1, 3, 5, 7)), (8, (7,))])
def test_schedule_from_interval(interval, full):
    a = ModelArgs.from_config({**BASE, "full_attention_interval": interval})
    assert a.full_attention_layers == full
    assert all(t == LINEAR for i, t in enumerate(a.layer_types) if i not in full)


def test_qwen_default_interval_is_four_and_llama_is_all_attention():
    assert ModelArgs.from_config(BASE).full_attention_layers == (3, 7)
    llama = ModelArgs.from_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 3,
                                   "vocab_size": 100, "num_attention_heads": 4})
    assert llama.layer_types == (FULL,) * 3 and llama.head_dim == 16 and llama.rotary_dim == 16


def test_bad_schedules_are_user_errors():
    with pytest.raises(NinferError):
        ModelArgs.from_config({**BASE, "layer_types": [LINEAR] * 3})
    with pytest.raises(NinferError):
        ModelArgs.from_config({**BASE, "layer_types": ["sliding_attention"] * 8})
    with pytest.raises(NinferError):
        ModelArgs.from_config({"model_type": "qwen3_5_text"})


def test_geometry_and_domain():
    a = ModelArgs.from_config(BASE)
    assert a.rotary_dim == 64 and a.attention_gated and not a.is_moe
    assert a.gdn_conv_channels == 2 * 32 + 96 and a.linear_value_dim == 96
    assert a.token_domain == QWEN_TOKEN_DOMAIN and a.domain == 248077
    small = ModelArgs.from_config({**BASE, "vocab_size": 384})
    assert small.token_domain is None and small.domain == 384
    no_rope = {k: v for k, v in BASE.items() if k != "rope_parameters"}
    assert ModelArgs.from_config(no_rope).partial_rotary_factor == 0.25  # transformers' Qwen3.5 default


def test_multimodal_wrapper_and_moe_fields():
    cfg = {"model_type": "qwen3_5_moe", "architectures": ["Qwen3_5MoeForConditionalGeneration"],
           "text_config": {**BASE, "model_type": "qwen3_5_moe_text", "num_experts": 8, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32}}
    a = ModelArgs.from_config(cfg)
    assert a.model_type == "qwen3_5_moe_text" and a.is_moe and a.num_experts_per_tok == 2
    assert a.architectures == ("Qwen3_5MoeForConditionalGeneration",)


def test_from_artifact_components():
    art = types.SimpleNamespace(components={"text": {"config": BASE}, "mtp": {"config": {}, "target": "text"}})
    assert ModelArgs.from_artifact(art).mtp_num_hidden_layers == 1
    with pytest.raises(NinferError):
        ModelArgs.from_artifact(types.SimpleNamespace(components={"vision": {}}))
