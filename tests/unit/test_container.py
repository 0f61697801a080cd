"""v3 container: byte layout, parts, zero-copy views, bindings, and every kind of bad input."""
import json
import os
import struct

import numpy as np
import pytest

from engine.artifact import formats as F
from engine.artifact.container import open_artifact, write_artifact
from engine.errors import NinferError

RS, CL = "row_split_k128_v1", "contiguous_le_v1"


def _make(tmp_path, name="m.ninfer", split_limit=32_000_000_000):
    rng = np.random.default_rng(0)
    qk = rng.standard_normal((96, 200)).astype(np.float32)
    norm = rng.standard_normal(200).astype(np.float32)
    ids = np.arange(7, dtype=np.int32)
    comps = {"text": {"config": {"architectures": ["X"], "hidden_size": 200},
                      "resources": {"tokenizer.json": "text/tokenizer.json"}}}
    tensors = [("text/layers/0/attention/query_key", "q5_g64_fp16", RS, qk.shape, qk),
               ("text/final_norm", "bf16", CL, norm.shape, lambda: norm),
               ("proposal/token_ids", "int32", CL, ids.shape, ids)]
    bindings = {
        "text/layers/0/attention/query": {"parts": [{"object": "text/layers/0/attention/query_key", "range": [0, 64 * 200]}]},
        "text/layers/0/attention/key": {"parts": [{"object": "text/layers/0/attention/query_key", "range": [64 * 200, 96 * 200]}]},
        "text/final_norm": {"object": "text/final_norm"},
        "proposal/token_ids": {"object": "proposal/token_ids"},
    }
    path = tmp_path / name
    write_artifact(path, comps, tensors, {"text/tokenizer.json": b'{"v": "\xc3\xa9"}'}, bindings,
                   metadata={"name": "tiny"}, provenance={"recipe": "test"}, split_limit=split_limit)
    return path, qk, norm, ids


def test_byte_layout(tmp_path):
    path, *_ = _make(tmp_path)
    raw = path.read_bytes()
    assert raw[:8] == b"NINFER\x00\x03"
    json_bytes = struct.unpack("<Q", raw[8:16])[0]
    assert (32 + json_bytes) % 4096 == 0 and json_bytes == 4064
    text = raw[32:32 + json_bytes].decode()
    assert text.rstrip(" ") != text and text.rstrip(" ").endswith("}")
    root = json.loads(text)
    assert list(root) == ["components", "objects", "bindings", "uses", "metadata", "provenance", "files"]
    assert list(root["objects"][1]) == ["id", "kind", "offset", "bytes", "shape", "format", "layout"]
    assert root["objects"][0] == {"id": "text/tokenizer.json", "kind": "resource", "offset": 0, "bytes": 11,
                                  "encoding": "raw_bytes_v1"}
    # q5 [96, 200]: K_pad 256, 4 groups/row: base 12288 + high 3072 + scales 768 = 16128 bytes
    assert [o["offset"] for o in root["objects"]] == [0, 256, 16384, 16896]
    assert root["files"] == [{"path": None, "payload_bytes": 16896 + 28}]
    assert len(raw) == 4096 + root["files"][0]["payload_bytes"]
    assert ", " not in text.rstrip(" ")  # compact separators


def test_round_trip_and_zero_copy(tmp_path):
    path, qk, norm, ids = _make(tmp_path)
    a = open_artifact(path)
    assert a.version == 3 and len(a.artifact_id) == 16 and a.metadata == {"name": "tiny"}
    assert a.components["text"]["config"]["hidden_size"] == 200
    q = a.parameter("text/layers/0/attention/query")
    full = F.decode("q5_g64_fp16", RS, qk.shape, F.encode("q5_g64_fp16", RS, qk))
    assert q.shape == (64, 200) and np.array_equal(q, full[:64])
    assert np.array_equal(a.parameter("text/layers/0/attention/key"), full[64:])
    assert np.array_equal(a.parameter("text/final_norm"), F.bf16_bits_to_f32(F.f32_to_bf16_bits(norm)))
    assert a.parameter("proposal/token_ids", dtype=None).dtype == np.int32
    assert a.resource("tokenizer.json") == b'{"v": "\xc3\xa9"}'
    view = a.object_bytes("text/final_norm")
    assert isinstance(view.base, np.memmap) or isinstance(view, np.memmap)
    ps = a.packed("text/layers/0/attention/key")
    assert [(p.object_id, p.row0, p.row1, p.shape) for p in ps] == [("text/layers/0/attention/query_key", 64, 96, (96, 200))]


def test_parts_and_straddling_object(tmp_path):
    path, qk, norm, ids = _make(tmp_path, split_limit=12288)  # 8192 payload bytes per file
    parts = sorted(p.name for p in tmp_path.iterdir())
    assert parts == ["m.ninfer", "m.ninfer.part-0001", "m.ninfer.part-0002"]
    p1 = (tmp_path / "m.ninfer.part-0001").read_bytes()
    a0 = path.read_bytes()[16:32]
    assert p1[:8] == b"NINPRT\x00\x03" and struct.unpack("<Q", p1[8:16])[0] == 1 and p1[16:32] == a0
    assert p1[32:4096] == bytes(4064)
    a = open_artifact(path)
    assert [f["payload_bytes"] for f in a.files] == [8192, 8192, 16924 - 16384]
    assert [f["path"] for f in a.files] == [None, "m.ninfer.part-0001", "m.ninfer.part-0002"]
    straddler = a.object_bytes("text/layers/0/attention/query_key")  # [256, 16384): entry + part 1
    assert np.array_equal(straddler, F.encode("q5_g64_fp16", RS, qk))
    assert np.array_equal(a.parameter("text/final_norm"), F.bf16_bits_to_f32(F.f32_to_bf16_bits(norm)))
    os.unlink(tmp_path / "m.ninfer.part-0002")
    with pytest.raises(NinferError, match="part-0002 is missing"):
        open_artifact(path)


def test_interrupted_write_leaves_nothing(tmp_path):
    def boom():
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        write_artifact(tmp_path / "x.ninfer", {"text": {"config": {}}},
                       [("a", "fp32", CL, [4], np.ones(4, np.float32)), ("b", "fp32", CL, [4], boom)], split_limit=8192 + 4096)
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite(tmp_path):
    path, *_ = _make(tmp_path)
    with pytest.raises(NinferError, match="already exists"):
        _make(tmp_path)


def _rewrite_json(path, mutate):
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[8:16])[0]
    root = json.loads(raw[32:32 + n])
    mutate(root)
    text = json.dumps(root, separators=(",", ":")).encode()
    assert len(text) <= n
    raw[32:32 + n] = text + b" " * (n - len(text))
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["objects"][1].__setitem__("format", "q3_g64"), "unknown format"),
    (lambda r: r["objects"][2].__setitem__("offset", r["objects"][2]["offset"] + 1), "not 256-byte aligned"),
    (lambda r: r["objects"][2].__setitem__("offset", 512), "overlaps"),
    (lambda r: r["objects"][1].__setitem__("bytes", 5000), "needs 16128"),
    (lambda r: r.__setitem__("extra", 1), "unknown JSON root members"),
    (lambda r: r.pop("files"), "no 'files'"),
    (lambda r: r["objects"][1].__setitem__("note", "x"), "members"),
    (lambda r: r["bindings"].__setitem__("x", {"object": "nope"}), "missing tensor"),
    (lambda r: r["bindings"]["text/layers/0/attention/key"]["parts"][0].__setitem__("range", [0, 10 ** 9]), "outside"),
    (lambda r: r["components"].pop("text"), "containing 'text'"),
])
def test_bad_json_rejected(tmp_path, mutate, message):
    path, *_ = _make(tmp_path)
    _rewrite_json(path, mutate)
    with pytest.raises(NinferError, match=message) as e:
        open_artifact(path)
    assert str(path) in e.value.message


def test_bad_framing(tmp_path):
    path, *_ = _make(tmp_path)
    raw = path.read_bytes()
    (tmp_path / "magic.ninfer").write_bytes(b"GGUF" + raw[4:])
    with pytest.raises(NinferError, match="not a .ninfer file"):
        open_artifact(tmp_path / "magic.ninfer")
    (tmp_path / "trunc.ninfer").write_bytes(raw[:-10])
    with pytest.raises(NinferError, match="truncated"):
        open_artifact(tmp_path / "trunc.ninfer")
    (tmp_path / "short.ninfer").write_bytes(raw[:3000])
    with pytest.raises(NinferError, match="truncated"):
        open_artifact(tmp_path / "short.ninfer")
    (tmp_path / "garbage.ninfer").write_bytes(raw[:32] + b"{not json" + raw[41:])
    with pytest.raises(NinferError, match="not valid JSON"):
        open_artifact(tmp_path / "garbage.ninfer")
    with pytest.raises(NinferError, match="no such file"):
        open_artifact(tmp_path / "absent.ninfer")


def test_part_of_another_artifact(tmp_path):
    path, *_ = _make(tmp_path, split_limit=12288)
    (tmp_path / "b").mkdir()
    other, *_ = _make(tmp_path / "b", split_limit=12288)
    os.replace(tmp_path / "b" / "m.ninfer.part-0001", tmp_path / "m.ninfer.part-0001")
    with pytest.raises(NinferError, match="another artifact"):
        open_artifact(path)


def test_large_json_grows_reserve(tmp_path):
    tensors = [(f"t{i:05d}/" + "x" * 40, "fp32", CL, [1], np.ones(1, np.float32)) for i in range(200)]
    write_artifact(tmp_path / "big.ninfer", {"text": {"config": {}}}, tensors)
    raw = (tmp_path / "big.ninfer").read_bytes()
    n = struct.unpack("<Q", raw[8:16])[0]
    assert n > 4064 and (32 + n) % 4096 == 0
    a = open_artifact(tmp_path / "big.ninfer")
    assert len(a.bindings) == 200 and a.parameter(tensors[-1][0]).tolist() == [1.0]
