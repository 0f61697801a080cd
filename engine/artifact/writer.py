"""v3 file-set writer: 32-byte header, space-padded JSON, 4096-aligned payload, continuation parts.

The logical payload is written through `FileSetWriter`, which maps logical offsets to (file, offset)
across the entry file and its `*.part-NNNN` files. Everything goes to temporary names in the target
directory; `commit()` publishes the parts first and the entry file last, so an interrupted write
leaves nothing that looks like an artifact.
"""
from __future__ import annotations

import errno
import json
import os
import struct
import uuid
from pathlib import Path

import numpy as np

from engine.errors import NinferError

MAGIC_V3 = b"NINFER\x00\x03"
MAGIC_PART = b"NINPRT\x00\x03"
FILE_ALIGN = 4096
DEFAULT_SPLIT_LIMIT = 32_000_000_000
INITIAL_RESERVE = 4064  # 32 + 4064 = 4096
ROOT_ORDER = ("components", "objects", "bindings", "uses", "metadata", "provenance", "files")
_COPY_CHUNK = 1 << 26


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def dumps(obj) -> str:
    """The container's JSON spelling: compact, UTF-8 kept, NaN forbidden, insertion order."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def part_name(entry: Path, index: int) -> str:
    return f"{entry.name}.part-{index:04d}"


def plan_file_sizes(entry_payload_start: int, payload_bytes: int, split_limit: int) -> list[int]:
    """Per-file payload bytes: one file unless entry header + payload would exceed split_limit."""
    if entry_payload_start + payload_bytes <= split_limit:
        return [payload_bytes]
    entry_cap = (split_limit - entry_payload_start) // FILE_ALIGN * FILE_ALIGN
    part_cap = (split_limit - FILE_ALIGN) // FILE_ALIGN * FILE_ALIGN
    if entry_cap <= 0 or part_cap <= 0:
        raise NinferError(f"split limit {split_limit} bytes is too small for this artifact",
                          f"use a split limit above {entry_payload_start + FILE_ALIGN} bytes")
    sizes = [entry_cap]
    rest = payload_bytes - entry_cap
    while rest > 0:
        sizes.append(min(part_cap, rest))
        rest -= sizes[-1]
    return sizes


def frame_json(root: dict, entry: Path, payload_bytes: int, split_limit: int) -> tuple[bytes, list[dict]]:
    """Serialize root (without `files`) plus the file list; return (padded JSON bytes, files).

    The reserve starts at 4064 bytes and grows in 4096 steps until the JSON fits, so that
    `32 + json_bytes` is a multiple of 4096.
    """
    reserve = INITIAL_RESERVE
    while True:
        sizes = plan_file_sizes(32 + reserve, payload_bytes, split_limit)
        files = [{"path": None if i == 0 else part_name(entry, i), "payload_bytes": s} for i, s in enumerate(sizes)]
        full = dict(root)
        full["files"] = files
        ordered = {k: full[k] for k in ROOT_ORDER if k in full}
        text = dumps(ordered).encode("utf-8")
        if len(text) <= reserve:
            return text + b" " * (reserve - len(text)), files
        reserve = align_up(32 + len(text), FILE_ALIGN) - 32


class FileSetWriter:
    """Writes one v3 file set. Use as a context manager: commit on success, clean up on error.

    disk_bytes: what the payload will really occupy (less than payload_bytes when copying a sparse
    file); checked against the free space before anything is written."""

    def __init__(self, path: str | os.PathLike, root: dict, payload_bytes: int,
                 split_limit: int = DEFAULT_SPLIT_LIMIT, artifact_id: bytes | None = None,
                 disk_bytes: int | None = None):
        self.path = Path(path)
        self.artifact_id = artifact_id or uuid.uuid4().bytes
        text, self.files = frame_json(root, self.path, payload_bytes, split_limit)
        self.json_bytes = len(text)
        self.payload_bytes = payload_bytes
        finals = [self.path] + [self.path.parent / f["path"] for f in self.files[1:]]
        for p in finals:
            if p.exists():
                raise NinferError(f"{p} already exists", "remove it or choose another output name")
        if not self.path.parent.is_dir():
            raise NinferError(f"output folder {self.path.parent} does not exist", "create it first")
        self._check_disk(finals, payload_bytes if disk_bytes is None else disk_bytes)
        tag = uuid.uuid4().hex[:8]
        self._finals = finals
        self._temps = [p.with_name(f".{p.name}.tmp-{tag}") for p in finals]
        self._fds: list[int] = []
        self._starts: list[int] = []  # logical payload start of each file
        self._file_payload_off: list[int] = []  # where the payload begins inside each file
        try:
            cursor = 0
            for i, (tmp, f) in enumerate(zip(self._temps, self.files)):
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                self._fds.append(fd)
                if i == 0:
                    head = MAGIC_V3 + struct.pack("<Q", self.json_bytes) + self.artifact_id + text
                    start = 32 + self.json_bytes
                else:
                    head = MAGIC_PART + struct.pack("<Q", i) + self.artifact_id
                    start = FILE_ALIGN
                os.pwrite(fd, head, 0)
                os.ftruncate(fd, start + f["payload_bytes"])
                self._starts.append(cursor)
                self._file_payload_off.append(start)
                cursor += f["payload_bytes"]
        except BaseException:
            self.abort()
            raise

    def _check_disk(self, finals, payload_disk_bytes: int) -> None:
        need = payload_disk_bytes + FILE_ALIGN * (len(finals) + 1) + self.json_bytes
        try:
            free = os.statvfs(self.path.parent)
            avail = free.f_bavail * free.f_frsize
        except OSError:
            return
        if avail < need:
            raise NinferError(f"not enough disk space in {self.path.parent}: need {need / 1e9:.2f} GB, "
                              f"have {avail / 1e9:.2f} GB", "free some space or write elsewhere")

    @property
    def entry_payload_start(self) -> int:
        return 32 + self.json_bytes

    def _segments(self, logical: int, length: int):
        """Yield (fd, file_offset, data_offset, n) covering logical [logical, logical+length)."""
        if logical < 0 or logical + length > self.payload_bytes:
            raise NinferError(f"write outside the payload: [{logical}, {logical + length})")
        done = 0
        i = max(0, np.searchsorted(self._starts, logical, side="right") - 1)
        while done < length:
            while logical + done >= self._starts[i] + self.files[i]["payload_bytes"]:
                i += 1
            local = logical + done - self._starts[i]
            n = min(length - done, self.files[i]["payload_bytes"] - local)
            yield self._fds[i], self._file_payload_off[i] + local, done, n
            done += n

    def write(self, logical: int, data) -> None:
        """Write bytes (anything exposing the buffer protocol) at a logical payload offset."""
        mv = memoryview(data).cast("B")
        for fd, off, start, n in self._segments(logical, len(mv)):
            chunk = mv[start:start + n]
            while chunk:
                written = os.pwrite(fd, chunk, off)
                chunk, off = chunk[written:], off + written

    def copy_from(self, src_fd: int, src_off: int, length: int, logical: int) -> int:
        """Copy length bytes of src_fd at src_off to a logical offset, skipping holes of the source.

        Returns the number of bytes actually moved (data regions only)."""
        moved = 0
        for seg_off, seg_len in _data_regions(src_fd, src_off, length):
            for fd, off, start, n in self._segments(logical + seg_off - src_off, seg_len):
                moved += _copy_range(src_fd, seg_off + start, fd, off, n)
        return moved

    def commit(self) -> list[Path]:
        """Flush, then rename parts first and the entry file last. Returns the published paths."""
        for fd in self._fds:
            os.fsync(fd)
            os.close(fd)
        self._fds = []
        for tmp, final in list(zip(self._temps, self._finals))[1:] + [(self._temps[0], self._finals[0])]:
            os.replace(tmp, final)
        self._temps = []
        return self._finals

    def abort(self) -> None:
        """Close and delete every temporary file."""
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        for tmp in self._temps:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        self._temps = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False


def _data_regions(fd: int, start: int, length: int):
    """(offset, length) of the non-hole regions of fd within [start, start+length)."""
    end = start + length
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole remains
                return
            yield pos, end - pos  # SEEK_DATA unsupported: treat everything as data
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole - data
        pos = hole


def _copy_range(src: int, src_off: int, dst: int, dst_off: int, n: int) -> int:
    total = 0
    use_cfr = hasattr(os, "copy_file_range")
    while total < n:
        step = min(_COPY_CHUNK, n - total)
        got = 0
        if use_cfr:
            try:
                got = os.copy_file_range(src, dst, step, src_off + total, dst_off + total)
            except OSError:
                use_cfr = False
        if not use_cfr:
            buf = os.pread(src, step, src_off + total)
            got = len(buf)
            if got:
                os.pwrite(dst, buf, dst_off + total)
        if got == 0:
            raise NinferError("source file ended early while copying", "the input file is truncated")
        total += got
    return total


def tensor_bytes(fmt: str, layout: str, shape, data) -> np.ndarray:
    """Turn a writer input into object bytes: a zero-argument callable is called first; uint8
    arrays and bytes of exactly the encoded size are taken as encoded; other arrays are encoded."""
    from engine.artifact import formats

    if callable(data):
        data = data()
    need = formats.encoded_size(fmt, layout, shape)
    if isinstance(data, (bytes, bytearray, memoryview)):
        arr = np.frombuffer(data, dtype=np.uint8)
    else:
        arr = np.asarray(data)
        if arr.dtype != np.uint8 or arr.size != need:
            if tuple(arr.shape) != tuple(shape):
                raise NinferError(f"tensor data of shape {list(arr.shape)} does not match {list(shape)}")
            arr = formats.encode(fmt, layout, arr)
    if arr.size != need:
        raise NinferError(f"{fmt} {list(shape)} needs {need} bytes, got {arr.size}")
    return arr.reshape(-1)


def write_artifact(path, components: dict, tensors, resources: dict | None = None, bindings: dict | None = None,
                   uses: list | None = None, metadata: dict | None = None, provenance: dict | None = None,
                   split_limit: int = DEFAULT_SPLIT_LIMIT, progress=None) -> Path:
    """Write a v3 artifact. Streaming: tensor data may be a zero-argument callable, called once
    while writing, so only one tensor is in memory at a time.

    tensors: iterable of (id, format, layout, shape, data); resources: {object id: bytes}, placed
    first; bindings: {parameter: binding}, default one whole-object binding per tensor;
    progress: optional callable(done_bytes, total_bytes, object_id) over tensor bytes.
    """
    from engine.artifact import formats

    plan = [(tid, fmt, layout, tuple(int(s) for s in shape), data) for tid, fmt, layout, shape, data in tensors]
    resources = dict(resources or {})
    objects, cursor = [], 0
    for rid, blob in resources.items():
        objects.append({"id": rid, "kind": "resource", "offset": cursor, "bytes": len(blob), "encoding": "raw_bytes_v1"})
        cursor += len(blob)
    for tid, fmt, layout, shape, _ in plan:
        size = formats.encoded_size(fmt, layout, shape)
        off = align_up(cursor, 256)
        objects.append({"id": tid, "kind": "tensor", "offset": off, "bytes": size, "shape": list(shape),
                        "format": fmt, "layout": layout})
        cursor = off + size
    ids = [o["id"] for o in objects]
    if len(set(ids)) != len(ids):
        raise NinferError("duplicate object ids in the artifact plan")
    if bindings is None:
        bindings = {tid: {"object": tid} for tid, *_ in plan}
    root = {"components": components, "objects": objects, "bindings": bindings, "uses": uses or []}
    if metadata is not None:
        root["metadata"] = metadata
    if provenance is not None:
        root["provenance"] = provenance
    with FileSetWriter(path, root, cursor, split_limit) as w:
        for obj in objects[: len(resources)]:
            w.write(obj["offset"], resources[obj["id"]])
        done, total = 0, sum(o["bytes"] for o in objects[len(resources):])
        if progress is not None:
            progress(0, total, None)  # the total before the first (possibly slow) tensor
        for obj, (tid, fmt, layout, shape, data) in zip(objects[len(resources):], plan):
            w.write(obj["offset"], tensor_bytes(fmt, layout, shape, data))
            done += obj["bytes"]
            if progress is not None:
                progress(done, total, tid)
    return Path(path)
