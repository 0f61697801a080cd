"""One entry point for every input `ninfer convert` takes: v1/v2 `.ninfer`, GGUF, HF checkpoint folder."""
from __future__ import annotations

from pathlib import Path

from engine.artifact.writer import DEFAULT_SPLIT_LIMIT
from engine.errors import NinferError

KINDS = ("legacy", "v3", "gguf", "hf")


def detect(path) -> str:
    """What `path` is: "legacy" (v1/v2 .ninfer), "v3", "gguf" or "hf" (checkpoint folder)."""
    path = Path(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return "hf"
        raise NinferError(f"{path}: folder has no config.json", "point at a Hugging Face checkpoint folder")
    if not path.is_file():
        raise NinferError(f"{path}: no such file or folder", "check the path")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:7] == b"NINFER\x00" and head[7:8] in (b"\x01", b"\x02"):
        return "legacy"
    if head[:7] == b"NINFER\x00" and head[7:8] == b"\x03":
        return "v3"
    if head[:4] == b"GGUF":
        return "gguf"
    raise NinferError(f"{path}: not a .ninfer, GGUF file or checkpoint folder (magic {head[:8]!r})",
                      "pass a v1/v2 .ninfer, a .gguf, or a folder with config.json and *.safetensors")


def default_output(src, kind: str, recipe: str | None) -> Path:
    """Where the result goes without -o: next to a file input, in the current folder for a checkpoint."""
    src = Path(src)
    if kind == "legacy":
        return src.with_name(src.stem + ".v3.ninfer")
    if kind == "gguf":
        return src.with_name(src.stem + (f".{recipe}" if recipe else "") + ".ninfer")
    return Path.cwd() / f"{src.resolve().name}.{recipe or 'groupwise-int'}.ninfer"


def convert(src, out=None, *, recipe: str | None = None, split_limit: int = DEFAULT_SPLIT_LIMIT,
            progress=None) -> Path:
    """Convert any supported input to a v3 artifact; returns the output path.

    progress: optional callable(done_bytes, total_bytes)."""
    kind = detect(src)
    out = Path(out) if out is not None else default_output(src, kind, recipe)
    tick = (lambda done, total, *_: progress(done, total)) if progress is not None else None
    if kind == "v3":
        raise NinferError(f"{src}: is already a v3 artifact", "use it as it is (`ninfer verify` checks it)")
    if kind == "legacy":
        if recipe is not None:
            raise NinferError("--recipe does not apply to an upgrade: v1/v2 weights are kept byte for byte",
                              "drop --recipe, or convert from the Hugging Face checkpoint")
        from engine.artifact.upgrade import upgrade

        return upgrade(src, out, split_limit=split_limit, progress=tick)
    if kind == "gguf":
        from engine.artifact.from_gguf import convert as from_gguf

        return from_gguf(src, out, recipe=recipe, split_limit=split_limit, progress=tick)
    from engine.artifact.from_hf import convert as from_hf

    return from_hf(src, out, recipe or "groupwise-int", split_limit=split_limit, progress=tick)
