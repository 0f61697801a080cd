"""Resumable, verified downloads of pinned Hub files.

Why not `hf_hub_download`: since huggingface_hub 1.18 it writes each attempt to a process-unique
`.incomplete` file and deletes it on failure, so a killed or interrupted run starts again from zero
(ux.md §1.7). Here huggingface_hub still does the Hub side (endpoint, token, metadata HEAD, error
types, its shared HTTP session; see `hub.py`), and this module owns the bytes:

    <partial dir>/<file>.<rev12>.part        the growing file; survives a killed process
    <partial dir>/<file>.<rev12>.part.json   what it is (repo, revision, etag, size) so a resume never
                                             splices bytes of another file onto it
    <partial dir>/<file>                     complete and verified, ready to move into the store
    <partial dir>/<file>.<rev12>.rejected    complete but the wrong size or SHA-256 (kept aside)
    <partial dir>/<file>.<rev12>.lock        held (flock) by the one process downloading it

A rerun asks for the rest with `Range: bytes=<have>-` and re-hashes the bytes it already has. Large
files go over several connections instead (`segments.py`): the partial is then preallocated and the
sidecar records each segment's progress.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import time
from pathlib import Path

from engine.errors import NinferError
from ninfer_cli.catalog import HubFile
from ninfer_cli.hub import Remote, endpoint, offline, resolve  # noqa: F401  (part of this module's API)
from ninfer_cli.hub import hub_error
from ninfer_cli.output import human_bytes

CHUNK = 1 << 20
_RETRIES = 3
PARALLEL_CONNECTIONS = 8
PARALLEL_MIN = 256 * 1024 * 1024  # smaller files gain little from parallel ranges
RETRY_PAUSE = 1.0  # seconds, times the attempt number, between in-process retries after a network error


class DownloadInterrupted(NinferError):
    """Ctrl+C during a transfer; the partial file is kept. The CLI exits 130 on it."""


class Partial:
    """The on-disk state of one file's download inside a model's partial folder."""

    def __init__(self, folder: Path, f: HubFile):
        self.file = f
        stem = f"{f.filename}.{f.revision[:12]}"
        self.part = folder / f"{stem}.part"
        self.info = folder / f"{stem}.part.json"
        self.rejected = folder / f"{stem}.rejected"
        self.lock = folder / f"{stem}.lock"
        self.done = folder / f.filename

    def have(self) -> int:
        """Bytes already downloaded (0 when no partial exists); a segmented partial counts its segments."""
        try:
            size = self.part.stat().st_size
        except FileNotFoundError:
            return 0
        # after the stat: a parallel download records its segments before it creates the (sparse) file
        segs = self._saved().get("segments")
        if isinstance(segs, list):
            return sum(min(done, end - start) for start, end, done in segs)
        return size

    def _saved(self) -> dict:
        try:
            saved = json.loads(self.info.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def segments(self) -> list[list[int]] | None:
        """`[start, end, done]` per segment of a parallel download, or None for a plain growing file."""
        segs = self._saved().get("segments")
        if not self.part.exists() or not isinstance(segs, list):
            return None
        return segs

    def save_segments(self, segs: list[list[int]]) -> None:
        """Record segment progress next to the partial (temp name + rename: never half-written)."""
        saved = self._saved()
        saved["segments"] = segs
        tmp = self.info.with_name(self.info.name + ".tmp")
        tmp.write_text(json.dumps(saved), encoding="utf-8")
        os.replace(tmp, self.info)

    def discard(self) -> None:
        """Forget the partial (used by --force and when the remote file changed)."""
        for p in (self.part, self.info):
            p.unlink(missing_ok=True)

    def matches(self, remote: Remote) -> bool:
        """Whether the partial on disk belongs to this exact remote file."""
        saved = self._saved()
        identity = _identity(self.file, remote)
        return {k: saved.get(k) for k in identity} == identity

    def claim(self, remote: Remote) -> None:
        """Record which remote file the partial holds, before the first byte is written."""
        self.info.write_text(json.dumps(_identity(self.file, remote)), encoding="utf-8")


def _identity(f: HubFile, remote: Remote) -> dict:
    return {"repo": f.repo, "revision": f.revision, "filename": f.filename, "etag": remote.etag, "size": remote.size}


def connections(size: int | None) -> int:
    """Parallel connections for a file: `$NINFER_PULL_CONNECTIONS` if set, else 8 for large files, 1 below."""
    env = os.environ.get("NINFER_PULL_CONNECTIONS", "").strip()
    if not hasattr(os, "pwrite"):  # Windows: segments need positioned writes
        return 1
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise NinferError(f"NINFER_PULL_CONNECTIONS={env!r} is not a number", "set it to 1..16, or unset it") from None
    return PARALLEL_CONNECTIONS if size and size >= PARALLEL_MIN else 1


def _open_part(path: Path):
    """Open the partial for appending (a seam the tests use to simulate a full disk)."""
    return open(path, "ab")


def _hash_prefix(path: Path, n: int, on_bytes) -> "hashlib._Hash":
    h = hashlib.sha256()
    with open(path, "rb") as src:
        left = n
        while left:
            block = src.read(min(CHUNK * 8, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
            on_bytes(len(block))
    return h


def fetch(
    f: HubFile,
    folder: Path,
    ref: str,
    *,
    progress=None,
    token: str | bool | None = None,
    force: bool = False,
    remote: Remote | None = None,
) -> Path:
    """Download `f` into `folder` (resuming a partial), verify size and SHA-256, return the complete file.

    `progress` is a rich `Progress` (or None for silence); `remote` is `resolve`'s answer when the
    caller already asked. The returned file sits in `folder`, ready for `Store.add(move=True)`. A wrong file is renamed `*.rejected` and raises NinferError; a full
    disk, a network failure or Ctrl+C keep the partial and raise NinferError / DownloadInterrupted.
    """
    state = Partial(folder, f)
    with _exclusive(state, ref):
        if force:
            state.discard()
            state.done.unlink(missing_ok=True)
        try:
            return _fetch_locked(state, ref, progress, remote or resolve(f, ref, token), token)
        except KeyboardInterrupt:  # anywhere outside the transfer loops (re-hashing, setting up workers)
            raise _interrupted(state, f.size, ref) from None


def _interrupted(state: "Partial", expected: int | None, ref: str) -> DownloadInterrupted:
    return DownloadInterrupted(
        f"interrupted: {human_bytes(state.have())} of {human_bytes(expected)} of {state.file.filename} kept",
        f"run `ninfer pull {ref}` again to resume",
    )


@contextlib.contextmanager
def _exclusive(state: Partial, ref: str):
    """Hold a lock on the partial so two pulls never append to the same file; the OS drops it if we die."""
    try:
        import fcntl  # noqa: PLC0415
    except ImportError:  # Windows: no advisory locks here; the SHA-256 check still catches a mix-up
        yield
        return
    with open(state.lock, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise NinferError(f"another `ninfer pull` is downloading {state.file.filename} for {ref}",
                              "wait for it to finish (or stop it), then run this again") from None
        try:
            yield
        finally:
            state.lock.unlink(missing_ok=True)


def _fetch_locked(state: Partial, ref: str, progress, remote: Remote, token) -> Path:
    f = state.file
    expected = f.size if f.size is not None else remote.size
    if f.size is not None and remote.size is not None and remote.size != f.size:
        raise NinferError(
            f"the Hub serves {f.filename} as {remote.size:,} bytes, the catalog pins {f.size:,}",
            "nothing was downloaded; update ninfer (the pin may be stale)",
        )
    if f.sha256 and remote.etag and len(remote.etag) == 64 and remote.etag.lower() != f.sha256.lower():
        raise NinferError(
            f"the Hub's SHA-256 of {f.filename} ({remote.etag[:12]}…) differs from the pinned {f.sha256[:12]}…",
            "nothing was downloaded; update ninfer (the pin may be stale)",
        )
    if state.have() and not state.matches(remote):
        state.discard()
    if not state.have() and state.done.is_file() and state.done.stat().st_size == expected:
        os.replace(state.done, state.part)  # finished earlier but never moved into the store: verify it again
    if not state.info.exists():
        state.claim(remote)
    task = None
    if progress is not None:
        task = progress.add_task(f.filename, total=expected, completed=0)

    def advance(n: int) -> None:
        if task is not None:
            progress.update(task, advance=n)

    n = connections(expected)
    if expected and (n > 1 or state.segments() is not None):
        from ninfer_cli.segments import RangesUnsupported, fetch_segments  # noqa: PLC0415

        if task is not None:
            progress.update(task, completed=state.have())
        try:
            fetch_segments(state, remote, expected, n, advance=advance, ref=ref, token=token)
        except RangesUnsupported:
            state.discard()  # this server cannot serve ranges: one plain stream from the start
            state.claim(remote)
            if task is not None:
                progress.reset(task, total=expected, completed=0)
        else:
            if task is not None:
                progress.reset(task, total=expected, completed=0, description=f"checking {f.filename}")
            return _verify(state, _hash_prefix(state.part, expected, advance).hexdigest(), ref)
    have = state.have()
    if expected is not None and have > expected:
        state.part.unlink()
        have = 0
    if task is not None and have:
        progress.update(task, description=f"checking {f.filename}")
    digest = _hash_prefix(state.part, have, advance) if have else hashlib.sha256()
    if task is not None and have:
        # restart the speed clock after re-hashing what was already here
        progress.reset(task, total=expected, completed=have, description=f.filename)
    if expected is None or have < expected:
        digest = _transfer(state, remote, expected, digest, advance, ref, token)
    return _verify(state, digest.hexdigest(), ref)


def _transfer(state: Partial, remote: Remote, expected: int | None, digest, advance, ref: str, token=None):
    """Append the missing bytes (Range from what is on disk), retrying transient network errors."""
    import httpx2  # noqa: PLC0415
    from huggingface_hub import constants  # noqa: PLC0415
    from huggingface_hub.utils import build_hf_headers, get_session  # noqa: PLC0415

    headers = build_hf_headers(token=token)
    headers["Accept-Encoding"] = "identity"
    retries = _RETRIES
    while True:
        have = state.have()
        if expected is not None and have >= expected:
            return digest
        if have:
            headers["Range"] = f"bytes={have}-"
        else:
            headers.pop("Range", None)
        try:
            with get_session().stream(
                "GET", remote.url, headers=headers, follow_redirects=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
            ) as response:
                if response.status_code == 416 and have:
                    state.discard()  # the server says our bytes reach past its file: start over
                    digest = hashlib.sha256()
                    state.claim(remote)
                    continue
                if response.status_code >= 400:
                    from huggingface_hub.utils import hf_raise_for_status  # noqa: PLC0415

                    response.read()
                    hf_raise_for_status(response)
                if have and response.status_code != 206:
                    # The server ignored Range and sends the whole file: drop ours rather than splice.
                    state.part.unlink(missing_ok=True)
                    digest = hashlib.sha256()
                    advance(-have)
                    have = 0
                _stream_into(state, response, digest, advance, expected, have, ref)
                retries = _RETRIES
            if expected is None:
                return digest
        except KeyboardInterrupt:
            raise _interrupted(state, expected, ref) from None
        except (httpx2.TransportError, httpx2.StreamError) as e:
            retries = _RETRIES if state.have() > have else retries - 1  # only failures in a row count
            if retries < 0:
                raise hub_error(e, state.file, ref) from None
            time.sleep(RETRY_PAUSE * (_RETRIES - retries))
        except Exception as e:
            from huggingface_hub import errors as hf  # noqa: PLC0415

            if isinstance(e, (hf.HfHubHTTPError, hf.OfflineModeIsEnabled)):
                raise hub_error(e, state.file, ref) from None
            raise


def _stream_into(state: Partial, response, digest, advance, expected, have, ref) -> None:
    written = have
    with _open_part(state.part) as out:
        try:
            for chunk in response.iter_bytes(CHUNK):
                if expected is not None and written + len(chunk) > expected:
                    chunk = chunk[: expected - written]
                out.write(chunk)
                digest.update(chunk)
                written += len(chunk)
                advance(len(chunk))
                if expected is not None and written >= expected:
                    break
        except OSError as e:
            if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
                _flush_quietly(out)
                kept = state.have()
                raise NinferError(
                    f"disk full after {human_bytes(kept)} of {human_bytes(expected)} of {state.file.filename}; "
                    f"the partial file is kept in {state.part.parent}",
                    f"free at least {human_bytes((expected or 0) - kept)} there, then run `ninfer pull {ref}` "
                    "again to resume",
                ) from None
            raise


def _flush_quietly(out) -> None:
    try:
        out.flush()
    except OSError:
        pass


def _verify(state: Partial, sha: str, ref: str) -> Path:
    """Check size and SHA-256; promote to the final name, or set the file aside and raise."""
    f = state.file
    size = state.part.stat().st_size
    bad = None
    if f.size is not None and size != f.size:
        bad = f"{f.filename} is {size:,} bytes, expected {f.size:,}"
    elif f.sha256 and sha.lower() != f.sha256.lower():
        bad = f"SHA-256 mismatch for {f.filename}: got {sha[:16]}…, expected {f.sha256[:16]}…"
    if bad:
        os.replace(state.part, state.rejected)
        state.info.unlink(missing_ok=True)
        raise NinferError(
            f"{bad}; the file was kept aside as {state.rejected} and not added to the store",
            f"run `ninfer pull {ref} --force` to download it again (delete the .rejected file to free the space)",
        )
    os.replace(state.part, state.done)
    state.info.unlink(missing_ok=True)
    state.rejected.unlink(missing_ok=True)  # an earlier bad copy is no longer worth keeping
    return state.done


def sha256_file(path: Path, progress=None, label: str | None = None) -> str:
    """SHA-256 of a local file, with an optional progress row."""
    size = path.stat().st_size
    task = progress.add_task(label or f"checking {path.name}", total=size) if progress is not None else None
    h = _hash_prefix(path, size, (lambda n: progress.update(task, advance=n)) if task is not None else (lambda n: None))
    return h.hexdigest()


def make_progress(console=None):
    """A rich Progress with one row per file: name, bar, done/total, speed, ETA (stderr)."""
    from rich.console import Console  # noqa: PLC0415
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )


class PhaseBars:
    """`bars(label, done, total)` drawn as one progress row a phase on stderr (a new label closes the
    row before it as complete): pull's download, extract and convert steps, one line each. Where stderr
    is not a terminal (a log, a pipe) each phase prints one plain line when it ends."""

    def __init__(self, console=None):
        from rich.console import Console  # noqa: PLC0415

        self._console = console or Console(stderr=True)
        self._live = self._console.is_terminal
        self._progress = make_progress(self._console) if self._live else None
        self._task = None
        self._label: str | None = None
        self._done, self._started = 0, 0.0

    def __enter__(self) -> "PhaseBars":
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type, *_) -> None:
        if exc_type is None:
            self._close()
        if self._progress is not None:
            self._progress.stop()

    def __call__(self, label: str, done: int, total: int | None) -> None:
        if label != self._label:
            self._close()
            self._label, self._started = label, time.perf_counter()
            if self._progress is not None:
                self._task = self._progress.add_task(label, total=total)
        self._done = done
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)

    def _close(self) -> None:
        if self._label is None:
            return
        if self._progress is not None:
            task = self._progress.tasks[-1]
            if task.total:
                self._progress.update(self._task, completed=task.total)
        else:
            secs = max(time.perf_counter() - self._started, 1e-9)
            self._console.print(f"{self._label}: {human_bytes(self._done)} in {secs:.1f} s "
                                f"({human_bytes(self._done / secs)}/s)", markup=False, highlight=False)
        self._label = None
