"""`ninfer pull --from PATH`: register a local `.ninfer`, GGUF file or Hugging Face checkpoint folder.

A v3 `.ninfer` is hashed and copied (or moved) into the store as is; anything else is converted to v3
first through `engine.artifact` (`upgrade` for v1/v2, `from_gguf`, `from_hf`), into the model's partial
folder, then moved into the store, so nothing half-written ever appears there.
"""
from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

from engine.errors import NinferError

_MAGIC_NINFER = b"NINFER\x00"
_MAGIC_GGUF = b"GGUF"
# Fallbacks when engine.artifact.convert (one entry point for every kind) is absent: f(src, dst) per kind.
_CONVERTERS = {
    "legacy": ("engine.artifact.upgrade", ("upgrade",)),
    "gguf": ("engine.artifact.from_gguf", ("convert",)),
    "hf": ("engine.artifact.from_hf", ("convert",)),
}


def container_version(path: Path) -> int | None:
    """The `.ninfer` container version from the file's magic (1, 2, 3), or None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    if len(head) == 8 and head.startswith(_MAGIC_NINFER):
        return head[7]
    return None


def legacy_locations(filename: str) -> list[Path]:
    """Where the upstream download scripts left artifacts: `$NINFER_MODEL_DIR` and `./models`."""
    dirs = [os.environ.get("NINFER_MODEL_DIR"), "models"]
    out = []
    for d in dirs:
        if d:
            p = Path(d).expanduser() / filename
            if p.is_file():
                out.append(p)
    return out


def hf_cache_copy(repo: str, filename: str, revision: str) -> Path | None:
    """The file in the Hugging Face cache (`hf download` put it there), resolved to its blob, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415

        cache = os.environ.get("HF_HUB_CACHE") or (
            str(Path(os.environ["HF_HOME"]) / "hub") if os.environ.get("HF_HOME") else None)
        found = try_to_load_from_cache(repo, filename, cache_dir=cache, revision=revision)
    except Exception:  # a damaged cache must never stop a pull
        return None
    return Path(found).resolve() if isinstance(found, str) else None


def detect(path: Path) -> str:
    """What `path` is: "v3", "legacy" (v1/v2 .ninfer), "gguf" or "hf" (a checkpoint folder)."""
    if path.is_dir():
        if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
            return "hf"
        raise NinferError(f"{path} is a folder without config.json and *.safetensors",
                          "point --from at a Hugging Face checkpoint folder, a .gguf or a .ninfer file")
    if not path.is_file():
        raise NinferError(f"{path} does not exist", "check the path")
    version = container_version(path)
    if version == 3:
        return "v3"
    if version in (1, 2):
        return "legacy"
    with open(path, "rb") as f:
        if f.read(4) == _MAGIC_GGUF:
            return "gguf"
    raise NinferError(f"{path} is not a .ninfer, GGUF file or checkpoint folder",
                      "pass a .ninfer (v1-v3), a .gguf, or a folder with config.json and *.safetensors")


def default_name(path: Path) -> str:
    """A store name from a path: `Qwen3_6_27B.Q4.gguf` -> `qwen3_6_27b.q4`."""
    stem = path.name if path.is_dir() else path.stem
    slug = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return slug or "local-model"


def _converter(kind: str):
    """A callable `(src, dst, progress=None) -> Path` converting `kind` to a v3 file at dst."""
    try:
        from engine.artifact.convert import convert as convert_any  # noqa: PLC0415
    except ImportError:
        convert_any = None
    if convert_any is not None:
        return lambda src, dst, progress=None: convert_any(src, dst, progress=progress)
    module_name, names = _CONVERTERS[kind]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    for fn in names:
        if module is not None and callable(getattr(module, fn, None)):
            return lambda src, dst, progress=None, f=getattr(module, fn): f(src, dst)
    if kind == "gguf":
        # Without engine.artifact's GGUF import, the default model's importer handles llama-family GGUFs.
        from ninfer_cli.default_model import convert_gguf  # noqa: PLC0415

        return lambda src, dst, progress=None: convert_gguf(src, dst)
    what = {"legacy": "upgrading v1/v2 .ninfer files", "gguf": "GGUF import", "hf": "checkpoint conversion"}[kind]
    raise NinferError(f"{what} is not available in this build ({module_name})",
                      "convert the file elsewhere to a v3 .ninfer and pass that to --from")


def register(path: Path, name: str | None, *, move: bool = False, force: bool = False, dry_run: bool = False):
    """Add a local artifact (converted to v3 when needed) to the store as `name`; returns its Manifest.

    A v3 file byte-identical to a catalog artifact (same size and SHA-256) is registered under that
    catalog name by default, with its pinned revision, so `ninfer pull NAME` then finds it up to date.
    """
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.store import Store, parse_ref  # noqa: PLC0415

    path = Path(path).expanduser()
    kind = detect(path)
    match, sha = _catalog_match(path) if kind == "v3" and not dry_run else (None, None)
    ref = "{}:{}".format(*parse_ref(name or (match.name if match else default_name(path))))
    store = Store()
    existing = None
    try:
        existing = store.find(ref)
    except NinferError:
        pass
    if existing is not None and not force:
        raise NinferError(f"{ref} is already installed ({existing.source})",
                          "pick another name (`ninfer pull NAME --from PATH`) or pass --force to replace it")
    copy_bytes = 0 if (kind == "v3" and move) else _tree_size(path)
    free = store.free_bytes()
    action = {"v3": "move" if move else "copy", "legacy": "upgrade to v3", "gguf": "convert GGUF to v3",
              "hf": "convert checkpoint to v3"}[kind]
    if dry_run:
        output.info("dry run: nothing changed")
        output.key_values([("model", ref), ("from", str(path)), ("action", action),
                           ("disk", f"need about {output.human_bytes(copy_bytes)}, have {output.human_bytes(free)}")])
        return None
    if copy_bytes > free:
        raise NinferError(f"not enough disk space in {store.root}: need about {output.human_bytes(copy_bytes)}, "
                          f"have {output.human_bytes(free)}",
                          "free some space, use --move for a .ninfer file, or set NINFER_HOME to a disk with room")
    source = f"file://{path.resolve()}"
    if kind == "v3":
        revision = match.files[0].revision if match else None
        manifest = store.add(ref, path, source=source, revision=revision, sha256=sha or _hash(path),
                             container_version=3, move=move)
    else:
        manifest = _add_converted(store, ref, path, kind, action, source)
    output.info(f"registered {ref} ({output.human_bytes(manifest.bytes)}) from {path}")
    return manifest


def _hash(path: Path) -> str:
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.download import make_progress, sha256_file  # noqa: PLC0415

    with make_progress(output.stderr()) as progress:
        return sha256_file(path, progress, f"hashing {path.name}")


def _catalog_match(path: Path):
    """(catalog entry, sha256) when `path` is byte-identical to a pinned artifact; hashes only on a size match."""
    from ninfer_cli.catalog import entries  # noqa: PLC0415

    size = path.stat().st_size
    candidates = [e for e in entries().values() if len(e.files) == 1 and e.files[0].size == size and e.files[0].sha256]
    if not candidates:
        return None, None
    sha = _hash(path)
    return next((e for e in candidates if e.files[0].sha256.lower() == sha), None), sha


def _add_converted(store, ref: str, path: Path, kind: str, action: str, source: str):
    """Convert into the model's partial folder (never half-written in the store), then move it in."""
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.download import make_progress  # noqa: PLC0415

    folder = store.partial_dir(ref)
    out = folder / (default_name(path) + ".ninfer")
    output.info(f"{action}: {path} -> {ref}")
    try:
        try:
            with make_progress(output.stderr()) as bar:
                task = bar.add_task(action, total=None)
                result = _converter(kind)(path, out, progress=lambda done, total: bar.update(
                    task, completed=done, total=total))
        except (NinferError, KeyboardInterrupt):
            raise
        except Exception as e:
            raise NinferError(f"could not convert {path}: {type(e).__name__}: {e}",
                              "check that it is a supported model (Qwen3.5/3.6/3.8 or Llama family)") from None
        out = Path(result) if isinstance(result, (str, os.PathLike)) else out
        if container_version(out) != 3:
            raise NinferError(f"conversion of {path} did not produce a v3 .ninfer", "report this as a bug")
        return store.add(ref, out, source=source, sha256=_hash(out), container_version=3, move=True)
    finally:
        for p in (folder, folder.parent, folder.parent.parent):
            try:
                p.rmdir()
            except OSError:
                break


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
