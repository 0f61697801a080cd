"""The model store: layout, manifests, atomic add, removal, suggestions, broken manifests."""
from __future__ import annotations

import json
import shutil

import pytest

from engine.errors import NinferError
from ninfer_cli.store import MANIFEST, Store, default_root, parse_ref, read_manifest


def _artifact(tmp_path, name="m.ninfer", size=1000, parts=0):
    entry = tmp_path / "src" / name
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(b"\0" * size)
    for i in range(1, parts + 1):
        (entry.parent / f"{name}.part-{i:04d}").write_bytes(b"\1" * 10)
    return entry


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "store")


def test_root_comes_from_ninfer_home(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "h"))
    assert default_root() == tmp_path / "h"
    assert Store().root == tmp_path / "h"
    monkeypatch.delenv("NINFER_HOME")
    assert default_root().name == "models" and "ninfer" in str(default_root())


@pytest.mark.parametrize(
    ("ref", "expected"),
    [("smollm2-135m", ("smollm2-135m", "latest")), ("Qwen38-27B:Q4", ("qwen38-27b", "q4")), ("a.b_c:v1.0", ("a.b_c", "v1.0"))],
)
def test_parse_ref(ref, expected):
    assert parse_ref(ref) == expected


@pytest.mark.parametrize("bad", ["", ":x", "../etc", "a/b", "x:..", "-x", "x:y:z", "a..b"])
def test_parse_ref_rejects_unsafe_names(bad):
    with pytest.raises(NinferError):
        parse_ref(bad)


def test_add_moves_entry_and_parts_and_writes_manifest(store, tmp_path):
    entry = _artifact(tmp_path, parts=2)
    m = store.add("smollm2-135m", entry, source="hf:HuggingFaceTB/x@abc", revision="abc", sha256="00" * 32)
    assert m.path == store.root / "smollm2-135m" / "latest"
    assert m.artifact_path.read_bytes() == b"\0" * 1000
    assert sorted(p.name for p in m.path.iterdir()) == sorted([MANIFEST, "m.ninfer", "m.ninfer.part-0001", "m.ninfer.part-0002"])
    assert m.bytes == 1020
    assert not entry.exists(), "move=True must move the source"
    on_disk = json.loads((m.path / MANIFEST).read_text())
    assert on_disk["name"] == "smollm2-135m" and on_disk["tag"] == "latest" and on_disk["bytes"] == 1020
    assert on_disk["container_version"] == 3 and on_disk["added"].endswith("+00:00")
    assert "path" not in on_disk and "ref" not in on_disk
    assert store.get("smollm2-135m") == m
    assert not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")], "staging folder left behind"


def test_add_copy_keeps_source_and_replaces_existing(store, tmp_path):
    entry = _artifact(tmp_path, size=10)
    store.add("x:v1", entry, source="a", move=False)
    assert entry.exists()
    entry.write_bytes(b"\2" * 20)
    m = store.add("x", entry, tag="v1", source="b", move=False)
    assert store.get("x:v1").source == "b" and m.bytes == 20
    assert [p.name for p in (store.root / "x").iterdir()] == ["v1"]


def test_failed_move_puts_the_files_back(store, tmp_path, monkeypatch):
    entry = _artifact(tmp_path, parts=2)
    real_move = shutil.move
    calls = []

    def flaky_move(src, dst):
        calls.append(src)
        if len(calls) == 3:  # the second part: disk full
            raise OSError(28, "No space left on device")
        return real_move(src, dst)

    monkeypatch.setattr("ninfer_cli.store.shutil.move", flaky_move)
    with pytest.raises(OSError):
        store.add("x", entry, source="s")
    assert sorted(p.name for p in entry.parent.iterdir()) == ["m.ninfer", "m.ninfer.part-0001", "m.ninfer.part-0002"]
    assert store.find("x") is None and not [p for p in store.root.iterdir() if p.name.startswith(".tmp-")]


def test_add_missing_file_is_a_user_error(store, tmp_path):
    with pytest.raises(NinferError, match="does not exist"):
        store.add("x", tmp_path / "nope.ninfer", source="s")


def test_list_sorted_and_find(store, tmp_path):
    for ref in ("zeta", "alpha:b", "alpha:a"):
        store.add(ref, _artifact(tmp_path), source="s")
    assert [m.ref for m in store.list()] == ["alpha:a", "alpha:b", "zeta:latest"]
    assert store.find("nothing") is None
    assert store.find("zeta").ref == "zeta:latest"


def test_unknown_name_suggests_close_ones(store, tmp_path):
    store.add("smollm2-135m", _artifact(tmp_path), source="s")
    store.add("qwen38-27b:q4", _artifact(tmp_path), source="s")
    with pytest.raises(NinferError) as e:
        store.get("smollm2-13m")
    assert "did you mean smollm2-135m:latest" in e.value.next_action
    with pytest.raises(NinferError) as e:
        store.get("qwen38-27b")  # right name, wrong (default) tag
    assert "qwen38-27b:q4" in e.value.next_action
    with pytest.raises(NinferError) as e:
        store.get("zzz-unknown")
    assert "ninfer ls" in e.value.next_action


def test_unknown_name_points_at_the_pull_catalog(store, monkeypatch):
    monkeypatch.delenv("NINFER_CATALOG", raising=False)
    with pytest.raises(NinferError) as e:
        store.get("qwen36-27b")
    assert e.value.next_action == "it is not installed: `ninfer pull qwen36-27b`"
    with pytest.raises(NinferError) as e:
        store.get("qwen36-27")
    assert e.value.next_action.startswith("did you mean qwen36-27b") and "ninfer pull" in e.value.next_action


@pytest.mark.parametrize(
    ("content", "needle"),
    [(None, "has no manifest.json"), ("{not json", "corrupt manifest"), ("[1, 2]", "JSON object"),
     ('{"name": "x", "tag": "latest"}', "missing source, artifact"),
     ('{"name": "x", "tag": "latest", "source": "s", "artifact": "a", "bytes": "many"}', "corrupt manifest")],
)
def test_broken_manifest_named_in_error(store, content, needle):
    folder = store.root / "x" / "latest"
    folder.mkdir(parents=True)
    if content is not None:
        (folder / MANIFEST).write_text(content)
    with pytest.raises(NinferError, match=needle) as e:
        store.get("x")
    assert str(folder) in e.value.message
    assert "ninfer rm x:latest" in e.value.next_action
    good, bad = store.scan()
    assert good == [] and len(bad) == 1
    assert store.refs() == ["x:latest"]


def test_unknown_manifest_keys_are_ignored(store):
    folder = store.root / "x" / "latest"
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"name": "x", "tag": "latest", "source": "s", "artifact": "a",
                                               "future_field": 1}))
    assert read_manifest(folder).source == "s"


def test_folder_names_the_model_even_if_the_manifest_disagrees(store):
    folder = store.root / "copy" / "v2"
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text(json.dumps({"name": "orig", "tag": "latest", "source": "s", "artifact": "a"}))
    assert store.get("copy:v2").ref == "copy:v2"


def test_remove_model_and_partials(store, tmp_path):
    store.add("a", _artifact(tmp_path, size=100), source="s")
    (store.partial_dir("a") / "m.ninfer.partial").write_bytes(b"x" * 7)
    (store.partial_dir("b:v2") / "f").write_bytes(b"x" * 3)
    assert store.partial_refs() == ["a:latest", "b:v2"]
    freed = store.remove("a")
    assert freed >= 107 and store.find("a") is None and store.partial_refs() == ["b:v2"]
    assert store.remove("b:v2") == 3 and store.partial_refs() == []
    with pytest.raises(NinferError, match="no model named"):
        store.remove("a")


def test_remove_works_on_broken_manifest(store):
    folder = store.root / "x" / "latest"
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text("garbage")
    store.remove("x")
    assert not folder.exists()


def test_free_bytes_on_missing_root(tmp_path):
    assert Store(tmp_path / "a" / "b" / "c").free_bytes() > 0
