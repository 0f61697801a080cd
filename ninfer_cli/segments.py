"""Parallel ranged download of one large file, resumable segment by segment across processes.

One connection to the Hub's CDN often gives a fraction of the line's speed (upstream NInfer used
`aria2c -x16`). For a large file the missing range is split into segments; each worker GETs
`Range: bytes=<start+done>-<end-1>` and writes at its offset into the (sparse) partial file. The
sidecar `.part.json` records `[start, end, done]` per segment, saved every `SAVE_EVERY` seconds and on
any stop, so a killed run loses at most the bytes written since the last save (they are fetched again;
bytes on disk past a segment's `done` are simply overwritten). The SHA-256 is computed once the file is
whole; a mismatch sets the file aside like a sequential download does.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

from engine.errors import NinferError

MIN_SEGMENT = 1 << 20  # only small files (which pull sequentially unless asked) get segments this short
SAVE_EVERY = 0.5  # seconds between sidecar saves while workers run


class RangesUnsupported(Exception):
    """The server answered a ranged GET with the whole file: fall back to one sequential stream."""


def plan(size: int, have: int, n: int) -> list[list[int]]:
    """Segments `[start, end, done]` covering [0, size): a finished prefix `have`, the rest in ~n parts."""
    segs = [[0, have, have]] if have else []
    rest = size - have
    parts = max(1, min(n, rest // MIN_SEGMENT))
    bounds = [have + rest * i // parts for i in range(parts + 1)]
    segs += [[a, b, 0] for a, b in zip(bounds, bounds[1:]) if b > a]
    return segs


def _pwrite(fd: int, data: bytes, offset: int) -> int:
    """Write at an offset (a seam the tests use to simulate a full disk)."""
    return os.pwrite(fd, data, offset)


def fetch_segments(state, remote, expected: int, n: int, *, advance, ref: str, token=None) -> None:
    """Fill `state.part` to `expected` bytes with up to `n` parallel ranged GETs; raise NinferError on failure.

    `state` is a `download.Partial` (its sidecar keeps the segments); `advance(nbytes)` drives the progress row.
    """
    segs = state.segments()
    if segs is None:
        plain = state.part.stat().st_size if state.part.exists() else 0
        segs = plan(expected, min(plain, expected), n)  # a sequential partial becomes the first segment
        state.save_segments(segs)
    with open(state.part, "r+b" if state.part.exists() else "w+b") as f:
        if os.fstat(f.fileno()).st_size < expected:
            f.truncate(expected)  # sparse: blocks are allocated as bytes arrive
        _run(state, remote, segs, f.fileno(), n, advance, ref, token)


def _run(state, remote, segs, fd, n, advance, ref, token) -> None:
    from huggingface_hub.utils import build_hf_headers  # noqa: PLC0415

    todo = [s for s in segs if s[2] < s[1] - s[0]]
    if not todo:
        return
    lock = threading.Lock()
    stop = threading.Event()
    headers = build_hf_headers(token=token)
    headers["Accept-Encoding"] = "identity"

    def progress(seg, nbytes):
        with lock:
            seg[2] += nbytes
        advance(nbytes)

    pool = ThreadPoolExecutor(max_workers=max(1, min(n, len(todo))), thread_name_prefix="ninfer-pull")
    futures = [pool.submit(_worker, seg, remote.url, dict(headers), fd, stop, progress, state, ref) for seg in todo]
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=SAVE_EVERY, return_when=FIRST_EXCEPTION)
            with lock:
                state.save_segments(segs)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                stop.set()
                wait(pending)
                raise failed[0].exception()
    except KeyboardInterrupt:
        stop.set()  # let the workers finish their current chunk; the caller reports what was kept
        wait(futures)
        raise
    finally:
        pool.shutdown(wait=True)
        with lock:
            state.save_segments(segs)


def _worker(seg, url, headers, fd, stop, progress, state, ref) -> None:
    import httpx2  # noqa: PLC0415
    from huggingface_hub import constants  # noqa: PLC0415
    from huggingface_hub.utils import get_session, hf_raise_for_status  # noqa: PLC0415

    from ninfer_cli.download import RETRY_PAUSE  # noqa: PLC0415
    from ninfer_cli.hub import hub_error  # noqa: PLC0415

    start, end = seg[0], seg[1]
    retries = 3
    while seg[2] < end - start and not stop.is_set():
        pos = start + seg[2]
        headers["Range"] = f"bytes={pos}-{end - 1}"
        try:
            with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                                      timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
                if response.status_code >= 400:
                    response.read()
                    hf_raise_for_status(response)
                if response.status_code != 206 or not response.headers.get("Content-Range", "").startswith(
                        f"bytes {pos}-"):
                    raise RangesUnsupported()
                for chunk in response.iter_bytes(1 << 20):
                    if stop.is_set():
                        return
                    chunk = chunk[: end - start - seg[2]]
                    _write(fd, chunk, start + seg[2], state, ref)
                    progress(seg, len(chunk))
                    if seg[2] >= end - start:
                        break
        except (httpx2.TransportError, httpx2.StreamError) as e:
            retries = 3 if start + seg[2] > pos else retries - 1  # only failures in a row count
            if retries < 0:
                raise hub_error(e, state.file, ref) from None
            time.sleep(RETRY_PAUSE)
        except RangesUnsupported:
            raise
        except NinferError:
            raise
        except Exception as e:
            from huggingface_hub import errors as hf  # noqa: PLC0415

            if isinstance(e, (hf.HfHubHTTPError, hf.OfflineModeIsEnabled)):
                raise hub_error(e, state.file, ref) from None
            raise


def _write(fd: int, chunk: bytes, offset: int, state, ref: str) -> None:
    view = memoryview(chunk)
    while view:
        try:
            n = _pwrite(fd, view, offset)
        except OSError as e:
            if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
                raise NinferError(
                    f"disk full while downloading {state.file.filename}; the partial file is kept in "
                    f"{state.part.parent}",
                    f"free some space there, then run `ninfer pull {ref}` again to resume",
                ) from None
            raise
        view = view[n:]
        offset += n
