"""`ninfer convert / inspect / verify` through the real Typer app."""
import gzip
import json
import struct
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ninfer_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "artifact"
sys.path.insert(0, str(ROOT / "dev"))
from make_sparse_v2_checkpoint import write_sparse_legacy  # noqa: E402

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_convert_inspect_verify_checkpoint(tmp_path):
    out = tmp_path / "tiny.ninfer"
    r = _run("convert", FIX / "hf_moe", "-o", out, "--recipe", "groupwise-int")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(str(out)) and out.is_file()
    r = _run("inspect", out, "--json")
    data = json.loads(r.stdout)
    assert data["version"] == 3 and data["components"]["text"]["config"]["num_experts"] == 4
    assert data["formats"]["q4_g64_fp16"]["objects"] == 32 and data["bindings"] == 119
    assert data["uses"] > 0 and data["provenance"]["recipe"] == "groupwise-int"
    r = _run("inspect", out)
    assert "q5_g64_fp16" in r.stdout and "component text" in r.stdout
    r = _run("verify", out, "--deep")
    assert r.exit_code == 0 and "FAIL" not in r.stdout and "codes and scales" in r.stdout


def test_verify_finds_unbound_objects(tmp_path):
    out = tmp_path / "m.ninfer"
    assert _run("convert", FIX / "hf_dense", "-o", out, "--recipe", "bf16").exit_code == 0
    raw = bytearray(out.read_bytes())
    n = struct.unpack("<Q", raw[8:16])[0]
    root = json.loads(raw[32:32 + n])
    del root["bindings"]["text/layers/2/mlp/up"]
    text = json.dumps(root, separators=(",", ":")).encode()
    raw[32:32 + n] = text + b" " * (n - len(text))
    out.write_bytes(bytes(raw))
    r = _run("verify", out)
    assert r.exit_code == 1
    assert "binding coverage" in r.stderr and "parameter set" in r.stderr
    assert "text/layers/2/mlp/up" in r.stdout


def test_upgrade_through_cli_with_parts(tmp_path):
    inv = json.loads(gzip.decompress((FIX / "inventory-qwen3.8-27b-groupwise-int.json.gz").read_bytes()))
    src = tmp_path / "qwen3_8_27b.ninfer"
    write_sparse_legacy(inv, src, 2)
    r = _run("convert", src, "--split-limit", "8GB")
    assert r.exit_code == 0, r.output
    dst = tmp_path / "qwen3_8_27b.v3.ninfer"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "qwen3_8_27b.ninfer", "qwen3_8_27b.v3.ninfer", "qwen3_8_27b.v3.ninfer.part-0001", "qwen3_8_27b.v3.ninfer.part-0002"]
    data = json.loads(_run("inspect", dst, "--json").stdout)
    assert data["bindings"] == 1513 and len(data["files"]) == 3 and "dflash2" in data["components"]
    assert _run("verify", dst).exit_code == 0
    r = _run("convert", src, "--recipe", "q8", "-o", tmp_path / "x.ninfer")
    assert r.exit_code == 1 and "--recipe does not apply" in r.stderr


@pytest.mark.parametrize("content, convert_msg, read_msg", [
    (b"GGUF", "not a readable GGUF", "not a .ninfer file"),
    (b"hello world, not a model", "not a .ninfer, GGUF file or checkpoint folder", "not a .ninfer file"),
    (b"NINFER\x00\x03" + b"\xff" * 24, "already a v3 artifact", "does not fit"),
    (b"NINFER\x00\x02" + struct.pack("<Q", 5) + b"{}{}{", "not valid JSON", "not valid JSON"),
])
def test_bad_inputs_are_one_line_errors(tmp_path, content, convert_msg, read_msg):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(content)
    for cmd, msg in ((["convert", bad, "-o", tmp_path / "o.ninfer"], convert_msg), (["inspect", bad], read_msg),
                     (["verify", bad], read_msg)):
        r = _run(*cmd)
        assert r.exit_code == 1, (cmd, r.output)
        first, *rest = r.stderr.splitlines()
        assert first.startswith(f"error: {bad}") and msg in first, (cmd, r.stderr)
        assert all(line.startswith("-> ") for line in rest) and "Traceback" not in r.stderr
    assert not (tmp_path / "o.ninfer").exists()


def test_missing_path(tmp_path):
    r = _run("inspect", tmp_path / "nope.ninfer")
    assert r.exit_code == 1 and "no such file" in r.stderr
    r = _run("convert", tmp_path / "nope")
    assert r.exit_code == 1 and "no such file" in r.stderr
