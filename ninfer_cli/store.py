"""The local model store: one folder per model (`<root>/<name>/<tag>/`) with its artifact and a manifest.

Layout:
    <root>/<name>/<tag>/manifest.json       what `ninfer ls/show` read
    <root>/<name>/<tag>/<artifact>          the `.ninfer` entry file (+ `<artifact>.part-NNNN`)
    <root>/.partial/<name>/<tag>/           where `ninfer pull` keeps unfinished downloads
    <root>/.tmp-*/                          staging for atomic adds (renamed into place)

The root is `$NINFER_HOME` or `platformdirs.user_data_dir("ninfer")/models`. Only the standard library
is imported at module level: shell completion lists model names through this module on every TAB.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import difflib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import NinferError

MANIFEST = "manifest.json"
DEFAULT_TAG = "latest"
_PARTIAL = ".partial"
_PART_ZONE = re.compile(r"\.part-\d{4,}$")
_SEGMENT = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_REQUIRED = ("name", "tag", "source", "artifact")


def default_root() -> Path:
    """`$NINFER_HOME` when set, else the per-user data dir (`~/.local/share/ninfer/models` on Linux)."""
    env = os.environ.get("NINFER_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs  # noqa: PLC0415  (20 ms; only when no override is set)

    return Path(platformdirs.user_data_dir("ninfer")) / "models"


def parse_ref(ref: str) -> tuple[str, str]:
    """Split `name[:tag]` into (name, tag), lower-cased; raise NinferError on a malformed name."""
    text = (ref or "").strip().lower()
    name, _, tag = text.partition(":")
    tag = tag or DEFAULT_TAG
    for part in (name, tag):
        if not _SEGMENT.match(part) or ".." in part:
            raise NinferError(
                f"invalid model name {ref!r}",
                "use name[:tag] with letters, digits, '.', '_' or '-', e.g. smollm2-135m or qwen38-27b:latest",
            )
    return name, tag


@dataclass
class Manifest:
    """What the store knows about one installed model; written as `manifest.json` in its folder."""

    name: str
    tag: str
    source: str
    artifact: str
    revision: str | None = None
    sha256: str | None = None
    bytes: int = 0
    container_version: int = 3
    added: str = ""
    path: Path | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def ref(self) -> str:
        """`name:tag`, the form `ninfer ls` prints and every command accepts."""
        return f"{self.name}:{self.tag}"

    @property
    def artifact_path(self) -> Path:
        """The artifact's entry file (continuation parts sit next to it)."""
        assert self.path is not None, "manifest not bound to a folder"
        return self.path / self.artifact

    def to_dict(self) -> dict:
        """The JSON form (the manifest file, `ls --json`, `show --json`), plus the folder path."""
        d = self.file_dict()
        d["ref"] = self.ref
        d["path"] = str(self.path) if self.path else None
        return d

    def file_dict(self) -> dict:
        """What `manifest.json` holds (no derived fields)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "path"}


def _artifact_files(entry: Path) -> list[Path]:
    """The entry file and its `.part-NNNN` continuation files, in order."""
    parts = sorted(p for p in entry.parent.glob(entry.name + ".part-*") if _PART_ZONE.search(p.name))
    return [entry, *parts]


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def read_manifest(folder: Path) -> Manifest:
    """Read and validate `folder/manifest.json`; NinferError names the file when it is missing or bad."""
    file = folder / MANIFEST
    fix = f"remove it with `ninfer rm {folder.parent.name}:{folder.name}` and pull it again"
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NinferError(f"model folder {folder} has no {MANIFEST}", fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NinferError(f"corrupt manifest {file}: {e}", fix) from None
    if not isinstance(raw, dict):
        raise NinferError(f"corrupt manifest {file}: expected a JSON object", fix)
    missing = [k for k in _REQUIRED if not raw.get(k)]
    if missing:
        raise NinferError(f"corrupt manifest {file}: missing {', '.join(missing)}", fix)
    known = {f.name for f in dataclasses.fields(Manifest)} - {"path"}
    try:
        m = Manifest(**{k: v for k, v in raw.items() if k in known}, path=folder)
        m.name, m.tag = folder.parent.name, folder.name  # the folder is what names resolve to
        m.bytes = int(m.bytes or 0)
        m.container_version = int(m.container_version)
    except (TypeError, ValueError) as e:
        raise NinferError(f"corrupt manifest {file}: {e}", fix) from None
    return m


def _catalog_names() -> list[str]:
    """Names `ninfer pull` knows; empty when the catalog cannot be read (the store must not depend on it)."""
    try:
        from ninfer_cli.catalog import entries  # noqa: PLC0415

        return sorted(entries())
    except Exception:
        return []


def _write_json_atomic(file: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=file.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, file)


class Store:
    """The local model store (see the module docstring for the layout)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root).expanduser() if root is not None else default_root()

    # ---- reading

    def model_dir(self, ref: str) -> Path:
        """Folder a model lives (or would live) in."""
        name, tag = parse_ref(ref)
        return self.root / name / tag

    def partial_dir(self, ref: str) -> Path:
        """Folder for a model's unfinished download files (created on demand)."""
        name, tag = parse_ref(ref)
        path = self.root / _PARTIAL / name / tag
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _folders(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        out = []
        for name_dir in sorted(self.root.iterdir()):
            if name_dir.name.startswith(".") or not name_dir.is_dir():
                continue
            out += sorted(p for p in name_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        return out

    def scan(self) -> tuple[list[Manifest], list[NinferError]]:
        """All installed models, plus one error per model folder whose manifest is missing or corrupt."""
        good, bad = [], []
        for folder in self._folders():
            try:
                good.append(read_manifest(folder))
            except NinferError as e:
                bad.append(e)
        return good, bad

    def list(self) -> list[Manifest]:
        """Installed models with a valid manifest, sorted by name then tag."""
        return self.scan()[0]

    def refs(self) -> list[str]:
        """`name:tag` of every model folder, valid or not, without reading manifests (for completion)."""
        return [f"{p.parent.name}:{p.name}" for p in self._folders()]

    def partial_refs(self) -> list[str]:
        """`name:tag` of every unfinished download."""
        base = self.root / _PARTIAL
        if not base.is_dir():
            return []
        return sorted(f"{t.parent.name}:{t.name}" for t in base.glob("*/*") if t.is_dir())

    def find(self, ref: str) -> Manifest | None:
        """The model named `ref`, or None when it is not installed (a broken manifest still raises)."""
        folder = self.model_dir(ref)
        if not folder.is_dir():
            return None
        return read_manifest(folder)

    def get(self, ref: str) -> Manifest:
        """The model named `ref`; NinferError with "did you mean" suggestions when it is not installed."""
        found = self.find(ref)
        if found is None:
            raise self.unknown(ref)
        return found

    def suggestions(self, ref: str, n: int = 3) -> list[str]:
        """Close installed names for a mistyped `ref`."""
        candidates = self.refs()
        name, tag = parse_ref(ref)
        same_name = [r for r in candidates if r.split(":")[0] == name]
        pool = {r: r for r in candidates}
        pool.update({r.split(":")[0]: r for r in candidates if r.endswith(":" + DEFAULT_TAG)})
        close = difflib.get_close_matches(ref.lower(), list(pool), n=n, cutoff=0.6)
        out = same_name + [pool[c] for c in close]
        return list(dict.fromkeys(out))[:n]

    def unknown(self, ref: str) -> NinferError:
        """The error for a name that is not installed (used by `get`, `rm`, `show`).

        Suggests close installed names first, then the pull catalog's (installable) ones.
        """
        hints = self.suggestions(ref)
        name = ref.strip().lower().partition(":")[0]
        catalog = _catalog_names()
        if hints:
            action = "did you mean " + " or ".join(hints) + "?"
        elif name in catalog:
            action = f"it is not installed: `ninfer pull {ref}`"
        elif close := difflib.get_close_matches(name, catalog, n=3, cutoff=0.6):
            action = "did you mean " + " or ".join(close) + "? (`ninfer pull NAME` installs it)"
        else:
            action = "`ninfer ls` lists installed models, `ninfer ls --available` the ones `ninfer pull` knows"
        return NinferError(f"no model named {ref!r} in {self.root}", action)

    # ---- writing

    def add(
        self,
        ref: str,
        artifact_file: Path,
        *,
        tag: str | None = None,
        source: str,
        revision: str | None = None,
        sha256: str | None = None,
        container_version: int = 3,
        move: bool = True,
    ) -> Manifest:
        """Install `artifact_file` (and its `.part-NNNN` siblings) as `ref`; atomic, replaces an old copy.

        `tag` overrides the tag in `ref` (default `latest`). With `move=False` the files are copied.
        """
        name, ref_tag = parse_ref(ref)
        tag = parse_ref(f"{name}:{tag}")[1] if tag else ref_tag
        entry = Path(artifact_file)
        if not entry.is_file():
            raise NinferError(f"artifact {entry} does not exist", "check the path")
        self.root.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        moved: list[tuple[Path, Path]] = []
        try:
            total = 0
            try:
                for src in _artifact_files(entry):
                    dst = stage / src.name
                    if move:
                        shutil.move(src, dst)
                        moved.append((src, dst))
                    else:
                        shutil.copyfile(src, dst)
                    total += dst.stat().st_size
            except BaseException:
                for src, dst in reversed(moved):  # a failed add must not lose the caller's files
                    shutil.move(dst, src)
                raise
            manifest = Manifest(
                name=name, tag=tag, source=source, artifact=entry.name, revision=revision, sha256=sha256,
                bytes=total, container_version=int(container_version),
                added=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            )
            _write_json_atomic(stage / MANIFEST, manifest.file_dict())
            final = self.root / name / tag
            final.parent.mkdir(parents=True, exist_ok=True)
            old = None
            if final.exists():
                old = final.with_name(f".old-{tag}-{os.getpid()}")
                os.replace(final, old)
            os.replace(stage, final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)
        manifest.path = final
        return manifest

    def remove(self, ref: str) -> int:
        """Delete a model's folder and its partial downloads; return the bytes freed.

        Works on a model whose manifest is broken; raises NinferError (with suggestions) when
        neither a folder nor a partial download exists.
        """
        name, tag = parse_ref(ref)
        targets = [p for p in (self.root / name / tag, self.root / _PARTIAL / name / tag) if p.exists()]
        if not targets:
            raise self.unknown(ref)
        freed = 0
        for path in targets:
            freed += _tree_bytes(path)
            shutil.rmtree(path)
            try:
                path.parent.rmdir()  # drop the empty <name>/ folder; fails harmlessly otherwise
            except OSError:
                pass
        return freed

    def free_bytes(self) -> int:
        """Free disk space where the store lives (its nearest existing parent)."""
        path = self.root
        while not path.exists() and path != path.parent:
            path = path.parent
        return shutil.disk_usage(path).free
