"""v1/v2 -> v3 upgrade on full-size SPARSE files rebuilt from the published inventories."""
import gzip
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.artifact import formats as F
from engine.artifact.container import open_artifact
from engine.artifact.upgrade import maintained_template, plan_upgrade, upgrade
from engine.errors import NinferError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "artifact"  # gzipped copies of shared/data/inventory-*.json
sys.path.insert(0, str(ROOT / "dev"))
from make_sparse_v2_checkpoint import legacy_root, write_sparse_legacy  # noqa: E402


def _inventory(name):
    return json.loads(gzip.decompress((FIXTURES / f"inventory-{name}-groupwise-int.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def inv27():
    return _inventory("qwen3.6-27b")


def _samples(inv):
    """Distinct non-zero bytes at the start and end of a few objects spread over the payload."""
    objs = [o for o in inv["objects"] if o["kind"] == "tensor"]
    picks = [objs[0], objs[1], objs[len(objs) // 3], objs[len(objs) // 2], objs[-2], objs[-1]]
    out = {}
    for i, o in enumerate(picks):
        out[o["offset"]] = bytes([i + 1]) * 64
        out[o["offset"] + o["bytes"] - 64] = bytes([0xA0 + i]) * 64
    return out


def _expected_bindings(inv):
    """(parameter, object, range or None, uses) in upgrader order, from the inventory's own listing."""
    out = []
    for o in inv["objects"]:
        for b in o.get("v3_bindings", []):
            out.append((b["parameter"], o["name"], b.get("range"), b["uses"]))
        pat = o.get("v3_bindings_pattern")
        if pat:
            k = o["shape"][1]
            n_e = len(range(*[int(x) for x in "0..255".split("..")])) + 1
            per = o["shape"][0] // n_e
            for e in range(n_e):
                for p in pat["parameters"]:
                    role = p["parameter"].rsplit("/", 1)[1]
                    r0 = e * per if role in ("gate", "down") else e * per + per // 2
                    r1 = r0 + (per // 2 if role in ("gate", "up") else per)
                    out.append((p["parameter"].replace("{e}", str(e)), o["name"], [r0 * k, r1 * k],
                                [u.replace("{e}", str(e)) for u in p["uses"]]))
    return out


def test_published_directory_is_rebuilt_byte_exact(inv27):
    text = json.dumps(legacy_root(inv27, 2), separators=(",", ":"), ensure_ascii=False).encode()
    assert hashlib.sha256(text).hexdigest() == inv27["header"]["v2_directory"]["sha256_computed"]


@pytest.mark.parametrize("name", ["qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.8-27b"])
def test_bindings_and_uses_match_inventory(tmp_path, name):
    inv = _inventory(name)
    src = tmp_path / "in.ninfer"
    write_sparse_legacy(inv, src, 2)
    lf, root, payload, tpl_off, tpl = plan_upgrade(src)
    derived = inv["header"]["v3_upgrade_derived"]
    assert (len(root["bindings"]), len(root["uses"]), payload) == (derived["bindings"], derived["uses"], derived["payload_bytes"])
    got = []
    for param, b in root["bindings"].items():
        obj = b.get("object") or b["parts"][0]["object"]
        rng = b["parts"][0]["range"] if "parts" in b else None
        got.append((param, obj, rng))
    want = _expected_bindings(inv)
    assert got == [(p, o, r) for p, o, r, _ in want]
    uses = [(u["parameter"], u["input"]) for u in root["uses"]]
    assert uses == [(p, u) for p, _, _, us in want for u in us]
    assert {u["activation_policy"] for u in root["uses"]} == {"A16Only"}


def test_full_size_upgrade_keeps_every_weight_byte(tmp_path, inv27):
    src, dst = tmp_path / "q.ninfer", tmp_path / "q3.ninfer"
    samples = _samples(inv27)
    start, payload = write_sparse_legacy(inv27, src, 2, samples)
    upgrade(src, dst)
    d = inv27["header"]["v3_upgrade_derived"]
    assert dst.stat().st_size == d["file_bytes"] == 17_495_583_323
    head = dst.read_bytes()[:32] if dst.stat().st_size < 1 << 20 else open(dst, "rb").read(32)
    assert head[:8] == b"NINFER\x00\x03" and struct.unpack("<Q", head[8:16])[0] == d["json_bytes_field"]
    assert head[16:32] != bytes(16)
    a = open_artifact(dst)
    assert len(a.bindings) == 1422 and len(a.uses) == 785 and len(a.objects) == 1124
    assert a.provenance == {"upgraded_from": {"version": 2, "model_id": "qwen3.6-27b", "weights_id": "groupwise-int"}}
    assert a.resource("chat_template.jinja") == maintained_template("qwen3.6-27b")
    assert hashlib.sha256(a.resource("chat_template.jinja")).hexdigest().startswith("7145316b")
    assert list(a.objects)[-1] == "frontend/chat_template.jinja"
    for o in inv27["objects"]:
        if o["name"] != "frontend/chat_template.jinja":
            assert a.objects[o["name"]].offset == o["offset"]
    with open(src, "rb") as f:
        for off, blob in samples.items():
            assert bytes(a.payload_range(off, len(blob))) == blob
            f.seek(start + off)
            assert f.read(len(blob)) == blob
    cfg = a.components["text"]["config"]
    assert cfg["rms_norm_eps"] == 9.999999974752427e-07 and cfg["layer_types"][3] == "full_attention"
    assert a.components["text"]["resources"]["tokenizer.json"] == "frontend/tokenizer.json"
    assert a.components["vision"]["resources"] == {"preprocessor_config.json": "frontend/preprocessor_config.json",
                                                   "video_preprocessor_config.json": "frontend/video_preprocessor_config.json"}


def test_upgrade_with_parts(tmp_path, inv27):
    src, dst = tmp_path / "q.ninfer", tmp_path / "q3.ninfer"
    samples = _samples(inv27)
    write_sparse_legacy(inv27, src, 2, samples)
    upgrade(src, dst, split_limit=6_000_000_000)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["q.ninfer", "q3.ninfer", "q3.ninfer.part-0001", "q3.ninfer.part-0002"]
    a = open_artifact(dst)
    assert [f["path"] for f in a.files] == [None, "q3.ninfer.part-0001", "q3.ninfer.part-0002"]
    assert sum(f["payload_bytes"] for f in a.files) == 17_495_198_299
    assert all(os.path.getsize(p) <= 6_000_000_000 for p in [dst, *a.parts])
    for off, blob in samples.items():
        assert bytes(a.payload_range(off, len(blob))) == blob
    assert a.resource("chat_template.jinja") == maintained_template("qwen3.6-27b")
    # an object that straddles the entry/part boundary comes back whole (one copy)
    cut = a.files[0]["payload_bytes"]
    straddler = next(o for o in a.objects.values() if o.offset < cut < o.offset + o.bytes)
    assert a.object_bytes(straddler.id).size == straddler.bytes


def test_v1_and_v2_read_directly_with_v3_names(tmp_path, inv27):
    # put real encoded data into one fused parent and one direct object of the sparse file
    objs = {o["name"]: o for o in inv27["objects"]}
    ab = objs["text/layers/0/gdn/a_projection"]
    rng = np.random.default_rng(0)
    a_proj = rng.standard_normal(ab["shape"]).astype(np.float32)
    qk = objs["vision/layers/2/attention/qkv"]
    qk_x = (rng.standard_normal(qk["shape"], dtype=np.float32) * 0.02)
    samples = {ab["offset"]: F.encode("bf16", "contiguous_le_v1", a_proj).tobytes(),
               qk["offset"]: F.encode("q4_g64_fp16", "row_split_k128_v1", qk_x).tobytes()}
    for version in (1, 2):
        src = tmp_path / f"v{version}.ninfer"
        write_sparse_legacy(inv27, src, version, samples)
        art = open_artifact(src)
        assert art.version == version and len(art.bindings) == 1422
        assert np.array_equal(art.parameter("text/layers/0/gdn/a_projection"),
                              F.bf16_bits_to_f32(F.f32_to_bf16_bits(a_proj)))
        key = art.parameter("vision/layers/2/attention/key")
        full = F.decode("q4_g64_fp16", "row_split_k128_v1", qk["shape"], samples[qk["offset"]])
        assert key.shape == (1152, 1152) and np.array_equal(key, full[1152:2304])
        assert art.packed("vision/layers/2/attention/key")[0].row0 == 1152
    upgrade(tmp_path / "v1.ninfer", tmp_path / "from_v1.ninfer")
    assert open_artifact(tmp_path / "from_v1.ninfer").provenance["upgraded_from"]["version"] == 1


def test_rejections(tmp_path, inv27):
    src = tmp_path / "q.ninfer"
    write_sparse_legacy(inv27, src, 2)
    upgrade(src, tmp_path / "out.ninfer")
    with pytest.raises(NinferError, match="already exists"):
        upgrade(src, tmp_path / "out.ninfer")
    with pytest.raises(NinferError, match="same file"):
        upgrade(src, src)
    unknown = json.loads(json.dumps(inv27))
    unknown["header"]["model_id"] = "llama-7b"
    write_sparse_legacy(unknown, tmp_path / "u.ninfer", 2)
    with pytest.raises(NinferError, match="unknown model .*llama-7b") as e:
        upgrade(tmp_path / "u.ninfer", tmp_path / "u3.ninfer")
    assert "u.ninfer" in e.value.message
    fewer = json.loads(json.dumps(inv27))
    fewer["objects"] = fewer["objects"][:-1]
    fewer["header"]["payload_bytes"] = fewer["objects"][-1]["offset"] + fewer["objects"][-1]["bytes"]
    write_sparse_legacy(fewer, tmp_path / "f.ninfer", 2)
    with pytest.raises(NinferError, match="1123 objects"):
        upgrade(tmp_path / "f.ninfer", tmp_path / "f3.ninfer")
    with open(src, "r+b") as f:  # truncate: the last object now ends past the payload
        f.truncate(os.path.getsize(src) - 4096)
    with pytest.raises(NinferError, match="past the payload"):
        upgrade(src, tmp_path / "t3.ninfer")
    assert not (tmp_path / "t3.ninfer").exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_disk_check_counts_only_allocated_bytes(tmp_path, inv27, monkeypatch):
    src = tmp_path / "q.ninfer"
    write_sparse_legacy(inv27, src, 2)
    real = os.statvfs

    def small_disk(path):  # 2 GB free: enough for the sparse copy, not for 17.5 GB of payload
        st = real(path)
        return type("S", (), {"f_bavail": 2_000_000_000 // st.f_frsize, "f_frsize": st.f_frsize})()

    monkeypatch.setattr(os, "statvfs", small_disk)
    upgrade(src, tmp_path / "ok.ninfer")
    from engine.artifact.writer import write_artifact

    with pytest.raises(NinferError, match="not enough disk space"):
        write_artifact(tmp_path / "big.ninfer", {"text": {"config": {}}},
                       [("w", "bf16", "contiguous_le_v1", [1_100_000_000], lambda: None)])
    assert not (tmp_path / "big.ninfer").exists()


def test_v2_object_members_are_closed(tmp_path, inv27):
    bad = json.loads(json.dumps(inv27))
    bad["objects"][7]["extra"] = 1
    src = tmp_path / "x.ninfer"
    text = json.dumps(legacy_root(bad, 2), separators=(",", ":")).encode()
    legacy = json.loads(text)
    legacy["objects"][7]["note"] = "x"
    text = json.dumps(legacy, separators=(",", ":")).encode()
    src.write_bytes(b"NINFER\x00\x02" + struct.pack("<Q", len(text)) + text + bytes(-(16 + len(text)) % 4096) + bytes(4096))
    with pytest.raises(NinferError, match="members"):
        open_artifact(src)


def test_nvfp4_divisors_become_auxiliaries(inv27):
    from engine.artifact import upgrade_rules as rules

    objs = [rules.translate_object({k: v for k, v in o.items() if k in ("name", "kind", "shape", "offset", "bytes")}
                                   | ({"encoding": "raw-bytes-v1"} if o["kind"] == "resource"
                                      else {"format": o["format_v2"], "layout": o["layout_v2"]}))
            for o in inv27["objects"]]
    for name in ("text/layers/3/attention/input_projection", "text/layers/0/mlp/gate_up_projection",
                 "mtp/layer/attention/input_projection", "text/layers/0/gdn/output_projection"):
        objs.append({"id": f"{name}/input_scale_divisor", "kind": "tensor", "offset": 0, "bytes": 4, "shape": [],
                     "format": "fp32", "layout": "contiguous_le_v1"})
    comps = rules.build_components("qwen3.6-27b", objs)
    bindings = rules.build_bindings(comps, objs)
    assert len(bindings) == 1422  # divisors are not parameters
    uses = rules.build_uses(comps, objs, bindings)
    aux = {(u["parameter"], u["input"]): u["auxiliaries"]["activation_input_divisor"]["object"]
           for u in uses if "auxiliaries" in u}
    assert aux == {
        **{(f"text/layers/3/attention/{r}", "text/layers/3/mixer_input"): "text/layers/3/attention/input_projection/input_scale_divisor"
           for r in ("query", "key", "gate", "value")},
        **{(f"text/layers/0/mlp/{r}", "text/layers/0/ffn_input"): "text/layers/0/mlp/gate_up_projection/input_scale_divisor"
           for r in ("gate", "up")},
        **{(f"mtp/layers/0/attention/{r}", "mtp/layers/0/mixer_input"): "mtp/layer/attention/input_projection/input_scale_divisor"
           for r in ("query", "key", "gate", "value")},
        ("text/layers/0/gdn/output", "text/layers/0/gdn/gated_output"): "text/layers/0/gdn/output_projection/input_scale_divisor",
    }
    objs.append({"id": "text/layers/0/attention/input_projection/input_scale_divisor", "kind": "tensor", "offset": 0,
                 "bytes": 4, "shape": [], "format": "fp32", "layout": "contiguous_le_v1"})  # layer 0 is GDN
    with pytest.raises(NinferError, match="missing parameter"):
        rules.build_uses(comps, objs, bindings)
