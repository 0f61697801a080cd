"""Read `.ninfer` artifacts (v3 natively; v1/v2 through `legacy`) as zero-copy memory maps.

Data flow: `open_artifact(path)` checks framing and the JSON schema, maps every file of the set,
and resolves logical parameter names through `bindings` to byte ranges of physical objects.
Object bytes are views of the memory map; an object that straddles two part files is copied once.
"""
from __future__ import annotations

import json
import math
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.artifact import formats
from engine.artifact.writer import (DEFAULT_SPLIT_LIMIT, FILE_ALIGN, MAGIC_PART, MAGIC_V3, align_up,  # noqa: F401
                                    write_artifact)
from engine.errors import NinferError

MAGIC_V1 = b"NINFER\x00\x01"
MAGIC_V2 = b"NINFER\x00\x02"
ROOT_KEYS = {"components", "objects", "bindings", "uses", "files", "metadata", "provenance"}
ROOT_REQUIRED = ("components", "objects", "bindings", "uses", "files")
TENSOR_KEYS = {"id", "kind", "shape", "format", "layout", "offset", "bytes"}
RESOURCE_KEYS = {"id", "kind", "encoding", "offset", "bytes"}
COMPONENT_KEYS = {"config", "target", "resources", "proposal"}
_DAMAGED = "the file is damaged or truncated; re-download or re-convert it"


@dataclass(frozen=True)
class ObjectInfo:
    """One physical object; offset is into the logical payload."""

    id: str
    kind: str  # "tensor" | "resource"
    shape: tuple
    format: str | None
    layout: str | None
    offset: int
    bytes: int


@dataclass(frozen=True)
class PackedSlice:
    """Rows [row0, row1) of a physical object, as a GPU loader takes them."""

    object_id: str
    fmt: str
    layout: str
    shape: tuple  # shape of the whole object
    row0: int
    row1: int


@dataclass(frozen=True)
class FileSpan:
    """Where a file's share of the logical payload lies."""

    path: Path
    payload_start: int  # offset of its payload inside the file
    payload_bytes: int
    logical_start: int


class Artifact:
    """An opened artifact. Attributes: version, artifact_id (16 bytes), components, objects,
    bindings, uses, metadata, provenance, path, parts (continuation file paths), payload_bytes."""

    def __init__(self, path: Path, version: int, artifact_id: bytes, root: dict, spans: list[FileSpan]):
        self.path = Path(path)
        self.version = version
        self.artifact_id = artifact_id
        self.root = root
        self.components: dict = root.get("components", {})
        self.bindings: dict = root.get("bindings", {})
        self.uses: list = root.get("uses", [])
        self.metadata: dict | None = root.get("metadata")
        self.provenance: dict | None = root.get("provenance")
        self.files: list = root.get("files", [])
        self.spans = spans
        self.parts = [s.path for s in spans[1:]]
        self.payload_bytes = sum(s.payload_bytes for s in spans)
        self.objects: dict[str, ObjectInfo] = {}
        for o in root["objects"]:
            self.objects[o["id"]] = ObjectInfo(o["id"], o["kind"], tuple(o.get("shape", ())), o.get("format"),
                                               o.get("layout"), o["offset"], o["bytes"])
        self._maps: list[np.ndarray | None] = [None] * len(spans)

    # -- bytes ------------------------------------------------------------------------------
    def _map(self, i: int) -> np.ndarray:
        if self._maps[i] is None:
            s = self.spans[i]
            if s.payload_bytes == 0:
                self._maps[i] = np.zeros(0, dtype=np.uint8)
            else:
                self._maps[i] = np.memmap(s.path, dtype=np.uint8, mode="r", offset=s.payload_start,
                                          shape=(s.payload_bytes,))
        return self._maps[i]

    def payload_range(self, offset: int, nbytes: int) -> np.ndarray:
        """Bytes [offset, offset+nbytes) of the logical payload: a view, or one copy across files."""
        pieces = []
        end = offset + nbytes
        for i, s in enumerate(self.spans):
            lo, hi = max(offset, s.logical_start), min(end, s.logical_start + s.payload_bytes)
            if lo < hi:
                pieces.append(self._map(i)[lo - s.logical_start: hi - s.logical_start])
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint8)

    def object_bytes(self, object_id: str) -> np.ndarray:
        """The object's bytes as uint8 (memmap view; one copy only when it straddles parts)."""
        o = self._object(object_id)
        return self.payload_range(o.offset, o.bytes)

    def _object(self, object_id: str) -> ObjectInfo:
        try:
            return self.objects[object_id]
        except KeyError:
            raise NinferError(f"{self.path}: no object {object_id!r}") from None

    # -- bindings ---------------------------------------------------------------------------
    def binding_parts(self, name: str) -> list[tuple[str, int, int]]:
        """[(object_id, begin_element, end_element)] forming the parameter, in order."""
        b = self.bindings.get(name)
        if b is None:
            raise NinferError(f"{self.path}: no parameter {name!r}",
                              "run `ninfer inspect` to list what this artifact holds")
        if "object" in b:
            o = self._object(b["object"])
            return [(o.id, 0, math.prod(o.shape))]
        return [(p["object"], int(p["range"][0]), int(p["range"][1])) for p in b["parts"]]

    def parameter_shape(self, name: str) -> tuple:
        """Shape of a logical parameter: the object's for whole bindings, else rows of the parents."""
        b = self.bindings.get(name)
        if b is not None and "object" in b:
            return self._object(b["object"]).shape
        rows, inner_shape = 0, None
        for oid, lo, hi in self.binding_parts(name):
            shape = self._object(oid).shape
            inner = math.prod(shape[1:]) if len(shape) > 1 else 1
            if len(shape) <= 1 or lo % inner or hi % inner:
                return (sum(h - lo_ for _, lo_, h in self.binding_parts(name)),)
            if inner_shape not in (None, shape[1:]):
                return (sum(h - lo_ for _, lo_, h in self.binding_parts(name)),)
            inner_shape = shape[1:]
            rows += (hi - lo) // inner
        return (rows,) + tuple(inner_shape)

    def packed(self, name: str) -> list[PackedSlice]:
        """Row slices of physical objects forming the parameter (what a GPU loader needs)."""
        out = []
        for oid, lo, hi in self.binding_parts(name):
            o = self._object(oid)
            inner = math.prod(o.shape[1:]) if len(o.shape) > 1 else 1
            if lo % inner or hi % inner:
                raise NinferError(f"{self.path}: parameter {name} is not a row range of {oid}")
            out.append(PackedSlice(oid, o.format, o.layout, o.shape, lo // inner, hi // inner))
        return out

    def parameter(self, name: str, dtype=np.float32) -> np.ndarray:
        """The decoded logical parameter (float32 by default; dtype=None keeps the stored dtype)."""
        chunks = []
        for oid, lo, hi in self.binding_parts(name):
            o = self._object(oid)
            if o.kind != "tensor":
                raise NinferError(f"{self.path}: parameter {name} binds resource {oid}")
            if o.format in formats.OPAQUE:
                raise NinferError(f"{self.path}: {name} is stored as {o.format}, which the NumPy engine "
                                  "cannot decode", "use a groupwise-int or bf16 artifact on this machine")
            inner = math.prod(o.shape[1:]) if len(o.shape) > 1 else 1
            buf = self.object_bytes(oid)
            if lo % inner == 0 and hi % inner == 0 and o.shape:
                rows = formats.decode_rows(o.format, o.layout, o.shape, buf, lo // inner, hi // inner)
                chunks.append(rows.reshape(-1))
            else:
                chunks.append(formats.decode(o.format, o.layout, o.shape, buf).reshape(-1)[lo:hi])
        flat = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
        out = flat.reshape(self.parameter_shape(name))
        return out if dtype is None else out.astype(dtype, copy=False)

    def resource(self, role: str, component: str = "text") -> bytes:
        """Bytes of a resource by role, e.g. resource("tokenizer.json")."""
        oid = self.components.get(component, {}).get("resources", {}).get(role)
        if oid is None:
            raise NinferError(f"{self.path}: component {component!r} has no resource {role!r}")
        return bytes(self.object_bytes(oid))

    def has_resource(self, role: str, component: str = "text") -> bool:
        return role in self.components.get(component, {}).get("resources", {})

    def close(self) -> None:
        self._maps = [None] * len(self.spans)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self) -> str:
        return f"Artifact({str(self.path)!r}, v{self.version}, {len(self.objects)} objects)"


# --- opening --------------------------------------------------------------------------------

def open_artifact(path) -> Artifact:
    """Open any .ninfer version; v1/v2 are presented with v3 names (see `legacy`)."""
    path = Path(path)
    if not path.is_file():
        raise NinferError(f"{path}: no such file", "check the path, or `ninfer ls` for stored models")
    with open(path, "rb") as f:
        head = f.read(32)
    if head[:8] == MAGIC_V3:
        return _open_v3(path, head)
    if head[:8] in (MAGIC_V1, MAGIC_V2):
        from engine.artifact import legacy

        return legacy.open_legacy(path)
    if head[:8] == MAGIC_PART:
        raise NinferError(f"{path}: is a continuation part, not an entry file", "open the file without .part-NNNN")
    raise NinferError(f"{path}: not a .ninfer file (magic {head[:8]!r})", "pass a .ninfer artifact")


def _bad(path: Path, what: str) -> NinferError:
    return NinferError(f"{path}: {what}", "the file is damaged or not a v3 artifact; re-download or re-convert it")


def read_json(path: Path, start: int, nbytes: int, size: int) -> dict:
    """Parse the JSON region; trailing whitespace is allowed."""
    if nbytes <= 0 or start + nbytes > size:
        raise NinferError(f"{path}: JSON length {nbytes} does not fit a {size}-byte file (truncated?)", _DAMAGED)
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read(nbytes)
    try:
        root = json.loads(raw.decode("utf-8").rstrip(" \t\r\n"))
    except (UnicodeDecodeError, ValueError) as e:
        raise NinferError(f"{path}: metadata is not valid JSON ({e})", _DAMAGED) from None
    if not isinstance(root, dict):
        raise NinferError(f"{path}: JSON root is not an object", _DAMAGED)
    return root


def _open_v3(path: Path, head: bytes) -> Artifact:
    size = path.stat().st_size
    if len(head) < 32:
        raise _bad(path, "shorter than the 32-byte header")
    json_bytes = struct.unpack("<Q", head[8:16])[0]
    artifact_id = head[16:32]
    root = read_json(path, 32, json_bytes, size)
    validate_root(path, root)
    files = root["files"]
    spans, logical = [], 0
    entry_start = align_up(32 + json_bytes, FILE_ALIGN)
    for i, f in enumerate(files):
        if i == 0:
            fpath, start = path, entry_start
            if size != start + f["payload_bytes"]:
                raise _bad(path, f"file is {size} bytes, expected {start + f['payload_bytes']} (truncated?)")
        else:
            fpath, start = path.parent / f["path"], FILE_ALIGN
            _check_part(path, fpath, i, artifact_id, f["payload_bytes"])
        spans.append(FileSpan(fpath, start, f["payload_bytes"], logical))
        logical += f["payload_bytes"]
    validate_objects(path, root["objects"], logical)
    validate_bindings(path, root)
    return Artifact(path, 3, artifact_id, root, spans)


def _check_part(entry: Path, part: Path, index: int, artifact_id: bytes, payload_bytes: int) -> None:
    if not part.is_file():
        raise NinferError(f"{entry}: continuation part {part.name} is missing",
                          "keep every .part-NNNN file next to the entry file")
    with open(part, "rb") as f:
        head = f.read(32)
    if head[:8] != MAGIC_PART or len(head) < 32:
        raise _bad(part, "not a continuation part (bad magic)")
    if struct.unpack("<Q", head[8:16])[0] != index:
        raise _bad(part, f"part index {struct.unpack('<Q', head[8:16])[0]} where {index} was expected")
    if head[16:32] != artifact_id:
        raise _bad(part, f"belongs to another artifact (id {uuid.UUID(bytes=head[16:32])})")
    if part.stat().st_size != FILE_ALIGN + payload_bytes:
        raise _bad(part, f"is {part.stat().st_size} bytes, expected {FILE_ALIGN + payload_bytes} (truncated?)")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_root(path: Path, root: dict) -> None:
    """Schema of the v3 JSON root (generic members are closed; config/metadata/provenance open)."""
    unknown = set(root) - ROOT_KEYS
    if unknown:
        raise _bad(path, f"unknown JSON root members {sorted(unknown)}")
    for k in ROOT_REQUIRED:
        if k not in root:
            raise _bad(path, f"JSON root has no {k!r}")
    comps = root["components"]
    if not isinstance(comps, dict) or "text" not in comps:
        raise _bad(path, "components must be an object containing 'text'")
    for cid, c in comps.items():
        if not isinstance(c, dict) or set(c) - COMPONENT_KEYS or not isinstance(c.get("config", {}), dict):
            raise _bad(path, f"component {cid!r} is not {{config, target?, resources?, proposal?}}")
    if not isinstance(root["objects"], list) or not root["objects"]:
        raise _bad(path, "objects must be a non-empty array")
    if not isinstance(root["bindings"], dict) or not isinstance(root["uses"], list):
        raise _bad(path, "bindings must be an object and uses an array")
    files = root["files"]
    if not isinstance(files, list) or not files:
        raise _bad(path, "files must be a non-empty array")
    for i, f in enumerate(files):
        if not isinstance(f, dict) or set(f) != {"path", "payload_bytes"} or not _is_int(f["payload_bytes"]) \
                or f["payload_bytes"] < 0:
            raise _bad(path, f"files[{i}] is not {{path, payload_bytes}}")
        if (i == 0) != (f["path"] is None) or (i and ("/" in f["path"] or "\\" in f["path"] or f["path"] in ("", ".", ".."))):
            raise _bad(path, f"files[{i}].path must be {'null' if i == 0 else 'a file name'}")


def validate_objects(path: Path, objects: list, payload_bytes: int) -> None:
    """Closed object members, known formats, encoded sizes, alignment, order, no overlap."""
    seen, end_prev = set(), 0
    for o in objects:
        if not isinstance(o, dict) or not isinstance(o.get("id"), str):
            raise _bad(path, "an object has no string id")
        oid = o["id"]
        if oid in seen:
            raise _bad(path, f"duplicate object id {oid!r}")
        seen.add(oid)
        kind = o.get("kind")
        if kind == "tensor":
            if set(o) != TENSOR_KEYS:
                raise _bad(path, f"tensor {oid!r} members {sorted(o)} are not {sorted(TENSOR_KEYS)}")
            if not isinstance(o["shape"], list) or not all(_is_int(s) and s >= 0 for s in o["shape"]):
                raise _bad(path, f"tensor {oid!r} has a bad shape {o['shape']!r}")
            if o["format"] not in formats.FORMATS or o["layout"] not in formats.LAYOUTS:
                raise _bad(path, f"tensor {oid!r} has unknown format/layout {o['format']}/{o['layout']}")
            try:
                need = formats.encoded_size(o["format"], o["layout"], o["shape"])
            except NinferError as e:
                raise _bad(path, f"tensor {oid!r}: {e.message}") from None
            align = 256
        elif kind == "resource":
            if set(o) != RESOURCE_KEYS or o["encoding"] != "raw_bytes_v1":
                raise _bad(path, f"resource {oid!r} is not {{id, kind, encoding: raw_bytes_v1, offset, bytes}}")
            need, align = o.get("bytes"), 1
        else:
            raise _bad(path, f"object {oid!r} has unknown kind {kind!r}")
        off, nb = o["offset"], o["bytes"]
        if not (_is_int(off) and _is_int(nb)) or off < 0 or nb < 0:
            raise _bad(path, f"object {oid!r} has a bad offset/bytes")
        if nb != need:
            raise _bad(path, f"tensor {oid!r} is {nb} bytes, its format needs {need}")
        if off % align:
            raise _bad(path, f"object {oid!r} at offset {off} is not {align}-byte aligned")
        if off < end_prev:
            raise _bad(path, f"object {oid!r} overlaps the previous object or is out of order")
        end_prev = off + nb
        if end_prev > payload_bytes:
            raise _bad(path, f"object {oid!r} ends at {end_prev}, past the payload ({payload_bytes} bytes)")


def validate_bindings(path: Path, root: dict) -> None:
    """Every binding names existing tensors; ranges lie inside them; resources exist."""
    shapes = {o["id"]: o.get("shape") for o in root["objects"]}
    kinds = {o["id"]: o["kind"] for o in root["objects"]}
    for name, b in root["bindings"].items():
        if not isinstance(b, dict):
            raise _bad(path, f"binding {name!r} is not an object")
        if set(b) == {"object"}:
            if kinds.get(b["object"]) != "tensor":
                raise _bad(path, f"binding {name!r} names missing tensor {b['object']!r}")
        elif set(b) == {"parts"} and isinstance(b["parts"], list) and b["parts"]:
            for p in b["parts"]:
                if not isinstance(p, dict) or set(p) != {"object", "range"} or kinds.get(p["object"]) != "tensor":
                    raise _bad(path, f"binding {name!r} has a bad part {p!r}")
                r = p["range"]
                n = math.prod(shapes[p["object"]])
                if not (isinstance(r, list) and len(r) == 2 and all(_is_int(v) for v in r) and 0 <= r[0] < r[1] <= n):
                    raise _bad(path, f"binding {name!r} range {r!r} is outside {p['object']!r} ({n} elements)")
        else:
            raise _bad(path, f"binding {name!r} is neither {{object}} nor {{parts}}")
    for cid, c in root["components"].items():
        for role, oid in (c.get("resources") or {}).items():
            if kinds.get(oid) != "resource":
                raise _bad(path, f"component {cid!r} resource {role!r} names missing resource {oid!r}")
