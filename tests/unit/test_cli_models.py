"""`ninfer ls`, `show`, `rm` on a store with two fake-but-valid manifests (and broken ones)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ninfer_cli.main import app
from ninfer_cli.store import MANIFEST, Store

runner = CliRunner()


def invoke(*args, **kw):
    return runner.invoke(app, list(args), prog_name="ninfer", **kw)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "store"))
    s = Store()
    for ref, size in (("smollm2-135m", 270_000), ("qwen38-27b:q4", 1_900_000)):
        src = tmp_path / f"{ref.replace(':', '_')}.ninfer"
        src.write_bytes(b"\0" * size)
        s.add(ref, src, source=f"hf://org/{ref}@abc/file.ninfer", revision="abc", sha256="ab" * 32)
    return s


def _break(store, ref, content):
    folder = store.model_dir(ref)
    folder.mkdir(parents=True, exist_ok=True)
    if content is None:
        (folder / MANIFEST).unlink(missing_ok=True)
    else:
        (folder / MANIFEST).write_text(content)
    return folder


def test_ls_table(store):
    r = invoke("ls")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "FORMAT", "SOURCE", "ADDED"]
    body = "\n".join(lines[1:])
    assert "qwen38-27b:q4" in body and "1.9 MB" in body
    assert "smollm2-135m:latest" in body and "270 KB" in body
    assert body.index("qwen38-27b") < body.index("smollm2-135m")


def test_ls_json_and_quiet(store):
    data = json.loads(invoke("ls", "--json").stdout)
    assert [d["ref"] for d in data] == ["qwen38-27b:q4", "smollm2-135m:latest"]
    assert data[1]["bytes"] == 270_000 and data[1]["sha256"] == "ab" * 32 and data[1]["container_version"] == 3
    assert invoke("ls", "-q").stdout == "qwen38-27b:q4\nsmollm2-135m:latest\n"


def test_ls_empty_store_says_how_to_get_a_model(tmp_path, monkeypatch):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "empty"))
    r = invoke("ls")
    assert r.exit_code == 0 and r.stdout == "" and "ninfer pull" in r.stderr
    assert invoke("ls", "--json").stdout.strip() == "[]"


@pytest.mark.parametrize(("content", "needle"), [(None, "has no manifest.json"), ("{oops", "corrupt manifest")])
def test_broken_manifest(store, content, needle):
    folder = _break(store, "smollm2-135m", content)
    r = invoke("ls", "-q")
    assert r.exit_code == 0 and r.stdout == "qwen38-27b:q4\n"
    assert needle in r.stderr and str(folder) in r.stderr
    r = invoke("show", "smollm2-135m")
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and str(folder) in r.stderr
    assert "ninfer rm smollm2-135m:latest" in r.stderr
    r = invoke("rm", "-y", "smollm2-135m")
    assert r.exit_code == 0 and not folder.exists()


def test_show_text_and_json(store):
    r = invoke("show", "qwen38-27b:q4")
    assert r.exit_code == 0
    assert "hf://org/qwen38-27b:q4@abc/file.ninfer" in r.stdout and "1,900,000 bytes" in r.stdout
    data = json.loads(invoke("show", "smollm2-135m", "--json").stdout)
    assert data["ref"] == "smollm2-135m:latest" and data["artifact_present"] is True
    assert {f["name"] for f in data["files"]} == {MANIFEST, data["artifact"]}


def test_show_reads_the_artifact_header(store, tmp_path):
    import numpy as np

    from engine.artifact.container import write_artifact

    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 8, "vocab_size": 16,
              "max_position_embeddings": 8192}
    w = np.ones((16, 8), np.float32)
    src = write_artifact(tmp_path / "tiny.ninfer", {"text": {"config": config, "resources": {"tokenizer.json": "tok"}}},
                         [("text/embed", "fp32", "contiguous_le_v1", w.shape, w),
                          ("text/norm", "bf16", "contiguous_le_v1", (8,), np.ones(8, np.float32))],
                         {"tok": b"{}"})
    store.add("tiny", src, source="test")
    r = invoke("show", "tiny")
    assert r.exit_code == 0, r.output
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines() if not line.startswith(" ") and " " in line)
    assert lines["architecture"] == "LlamaForCausalLM" and lines["parameters"] == "136"
    assert lines["context"] == "8,192" and lines["formats"] == "fp32 97%, bf16 3%" and lines["resources"] == "tokenizer.json"
    model = json.loads(invoke("show", "tiny", "--json").stdout)["model"]
    assert model["layers"] == 2 and model["parameters"] == 136 and model["container_version"] == 3


def test_show_survives_a_damaged_artifact(store):
    store.get("smollm2-135m")  # its artifact is zeros: not a .ninfer file
    r = invoke("show", "smollm2-135m")
    assert r.exit_code == 0 and "cannot read" in r.stderr and "not a .ninfer file" in r.stderr
    assert "source" in r.stdout


def test_show_warns_on_missing_artifact(store):
    store.get("smollm2-135m").artifact_path.unlink()
    r = invoke("show", "smollm2-135m")
    assert r.exit_code == 0 and "is missing" in r.stderr


def test_show_unknown_suggests(store):
    r = invoke("show", "smollm2-13m")
    assert r.exit_code == 1
    assert "did you mean smollm2-135m:latest" in r.stderr


def test_rm_asks_and_no_keeps(store):
    r = invoke("rm", "smollm2-135m", input="n\n")
    assert r.exit_code == 1 and "delete smollm2-135m:latest (270 KB)?" in r.stderr
    assert store.find("smollm2-135m") is not None
    r = invoke("rm", "smollm2-135m")  # EOF on stdin counts as no
    assert r.exit_code == 1 and store.find("smollm2-135m") is not None


def test_rm_yes_removes_several_and_partials(store):
    (store.partial_dir("smollm2-135m") / "x.partial").write_bytes(b"1234")
    r = invoke("rm", "smollm2-135m", "qwen38-27b:q4", input="y\n")
    assert r.exit_code == 0, r.output
    assert store.list() == [] and store.partial_refs() == []
    assert "deleted smollm2-135m:latest" in r.stderr and "deleted qwen38-27b:q4" in r.stderr


def test_rm_partial_only_download(store):
    (store.partial_dir("qwen36-27b") / "x.partial").write_bytes(b"1234")
    r = invoke("rm", "-y", "qwen36-27b")
    assert r.exit_code == 0 and store.partial_refs() == []


def test_rm_unknown_name_deletes_nothing(store):
    r = invoke("rm", "-y", "smollm2-135m", "qwen38-27b")
    assert r.exit_code == 1
    assert "did you mean qwen38-27b:q4" in r.stderr
    assert len(store.list()) == 2


def test_rm_invalid_name_is_user_error(store):
    r = invoke("rm", "-y", "../etc")
    assert r.exit_code == 1 and "invalid model name" in r.stderr


def test_ls_available_lists_the_catalog_with_install_state(store, monkeypatch):
    monkeypatch.delenv("NINFER_CATALOG", raising=False)
    rows = {r["name"]: r for r in json.loads(invoke("ls", "--available", "--json").stdout)}
    assert rows["smollm2-135m"]["installed"] is True and rows["qwen36-27b"]["installed"] is False
    table = invoke("ls", "-a")
    assert table.exit_code == 0 and "qwen36-27b" in table.stdout
