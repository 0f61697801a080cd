"""Hugging Face Qwen3.5 checkpoints (tiny, saved by transformers: dev/make_hf_checkpoints.py) -> v3."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.artifact import formats as F
from engine.artifact.container import open_artifact
from engine.artifact.from_hf import SafetensorsFile, _shards, choose_format, convert, text_config
from engine.config import ModelArgs
from engine.errors import NinferError
from engine.models.qwen3_5 import hf_to_logical, logical_shapes

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "artifact"


def _source(folder):
    """Logical name -> float32 source values, through the model file's own mapping."""
    cfg = text_config(json.loads((folder / "config.json").read_text()))
    args = ModelArgs.from_config(cfg)
    out = {}
    for shard in map(SafetensorsFile, _shards(folder)):
        for name in shard.tensors:
            arr = shard.array(name)
            for logical, a in hf_to_logical(name, arr, args):
                a = np.asarray(a)
                out[logical] = F.bf16_bits_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)
    return out


def _check_within_format_error(art, source):
    assert set(art.bindings) == set(source)
    for name, want in source.items():
        obj = art.objects[art.bindings[name]["object"]]
        got = art.parameter(name)
        assert got.shape == want.shape, name
        if obj.format in F.GROUPWISE:
            G = F.GROUPWISE[obj.format][1]
            geo = F.rowsplit_geometry(obj.format, want.shape)
            err = np.zeros((geo.n, geo.k_pad), np.float32)
            err[:, : geo.k] = np.abs(got - want)
            assert (err.reshape(geo.n, -1, G).max(-1) <= F.max_abs_error(obj.format, want)).all(), name
        elif obj.format == "bf16":
            np.testing.assert_allclose(got, want, rtol=2.0 ** -8, atol=0, err_msg=name)
        else:
            assert np.array_equal(got, want), name


@pytest.mark.parametrize("fixture", ["hf_dense", "hf_moe", "hf_moe_split"])
@pytest.mark.parametrize("recipe", ["groupwise-int", "q8", "bf16"])
def test_every_parameter_decodes_within_format_error(tmp_path, fixture, recipe):
    out = convert(FIX / fixture, tmp_path / "m.ninfer", recipe)
    art = open_artifact(out)
    _check_within_format_error(art, _source(FIX / fixture))
    args = ModelArgs.from_artifact(art)
    assert set(art.bindings) == set(logical_shapes(args, mtp="mtp" in art.components))
    assert art.provenance["recipe"] == recipe
    formats = {o.format for o in art.objects.values() if o.kind == "tensor"}
    if recipe == "bf16":
        assert formats == {"bf16", "fp32"}
    if recipe == "groupwise-int":
        assert art.objects["text/token_embedding"].format == ("q8_g32_fp16" if "moe" in fixture else "q6_g64_fp16")
        assert art.objects["text/output_head"].format == "q6_g64_fp16"
        assert art.objects["text/layers/0/gdn/a_log"].format == "fp32"
        assert art.objects["text/layers/0/gdn/convolution"].format == "bf16"
    tok = json.loads(art.resource("tokenizer.json"))
    assert tok["model"]["type"] == "BPE"
    assert b"im_start" in art.resource("chat_template.jinja")


def test_dense_layout_details(tmp_path):
    art = open_artifact(convert(FIX / "hf_dense", tmp_path / "d.ninfer", "bf16"))
    cfg = art.components["text"]["config"]
    assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
    assert "mtp" in art.components and "mtp/layers/0/attention/gate" in art.bindings
    shard = {n: s for s in map(SafetensorsFile, _shards(FIX / "hf_dense")) for n in s.tensors}
    conv = F.bf16_bits_to_f32(shard["model.layers.0.linear_attn.conv1d.weight"].array("model.layers.0.linear_attn.conv1d.weight"))
    assert np.array_equal(art.parameter("text/layers/0/gdn/convolution"), conv[:, 0, :].T)  # tap-major [K, C]
    q = F.bf16_bits_to_f32(shard["model.layers.3.self_attn.q_proj.weight"].array("model.layers.3.self_attn.q_proj.weight"))
    per_head = q.reshape(2, 64, 64)  # heads, [query 32 | gate 32], hidden
    assert np.array_equal(art.parameter("text/layers/3/attention/query"), per_head[:, :32].reshape(64, 64))
    assert np.array_equal(art.parameter("text/layers/3/attention/gate"), per_head[:, 32:].reshape(64, 64))


def test_fused_and_per_expert_moe_agree(tmp_path):
    fused = open_artifact(convert(FIX / "hf_moe", tmp_path / "a.ninfer", "bf16"))
    split = open_artifact(convert(FIX / "hf_moe_split", tmp_path / "b.ninfer", "bf16"))
    assert list(fused.bindings) == list(split.bindings)
    for name in ("text/layers/1/moe/experts/3/gate", "text/layers/1/moe/experts/3/up", "text/layers/2/moe/experts/0/down"):
        assert np.array_equal(fused.parameter(name), split.parameter(name))  # bf16 source = RNE of the fp32 one


def test_progress_and_split(tmp_path):
    seen = []
    convert(FIX / "hf_dense", tmp_path / "p.ninfer", "q8", split_limit=200_000,
            progress=lambda done, total, name: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] and all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    art = open_artifact(tmp_path / "p.ninfer")
    assert len(art.parts) >= 1
    _check_within_format_error(art, _source(FIX / "hf_dense"))


def test_bad_checkpoints(tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(FIX / "hf_dense", bad)
    (bad / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(NinferError, match="missing"):
        convert(bad, tmp_path / "x.ninfer")
    (bad / "model.safetensors.index.json").unlink()
    with pytest.raises(NinferError, match="lacks"):
        convert(bad, tmp_path / "x.ninfer")
    cfg = json.loads((FIX / "hf_dense" / "config.json").read_text())
    shutil.copy(FIX / "hf_dense" / "model-00002-of-00002.safetensors", bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 128}))
    with pytest.raises(NinferError, match="config says"):
        convert(bad, tmp_path / "x.ninfer")
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(NinferError, match="not a Qwen3.5"):
        convert(bad, tmp_path / "x.ninfer")
    with pytest.raises(NinferError, match="unknown recipe"):
        convert(FIX / "hf_dense", tmp_path / "x.ninfer", "q3")
    assert not (tmp_path / "x.ninfer").exists()


def test_engine_runs_the_converted_model(tmp_path):
    import engine

    art = open_artifact(convert(FIX / "hf_moe", tmp_path / "e.ninfer", "bf16"))
    cfg = text_config(json.loads((FIX / "hf_moe" / "config.json").read_text()))
    ref = engine.load({"config": cfg, "weights": _source(FIX / "hf_moe")}, device="cpu")
    got = engine.load(art, device="cpu")
    ids = [5, 17, 200, 3, 99, 42]
    np.testing.assert_allclose(got.logits(ids), ref.logits(ids), rtol=0, atol=1e-5)


def test_multimodal_wrapper_checkpoint(tmp_path):
    """Qwen3.5/3.6 releases are `...ForConditionalGeneration`: text under `model.language_model.`, a
    `text_config`, and vision tensors that a text-only import leaves out."""
    from safetensors.numpy import load_file, save_file

    src = FIX / "hf_moe_split"
    folder = tmp_path / "vl"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder)
    flat = json.loads((src / "config.json").read_text())
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "tie_word_embeddings": False, "eos_token_id": 257,
              "text_config": {k: v for k, v in flat.items() if k not in ("architectures", "tie_word_embeddings", "eos_token_id")},
              "vision_config": {"depth": 1, "hidden_size": 16}}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {}
    for k, v in load_file(str(src / "model.safetensors")).items():
        tensors[k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k] = v
    tensors["model.visual.patch_embed.proj.weight"] = np.ones((16, 3, 2, 4, 4), np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    art = open_artifact(convert(folder, tmp_path / "vl.ninfer", "bf16"))
    cfg = art.components["text"]["config"]
    assert cfg["architectures"] == ["Qwen3_5MoeForCausalLM"] and cfg["model_type"] == "qwen3_5_moe_text"
    assert cfg["eos_token_id"] == 257 and cfg["tie_word_embeddings"] is False
    assert not any(n.startswith("vision") or "visual" in n for n in art.bindings)
    ref = open_artifact(convert(src, tmp_path / "ref.ninfer", "bf16"))
    assert list(art.bindings) == list(ref.bindings)
    assert np.array_equal(art.parameter("text/layers/2/moe/experts/1/up"), ref.parameter("text/layers/2/moe/experts/1/up"))


@pytest.mark.parametrize("model, moe, n_layers", [("qwen3.6-27b", False, 64), ("qwen3.6-35b-a3b", True, 40)])
def test_groupwise_recipe_matches_the_published_inventories(model, moe, n_layers):
    """Every text/MTP parameter gets the format the published artifact stores it in."""
    import gzip

    inv = json.loads(gzip.decompress((FIX / f"inventory-{model}-groupwise-int.json.gz").read_bytes()))
    checked = 0
    for o in inv["objects"]:
        if o["kind"] != "tensor" or not o["name"].startswith(("text/", "mtp/")) or "draft_head" in o["name"]:
            continue
        params = [b["parameter"] for b in o.get("v3_bindings", [])]
        if o.get("v3_bindings_pattern"):
            params = [p["parameter"].replace("{e}", "7") for p in o["v3_bindings_pattern"]["parameters"]]
        shape = (8, 8) if len(o["shape"]) == 2 else tuple(o["shape"])
        for p in params:
            assert choose_format("groupwise-int", p, shape, moe=moe, n_layers=n_layers) == o["format_v3"], p
            checked += 1
    assert checked > 800
