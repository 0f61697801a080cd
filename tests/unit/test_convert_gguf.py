"""GGUF -> v3: values kept, llama.cpp's q/k permutation undone (HF split-half RoPE), tokenizer carried."""
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.artifact import formats as F
from engine.artifact.container import open_artifact
from engine.artifact.from_gguf import convert
from engine.errors import NinferError

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "artifact"
H, L, FF, NH, NKV, V = 64, 2, 96, 4, 2, 300
D = H // NH
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def llama_cpp_permute(w, n_head):
    """What llama.cpp's convert_hf_to_gguf does to q/k rows (HF split-half -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_weights(seed=0):
    rng = np.random.default_rng(seed)
    w = {"text/token_embedding": rng.standard_normal((V, H)).astype(np.float32) * 0.1,
         "text/final_norm": 1 + 0.1 * rng.standard_normal(H).astype(np.float32)}
    for i in range(L):
        p = f"text/layers/{i}/"
        w.update({p + "input_norm": 1 + 0.1 * rng.standard_normal(H).astype(np.float32),
                  p + "post_attention_norm": 1 + 0.1 * rng.standard_normal(H).astype(np.float32),
                  p + "attention/query": rng.standard_normal((NH * D, H)).astype(np.float32) * 0.1,
                  p + "attention/key": rng.standard_normal((NKV * D, H)).astype(np.float32) * 0.1,
                  p + "attention/value": rng.standard_normal((NKV * D, H)).astype(np.float32) * 0.1,
                  p + "attention/output": rng.standard_normal((H, NH * D)).astype(np.float32) * 0.1,
                  p + "mlp/gate": rng.standard_normal((FF, H)).astype(np.float32) * 0.1,
                  p + "mlp/up": rng.standard_normal((FF, H)).astype(np.float32) * 0.1,
                  p + "mlp/down": rng.standard_normal((H, FF)).astype(np.float32) * 0.1})
    return w


GG_NAMES = {"input_norm": "attn_norm", "post_attention_norm": "ffn_norm", "attention/query": "attn_q",
            "attention/key": "attn_k", "attention/value": "attn_v", "attention/output": "attn_output",
            "mlp/gate": "ffn_gate", "mlp/up": "ffn_up", "mlp/down": "ffn_down"}


def add_tokenizer(w, n_vocab):
    """The tiny byte-level BPE of the HF fixtures, as GGUF tokenizer metadata."""
    tok = json.loads((FIX / "hf_dense" / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = [a["content"] for a in tok["added_tokens"]]
    tokens = specials + [t for t, _ in vocab if t not in specials]
    tokens += [f"<extra_{i}>" for i in range(n_vocab - len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)


def write_llama_gguf(path, weights, quantize_down=False):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    add_tokenizer(w, V)
    w.add_tensor("token_embd.weight", weights["text/token_embedding"])
    w.add_tensor("output_norm.weight", weights["text/final_norm"])
    for i in range(L):
        for role, gg in GG_NAMES.items():
            a = weights[f"text/layers/{i}/{role}"]
            if role == "attention/query":
                a = llama_cpp_permute(a, NH)
            elif role == "attention/key":
                a = llama_cpp_permute(a, NKV)
            if quantize_down and role == "mlp/down":
                q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(f"blk.{i}.{gg}.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                w.add_tensor(f"blk.{i}.{gg}.weight", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    weights = hf_weights()
    write_llama_gguf(path, weights, quantize_down=True)
    return path, weights


def test_fp32_default_round_trip_and_unpermuted_qk(tmp_path, gguf_file):
    path, weights = gguf_file
    art = open_artifact(convert(path, tmp_path / "t.ninfer"))
    assert art.provenance["recipe"] == "fp32"  # under 1B parameters
    assert {o.format for o in art.objects.values() if o.kind == "tensor"} == {"fp32"}
    assert "text/output_head" not in art.bindings  # tied
    assert {"parameter": "text/layers/1/mlp/down", "input": "text/layers/1/mlp/product",
            "activation_policy": "A16Only"} in art.uses
    reader = gguf.GGUFReader(str(path))
    for name, want in weights.items():
        got = art.parameter(name)
        if name.endswith("mlp/down"):  # stored as Q8_0 in the GGUF: gguf's own dequantization, exactly
            t = next(t for t in reader.tensors if t.name == f"blk.{name.split('/')[2]}.ffn_down.weight")
            assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
            want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(H, FF)
            assert not np.array_equal(want, weights[name])
        assert np.array_equal(got, want), name  # q/k come back in HF order, bit for bit
    cfg = art.components["text"]["config"]
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["bos_token_id"], cfg["eos_token_id"]) == (NH, NKV, 0, 2)
    assert art.resource("chat_template.jinja").decode() == TEMPLATE
    raw = json.loads(art.resource("gguf_tokenizer.json"))
    assert raw["model"] == "gpt2" and len(raw["tokens"]) == V
    from tokenizers import Tokenizer

    tk = Tokenizer.from_str(art.resource("tokenizer.json").decode())
    assert tk.decode(tk.encode("Hello world").ids) == "Hello world"


def test_rope_conventions_agree_after_unpermute(gguf_file):
    """GGUF rows rotate adjacent pairs (GPT-J style); after unpermuting, HF's split-half (NeoX) rope
    applied to our rows gives the same vector, reordered: so q.k scores are unchanged."""
    from engine.ops.ref import rope

    _, weights = gguf_file
    wq = weights["text/layers/0/attention/query"]
    h = np.random.default_rng(1).standard_normal(H).astype(np.float32)
    pos = np.array([7])
    q_hf = (wq @ h).reshape(1, NH, D)
    q_gg = (llama_cpp_permute(wq, NH) @ h).reshape(1, NH, D)
    inv = 10000.0 ** (-np.arange(0, D, 2) / D)
    ang = pos[:, None] * inv[None]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x0, x1 = q_gg[..., 0::2], q_gg[..., 1::2]
    gg_rot = np.empty_like(q_gg)
    gg_rot[..., 0::2], gg_rot[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    hf_rot = rope(q_hf, pos, D, 10000.0)
    np.testing.assert_allclose(llama_cpp_permute(hf_rot.reshape(NH * D, 1), NH).reshape(1, NH, D), gg_rot,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("recipe", ["bf16", "q8", "groupwise-int"])
def test_recipes(tmp_path, gguf_file, recipe):
    path, weights = gguf_file
    art = open_artifact(convert(path, tmp_path / "r.ninfer", recipe))
    q = art.parameter("text/layers/0/attention/query")
    obj = art.objects["text/layers/0/attention/query"]
    want = weights["text/layers/0/attention/query"]
    if recipe == "bf16":
        assert obj.format == "bf16" and np.array_equal(q, F.bf16_bits_to_f32(F.f32_to_bf16_bits(want)))
    else:
        assert obj.format in F.GROUPWISE
        err = np.pad(np.abs(q - want), ((0, 0), (0, 64))).reshape(want.shape[0], -1, F.GROUPWISE[obj.format][1]).max(-1)
        assert (err <= F.max_abs_error(obj.format, want)).all()
    assert art.objects["text/final_norm"].format == "bf16"


def test_engine_matches_source_weights(tmp_path, gguf_file):
    import engine

    path, weights = gguf_file
    art = open_artifact(convert(path, tmp_path / "e.ninfer"))
    cfg = art.components["text"]["config"]
    src = dict(weights)
    for i in range(L):  # down projections were stored as Q8_0
        src[f"text/layers/{i}/mlp/down"] = art.parameter(f"text/layers/{i}/mlp/down")
    ids = [3, 50, 7, 120]
    np.testing.assert_array_equal(engine.load(art, device="cpu").logits(ids),
                                  engine.load({"config": cfg, "weights": src}, device="cpu").logits(ids))


def test_bad_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 5)
    with pytest.raises(NinferError, match="not a readable GGUF") as e:
        convert(bad, tmp_path / "o.ninfer")
    assert str(bad) in e.value.message
    w = gguf.GGUFWriter(str(tmp_path / "gpt.gguf"), "gpt2")
    w.add_tensor("x.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(NinferError, match="architecture 'gpt2' is not supported"):
        convert(tmp_path / "gpt.gguf", tmp_path / "o.ninfer")
    assert not (tmp_path / "o.ninfer").exists()
