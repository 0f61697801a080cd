"""Read v1 and v2 `.ninfer` files (16-byte prefix + JSON directory + payload).

v1 root: `{model_id, objects}`; v2 root: `{identity: {model_id, weights_id}, objects}`. Both are
presented as an `Artifact` with v3 names: object ids are the old names, formats/layouts take their
v3 spelling, and for the published models the components and bindings the upgrader would write.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from engine.artifact import formats, upgrade_rules as rules
from engine.artifact.writer import FILE_ALIGN, align_up
from engine.errors import NinferError

MAGICS = {b"NINFER\x00\x01": 1, b"NINFER\x00\x02": 2}


@dataclass
class LegacyFile:
    """A parsed v1/v2 file: identity, v3-translated objects, and where the payload lies."""

    path: Path
    version: int
    model_id: str
    weights_id: str
    objects: list[dict]  # v3 spelling, original order
    payload_start: int
    payload_bytes: int  # file size - payload start: the whole span, gaps included


def _bad(path: Path, what: str) -> NinferError:
    return NinferError(f"{path}: {what}", "the file is damaged or not a v1/v2 .ninfer; re-download it")


def read_legacy(path) -> LegacyFile:
    """Parse and check a v1/v2 file's framing and directory (spec §2.1-2.2, bindings.md §1.1)."""
    from engine.artifact.container import read_json

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(16)
    version = MAGICS.get(head[:8])
    if version is None or len(head) < 16:
        raise _bad(path, "not a v1/v2 .ninfer file")
    json_bytes = struct.unpack("<Q", head[8:16])[0]
    if json_bytes == 0 or json_bytes > size - 16:
        raise _bad(path, f"JSON length {json_bytes} does not fit a {size}-byte file (truncated?)")
    root = read_json(path, 16, json_bytes, size)
    if version == 1:
        if set(root) != {"model_id", "objects"}:
            raise _bad(path, f"v1 JSON root must be exactly {{model_id, objects}}, got {sorted(root)}")
        model_id, weights_id = root["model_id"], "groupwise-int"  # every published v1 file is groupwise-int
    else:
        ident = root.get("identity")
        if set(root) != {"identity", "objects"} or not isinstance(ident, dict) or set(ident) != {"model_id", "weights_id"}:
            raise _bad(path, "v2 JSON root must be exactly {identity: {model_id, weights_id}, objects}")
        model_id, weights_id = ident["model_id"], ident["weights_id"]
    payload_start = align_up(16 + json_bytes, FILE_ALIGN)
    if payload_start >= size:
        raise _bad(path, "has no payload (truncated?)")
    payload_bytes = size - payload_start
    objects = root["objects"]
    if not isinstance(objects, list) or not objects:
        raise _bad(path, "objects must be a non-empty array")
    out, seen, end_prev = [], set(), 0
    for o in objects:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise _bad(path, "an object has no name")
        try:
            v3 = rules.translate_object(o)
        except (NinferError, KeyError, TypeError) as e:
            raise _bad(path, getattr(e, "message", f"object {o.get('name')!r} lacks {e}")) from None
        off, nb = v3["offset"], v3["bytes"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (off, nb)) or nb <= 0 or off < 0:
            raise _bad(path, f"object {o['name']!r} has a bad offset/bytes")
        if v3["id"] in seen:
            raise _bad(path, f"duplicate object name {v3['id']!r}")
        seen.add(v3["id"])
        if off < end_prev:
            raise _bad(path, f"object {v3['id']!r} overlaps the previous object or is out of order")
        end_prev = off + nb
        if end_prev > payload_bytes:
            raise _bad(path, f"object {v3['id']!r} ends at {end_prev}, past the payload ({payload_bytes} bytes; truncated?)")
        if v3["kind"] == "tensor":
            if off % 256:
                raise _bad(path, f"tensor {v3['id']!r} at offset {off} is not 256-byte aligned")
            try:
                need = formats.encoded_size(v3["format"], v3["layout"], v3["shape"])
            except NinferError as e:
                raise _bad(path, f"tensor {v3['id']!r}: {e.message}") from None
            if need != nb:
                raise _bad(path, f"tensor {v3['id']!r} is {nb} bytes, its format needs {need}")
        out.append(v3)
    return LegacyFile(path, version, model_id, weights_id, out, payload_start, payload_bytes)


def is_known(lf: LegacyFile) -> bool:
    return len(lf.objects) in rules.KNOWN_INPUTS.get((lf.model_id, lf.weights_id), ())


def v3_view(lf: LegacyFile) -> dict:
    """The v3 JSON root this file reads as (no template replacement, no files member)."""
    if is_known(lf):
        comps = rules.build_components(lf.model_id, lf.objects)
        bindings = rules.build_bindings(comps, lf.objects)
        uses = rules.build_uses(comps, lf.objects, bindings)
    else:  # an unknown model still opens: each tensor is its own parameter, no configs
        comps = {"text": {"config": {}}}
        bindings = {o["id"]: {"object": o["id"]} for o in lf.objects if o["kind"] == "tensor"}
        uses = []
    return {"components": comps, "objects": lf.objects, "bindings": bindings, "uses": uses,
            "metadata": {"name": lf.model_id},
            "provenance": {"legacy": {"version": lf.version, "model_id": lf.model_id, "weights_id": lf.weights_id}}}


def open_legacy(path):
    """Open a v1/v2 file as an `Artifact` (version 1 or 2, artifact_id all zeros)."""
    from engine.artifact.container import Artifact, FileSpan

    lf = read_legacy(path)
    root = v3_view(lf)
    root["files"] = [{"path": None, "payload_bytes": lf.payload_bytes}]
    return Artifact(lf.path, lf.version, bytes(16), root, [FileSpan(lf.path, lf.payload_start, lf.payload_bytes, 0)])
