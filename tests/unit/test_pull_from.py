"""`ninfer pull --from PATH`: register a local v3 file, or convert v1/v2, GGUF and checkpoint folders first."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ninfer_cli import local_import
from ninfer_cli.main import app
from ninfer_cli.store import Store

runner = CliRunner()
V3 = b"NINFER\x00\x03" + bytes(range(256)) * 40


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "store"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "store"


def pull(*args):
    return runner.invoke(app, ["pull", *args], prog_name="ninfer")


@pytest.fixture
def fake_converters(monkeypatch):
    """Replace engine.artifact's converters by one that writes a v3 file and records its call."""
    calls = []

    def converter(kind):
        def convert(src, dst, progress=None):
            calls.append((kind, Path(src).name))
            Path(dst).write_bytes(V3)
            return dst
        return convert

    monkeypatch.setattr(local_import, "_converter", converter)
    return calls


def test_v3_file_is_copied_with_its_sha256(tmp_path):
    src = tmp_path / "My_Model.Q4.ninfer"
    src.write_bytes(V3)
    r = pull("--from", str(src))
    assert r.exit_code == 0, r.output
    m = Store().get("my_model.q4")
    assert m.sha256 == hashlib.sha256(V3).hexdigest() and m.bytes == len(V3) and m.container_version == 3
    assert m.source == f"file://{src.resolve()}" and src.exists()
    assert r.stdout.strip() == str(m.artifact_path) and m.artifact_path.read_bytes() == V3

    again = pull("--from", str(src))
    assert again.exit_code == 1 and "already installed" in again.stderr and "--force" in again.stderr
    assert pull("mine:v1", "--from", str(src), "--move").exit_code == 0
    assert not src.exists() and Store().get("mine:v1").artifact_path.read_bytes() == V3


@pytest.mark.parametrize("kind, make", [
    ("legacy", lambda p: (p / "old.ninfer").write_bytes(b"NINFER\x00\x02" + b"\0" * 64) and p / "old.ninfer"),
    ("gguf", lambda p: (p / "m.gguf").write_bytes(b"GGUF" + b"\0" * 64) and p / "m.gguf"),
    ("hf", lambda p: ((p / "ckpt").mkdir(), (p / "ckpt" / "config.json").write_text("{}"),
                      (p / "ckpt" / "model.safetensors").write_bytes(b"\0" * 8)) and p / "ckpt"),
])
def test_other_formats_are_converted_then_registered(tmp_path, fake_converters, kind, make):
    src = make(tmp_path)
    r = pull("local", "--from", str(src))
    assert r.exit_code == 0, r.output
    assert fake_converters == [(kind, src.name)]
    m = Store().get("local")
    assert m.container_version == 3 and m.artifact_path.read_bytes() == V3
    assert m.sha256 == hashlib.sha256(V3).hexdigest() and m.source == f"file://{src.resolve()}"
    assert not (Store().root / ".partial").exists(), "the conversion's staging folder is cleaned up"


def test_failed_conversion_is_one_line(tmp_path, monkeypatch):
    def broken(kind):
        def convert(src, dst, progress=None):
            raise ValueError("tensor blk.0.attn_q.weight has an unknown type")
        return convert

    monkeypatch.setattr(local_import, "_converter", broken)
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 64)
    r = pull("--from", str(src))
    assert r.exit_code == 1
    assert "could not convert" in r.stderr and "unknown type" in r.stderr and "Traceback" not in r.output
    assert Store().find("m") is None


def test_unusable_paths(tmp_path):
    r = pull("--from", str(tmp_path / "nope.ninfer"))
    assert r.exit_code == 1 and "does not exist" in r.stderr
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    r = pull("--from", str(junk))
    assert r.exit_code == 1 and "is not a .ninfer, GGUF file or checkpoint folder" in r.stderr
    (tmp_path / "empty").mkdir()
    r = pull("--from", str(tmp_path / "empty"))
    assert r.exit_code == 1 and "without config.json" in r.stderr


def test_dry_run_from_changes_nothing(tmp_path):
    src = tmp_path / "a.ninfer"
    src.write_bytes(V3)
    r = pull("--from", str(src), "--dry-run")
    assert r.exit_code == 0 and "copy" in r.stdout
    assert Store().find("a") is None and src.exists()


def test_container_version_and_names(tmp_path):
    p = tmp_path / "x"
    for v in (1, 2, 3):
        p.write_bytes(b"NINFER\x00" + bytes([v]) + b"\0" * 8)
        assert local_import.container_version(p) == v
    p.write_bytes(b"GGUF")
    assert local_import.container_version(p) is None
    assert local_import.default_name(Path("/a/Qwen3.6 27B (copy).ninfer")) == "qwen3.6-27b-copy"


def test_each_detected_kind_has_a_converter_entry():
    assert set(local_import._CONVERTERS) == {"legacy", "gguf", "hf"}
    assert callable(local_import._converter("legacy"))  # engine.artifact.upgrade.upgrade exists


def test_a_published_artifact_gets_its_catalog_name_and_counts_as_pulled(tmp_path, monkeypatch):
    import json

    sha = hashlib.sha256(V3).hexdigest()
    catalog_file = tmp_path / "catalog.json"
    catalog_file.write_text(json.dumps([{"name": "tiny", "files": [
        {"repo": "org/tiny", "revision": "c" * 40, "filename": "tiny.ninfer", "size": len(V3), "sha256": sha}]}]))
    monkeypatch.setenv("NINFER_CATALOG", str(catalog_file))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # `pull tiny` below must not need the network
    src = tmp_path / "downloaded-by-hand.ninfer"
    src.write_bytes(V3)
    r = pull("--from", str(src))
    assert r.exit_code == 0, r.output
    m = Store().get("tiny")
    assert m.revision == "c" * 40 and m.sha256 == sha
    r = pull("tiny")
    assert r.exit_code == 0 and "up to date" in r.stderr
