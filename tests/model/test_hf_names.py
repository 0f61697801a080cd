"""hf_to_logical: Hugging Face Qwen3.5 names and layouts -> logical parameters (container.md §2.3)."""
import numpy as np
import pytest

from engine.config import ModelArgs
from engine.models.qwen3_5 import hf_to_logical, logical_shapes

CFG = {"model_type": "qwen3_5_moe_text", "hidden_size": 8, "num_hidden_layers": 4, "vocab_size": 32,
       "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "linear_num_key_heads": 1,
       "linear_key_head_dim": 4, "linear_num_value_heads": 2, "linear_value_head_dim": 4, "num_experts": 3,
       "num_experts_per_tok": 2, "moe_intermediate_size": 5, "shared_expert_intermediate_size": 6,
       "mtp_num_hidden_layers": 1}


def one(name, arr):
    out = hf_to_logical(name, arr, CFG)
    assert len(out) == 1
    return out[0]


@pytest.mark.parametrize("prefix", ["model.", "model.language_model."])
def test_plain_renames_under_both_prefixes(prefix):
    a = np.zeros(8)
    assert one(prefix + "embed_tokens.weight", a)[0] == "text/token_embedding"
    assert one(prefix + "norm.weight", a)[0] == "text/final_norm"
    assert one(prefix + "layers.2.linear_attn.A_log", a)[0] == "text/layers/2/gdn/a_log"
    assert one(prefix + "layers.3.self_attn.q_norm.weight", a)[0] == "text/layers/3/attention/query_norm"
    assert one(prefix + "layers.0.mlp.shared_expert_gate.weight", a)[0] == "text/layers/0/moe/shared_score"
    assert one("lm_head.weight", a)[0] == "text/output_head"


def test_q_proj_is_split_per_head_interleaved():
    rows = np.arange(2 * 2 * 4)[:, None] * np.ones((1, 8))  # row r holds value r
    out = dict(hf_to_logical("model.layers.3.self_attn.q_proj.weight", rows, CFG))
    assert out["text/layers/3/attention/query"][:, 0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    assert out["text/layers/3/attention/gate"][:, 0].tolist() == [4, 5, 6, 7, 12, 13, 14, 15]


def test_gdn_qkv_split_and_conv_layout():
    qkv = np.arange(16)[:, None] * np.ones((1, 8))
    out = dict(hf_to_logical("model.layers.0.linear_attn.in_proj_qkv.weight", qkv, CFG))
    assert [out[f"text/layers/0/gdn/{n}"].shape[0] for n in ("query", "key", "value")] == [4, 4, 8]
    assert out["text/layers/0/gdn/value"][0, 0] == 8
    conv = np.arange(16 * 4).reshape(16, 1, 4)  # [C, 1, K]
    name, w = one("model.layers.0.linear_attn.conv1d.weight", conv)
    assert name == "text/layers/0/gdn/convolution" and w.shape == (4, 16)
    assert w[1, 2] == conv[2, 0, 1]  # tap-major: w[j, c] = conv[c, 0, j]


def test_fused_and_per_expert_moe():
    gate_up = np.arange(3 * 10)[:, None].reshape(3, 10, 1) * np.ones((1, 1, 8))
    out = dict(hf_to_logical("model.layers.1.mlp.experts.gate_up_proj", gate_up, CFG))
    assert out["text/layers/1/moe/experts/2/gate"][:, 0].tolist() == [20, 21, 22, 23, 24]
    assert out["text/layers/1/moe/experts/2/up"][:, 0].tolist() == [25, 26, 27, 28, 29]
    down = dict(hf_to_logical("model.layers.1.mlp.experts.down_proj", np.zeros((3, 8, 5)), CFG))
    assert sorted(down) == [f"text/layers/1/moe/experts/{e}/down" for e in range(3)]
    assert one("model.layers.1.mlp.experts.7.up_proj.weight", np.zeros((5, 8)))[0] == "text/layers/1/moe/experts/7/up"


def test_mtp_names_and_ignored_vision():
    assert one("mtp.fc.weight", np.zeros((8, 16)))[0] == "mtp/input_projection"
    assert one("mtp.pre_fc_norm_embedding.weight", np.zeros(8))[0] == "mtp/embedding_norm"
    assert one("mtp.pre_fc_norm_hidden.weight", np.zeros(8))[0] == "mtp/hidden_norm"
    assert one("mtp.norm.weight", np.zeros(8))[0] == "mtp/final_norm"
    assert one("mtp.layers.0.self_attn.o_proj.weight", np.zeros((8, 8)))[0] == "mtp/layers/0/attention/output"
    assert hf_to_logical("model.visual.blocks.0.attn.qkv.weight", np.zeros(3), CFG) == []
    with pytest.raises(ValueError):
        hf_to_logical("model.layers.0.mystery.weight", np.zeros(3), CFG)
    with pytest.raises(ValueError):
        hf_to_logical("encoder.weight", np.zeros(3), CFG)


def test_every_logical_name_of_the_model_is_produced_with_its_shape():
    """A full fake checkpoint in HF layout maps onto exactly logical_shapes()."""
    args = ModelArgs.from_config(CFG)
    h, hq, d, kv = 8, 2, 4, 1
    hf = {"model.embed_tokens.weight": (32, h), "model.norm.weight": (h,), "lm_head.weight": (32, h),
          "mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
          "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
    blocks = [(f"model.layers.{i}.", t) for i, t in enumerate(args.layer_types)] + [("mtp.layers.0.", "full_attention")]
    for p, kind in blocks:
        hf |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
               p + "mlp.gate.weight": (3, h), p + "mlp.shared_expert_gate.weight": (1, h),
               p + "mlp.experts.gate_up_proj": (3, 10, h), p + "mlp.experts.down_proj": (3, h, 5),
               p + "mlp.shared_expert.gate_proj.weight": (6, h), p + "mlp.shared_expert.up_proj.weight": (6, h),
               p + "mlp.shared_expert.down_proj.weight": (h, 6)}
        if kind == "linear_attention":
            hf |= {p + "linear_attn.in_proj_qkv.weight": (16, h), p + "linear_attn.in_proj_z.weight": (8, h),
                   p + "linear_attn.in_proj_a.weight": (2, h), p + "linear_attn.in_proj_b.weight": (2, h),
                   p + "linear_attn.A_log": (2,), p + "linear_attn.dt_bias": (2,),
                   p + "linear_attn.conv1d.weight": (16, 1, 4), p + "linear_attn.norm.weight": (4,),
                   p + "linear_attn.out_proj.weight": (h, 8)}
        else:
            hf |= {p + "self_attn.q_proj.weight": (2 * hq * d, h), p + "self_attn.k_proj.weight": (kv * d, h),
                   p + "self_attn.v_proj.weight": (kv * d, h), p + "self_attn.o_proj.weight": (h, hq * d),
                   p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
    got = {}
    for name, shape in hf.items():
        dummy = np.broadcast_to(np.zeros((), np.float32), shape)  # how the importer plans without reading
        for lname, a in hf_to_logical(name, dummy, CFG):
            assert lname not in got
            got[lname] = tuple(a.shape)
    assert got == {k: tuple(v) for k, v in logical_shapes(args).items()}
