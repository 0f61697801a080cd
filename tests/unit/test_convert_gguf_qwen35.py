"""qwen35 / qwen35moe GGUF -> v3: a GGUF written from the tiny HF checkpoints with llama.cpp's
conversion rules (norms + 1, ssm_a = -exp(A_log), value heads tiled, conv [C, K]) imports back to
the same parameters as the HF import."""
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.artifact import formats as F
from engine.artifact.container import open_artifact
from engine.artifact.from_gguf import convert as from_gguf
from engine.artifact.from_hf import SafetensorsFile, _shards, convert as from_hf, text_config
from tests.unit.test_convert_gguf import add_tokenizer

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "artifact"


def _hf(folder):
    out = {}
    for shard in map(SafetensorsFile, _shards(folder)):
        for name in shard.tensors:
            a = shard.array(name)
            out[name] = F.bf16_bits_to_f32(a) if a.dtype == np.uint16 else np.array(a, np.float32)
    return out


def _tile(w, kh, per_k, hd):
    """HF grouped value heads [kh, per_k, hd, ...] -> llama.cpp tiled [per_k, kh, hd, ...] (rows)."""
    return w.reshape(kh, per_k, hd, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)


def write_qwen35_gguf(path, folder):
    cfg = text_config(json.loads((folder / "config.json").read_text()))
    moe = bool(cfg.get("num_experts"))
    arch = "qwen35moe" if moe else "qwen35"
    kh, vh, kd, vd = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                      cfg["linear_value_head_dim"])
    per_k, qk = vh // kh, 2 * kh * kd
    L = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(str(path), arch)
    u32 = lambda k, v: w.add_uint32(f"{arch}.{k}", v)  # noqa: E731
    hf = _hf(folder)
    has_mtp = "mtp.fc.weight" in hf
    u32("block_count", L + has_mtp)
    if has_mtp:
        u32("nextn_predict_layers", 1)
    u32("context_length", cfg["max_position_embeddings"])
    u32("embedding_length", cfg["hidden_size"])
    u32("attention.head_count", cfg["num_attention_heads"])
    u32("attention.head_count_kv", cfg["num_key_value_heads"])
    if not moe:  # the MoE file leaves key_length out: head_dim then comes from attn_q_norm
        u32("attention.key_length", cfg["head_dim"])
    u32("attention.value_length", cfg["head_dim"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    w.add_float32(f"{arch}.rope.freq_base", cfg["rope_parameters"]["rope_theta"])
    u32("rope.dimension_count", int(cfg["head_dim"] * cfg["rope_parameters"]["partial_rotary_factor"]))
    w.add_array(f"{arch}.rope.dimension_sections", cfg["rope_parameters"]["mrope_section"] + [0])
    u32("ssm.group_count", kh)
    u32("ssm.state_size", kd)
    u32("ssm.time_step_rank", vh)
    u32("ssm.inner_size", vh * vd)
    u32("ssm.conv_kernel", cfg["linear_conv_kernel_dim"])
    u32("full_attention_interval", 4)
    if moe:
        u32("expert_count", cfg["num_experts"])
        u32("expert_used_count", cfg["num_experts_per_tok"])
        u32("expert_feed_forward_length", cfg["moe_intermediate_size"])
        u32("expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"])
    else:
        u32("feed_forward_length", cfg["intermediate_size"])
    add_tokenizer(w, cfg["vocab_size"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
             "linear_attn.norm": "ssm_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
             "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
             "mlp.shared_expert.down_proj": "ffn_down_shexp"}
    w.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", hf["model.norm.weight"] + 1)
    w.add_tensor("output.weight", hf["lm_head.weight"])
    blocks = [(i, {k[len(f"model.layers.{i}."):]: v for k, v in hf.items() if k.startswith(f"model.layers.{i}.")})
              for i in range(L)]
    mtp_layer = {k[len("mtp.layers.0."):]: v for k, v in hf.items() if k.startswith("mtp.layers.0.")}
    if mtp_layer:  # llama.cpp appends the MTP block as block L, with its own nextn.* tensors
        blocks.append((L, mtp_layer))
        w.add_tensor(f"blk.{L}.nextn.eh_proj.weight", hf["mtp.fc.weight"])
        w.add_tensor(f"blk.{L}.nextn.enorm.weight", hf["mtp.pre_fc_norm_embedding.weight"] + 1)
        w.add_tensor(f"blk.{L}.nextn.hnorm.weight", hf["mtp.pre_fc_norm_hidden.weight"] + 1)
        w.add_tensor(f"blk.{L}.nextn.shared_head_norm.weight", hf["mtp.norm.weight"] + 1)
        w.add_tensor(f"blk.{L}.nextn.embed_tokens.weight", hf["model.embed_tokens.weight"])
    for i, layer in blocks:
        for key in sorted(layer):
            a, rest = layer[key], key.removesuffix(".weight")
            if rest in names:
                if names[rest] in ("attn_norm", "post_attention_norm", "attn_q_norm", "attn_k_norm"):
                    a = a + 1
                w.add_tensor(f"blk.{i}.{names[rest]}.weight", a)
            elif rest == "linear_attn.in_proj_qkv":
                w.add_tensor(f"blk.{i}.attn_qkv.weight", np.concatenate([a[:qk], _tile(a[qk:], kh, per_k, vd)]))
            elif rest == "linear_attn.in_proj_z":
                w.add_tensor(f"blk.{i}.attn_gate.weight", _tile(a, kh, per_k, vd))
            elif rest in ("linear_attn.in_proj_a", "linear_attn.in_proj_b"):
                w.add_tensor(f"blk.{i}.ssm_{'alpha' if rest.endswith('a') else 'beta'}.weight", _tile(a, kh, per_k, 1))
            elif rest == "linear_attn.A_log":
                w.add_tensor(f"blk.{i}.ssm_a", -np.exp(_tile(a, kh, per_k, 1)))
            elif rest == "linear_attn.dt_bias":
                w.add_tensor(f"blk.{i}.ssm_dt.bias", _tile(a, kh, per_k, 1))
            elif rest == "linear_attn.conv1d":
                c = a[:, 0, :]
                w.add_tensor(f"blk.{i}.ssm_conv1d.weight", np.concatenate([c[:qk], _tile(c[qk:], kh, per_k, vd)]))
            elif rest == "linear_attn.out_proj":
                n = a.shape[0]
                w.add_tensor(f"blk.{i}.ssm_out.weight", a.reshape(n, kh, per_k, vd).swapaxes(1, 2).reshape(n, -1))
            elif rest == "mlp.experts.gate_up_proj":
                inter = a.shape[1] // 2
                if i % 2:  # both spellings occur: separate gate/up stacks, or one fused stack
                    w.add_tensor(f"blk.{i}.ffn_gate_up_exps.weight", a)
                else:
                    w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(a[:, :inter]))
                    w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(a[:, inter:]))
            elif rest == "mlp.experts.down_proj":
                w.add_tensor(f"blk.{i}.ffn_down_exps.weight", a)
            else:
                raise AssertionError(f"test writer does not know {key}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("fixture", ["hf_dense", "hf_moe"])
def test_qwen35_gguf_matches_hf_import(tmp_path, fixture):
    path = tmp_path / "q.gguf"
    write_qwen35_gguf(path, FIX / fixture)
    gg = open_artifact(from_gguf(path, tmp_path / "g.ninfer"))
    hf = open_artifact(from_hf(FIX / fixture, tmp_path / "h.ninfer", "fp32"))
    assert gg.provenance["recipe"] == "fp32"
    want = set(hf.bindings)  # MTP included for the dense fixture, which has an MTP head
    assert set(gg.bindings) == want and (("mtp" in gg.components) == ("mtp" in hf.components))
    for name in sorted(want):
        np.testing.assert_allclose(gg.parameter(name), hf.parameter(name), rtol=2e-6, atol=2e-7, err_msg=name)
    gcfg, hcfg = gg.components["text"]["config"], hf.components["text"]["config"]
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads", "num_key_value_heads",
                "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim",
                "vocab_size", "tie_word_embeddings", "num_experts", "moe_intermediate_size", "intermediate_size"):
        assert gcfg.get(key) == hcfg.get(key), key
    assert gcfg["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert gcfg["rope_parameters"]["mrope_section"] == [2, 1, 1]
    import engine

    ids = [4, 99, 17, 250, 3]
    np.testing.assert_allclose(engine.load(gg, device="cpu").logits(ids), engine.load(hf, device="cpu").logits(ids),
                               rtol=0, atol=2e-5)
