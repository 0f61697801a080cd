"""Check an artifact beyond what opening it checks: binding coverage, uses, the model's parameter set,
and (deep) the codes and scales of every groupwise object.

`open_artifact` already rejects bad framing, JSON schema, sizes, alignment, overlap, missing parts and
dangling bindings; `verify` reports the rest as a list of findings.
"""
from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import numpy as np

from engine.artifact import formats
from engine.artifact.container import Artifact, open_artifact
from engine.errors import NinferError

POLICIES = ("A16Only", "AllowA8", "AllowA4")


@dataclass
class Report:
    """Findings of `verify`: `checks` is [(name, ok, detail)]."""

    path: str
    checks: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.checks)

    def add(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append((name, ok, detail))


def verify(path_or_artifact, deep: bool = False, progress=None) -> Report:
    """Verify an artifact; raises NinferError only when it cannot be opened at all."""
    art = path_or_artifact if isinstance(path_or_artifact, Artifact) else open_artifact(path_or_artifact)
    rep = Report(str(art.path))
    tensors = [o for o in art.objects.values() if o.kind == "tensor"]
    rep.add("structure", True, f"v{art.version}, {len(art.objects)} objects, {len(art.files)} file(s), "
            f"{art.payload_bytes:,} payload bytes; sizes, alignment and order checked")
    _coverage(art, rep, tensors)
    _rows(art, rep)
    _uses(art, rep)
    _model(art, rep)
    if deep:
        _codes(art, rep, tensors, progress)
    return rep


def _coverage(art: Artifact, rep: Report, tensors) -> None:
    bound = set()
    for name in art.bindings:
        bound.update(oid for oid, _, _ in art.binding_parts(name))
    for u in art.uses:
        for aux in (u.get("auxiliaries") or {}).values():
            bound.add(aux.get("object"))
    unbound = [o.id for o in tensors if o.id not in bound]
    rep.add("binding coverage", not unbound,
            f"{len(art.bindings)} bindings cover all {len(tensors)} tensors" if not unbound
            else f"{len(unbound)} tensors bound by nothing, e.g. {unbound[0]}")
    referenced = {oid for c in art.components.values() for oid in (c.get("resources") or {}).values()}
    loose = [o.id for o in art.objects.values() if o.kind == "resource" and o.id not in referenced]
    rep.add("resources", True, f"{len(referenced)} referenced" + (f"; {len(loose)} unreferenced (allowed)" if loose else ""))


def _rows(art: Artifact, rep: Report) -> None:
    bad = []
    for name in art.bindings:
        try:
            art.packed(name)
        except NinferError:
            obj = art.binding_parts(name)[0][0]
            if art.objects[obj].layout == formats.ROW_SPLIT:
                bad.append(name)
    rep.add("row-split bindings", not bad, "every binding of a row-split object is a row range" if not bad
            else f"{len(bad)} bindings cut row-split rows, e.g. {bad[0]}")


def _uses(art: Artifact, rep: Report) -> None:
    problems = []
    for u in art.uses:
        if not isinstance(u, dict) or u.get("parameter") not in art.bindings:
            problems.append(f"use of unknown parameter {u.get('parameter') if isinstance(u, dict) else u!r}")
        elif u.get("activation_policy") not in POLICIES:
            problems.append(f"{u['parameter']}: unknown policy {u.get('activation_policy')!r}")
        else:
            for aux in (u.get("auxiliaries") or {}).values():
                if aux.get("object") not in art.objects:
                    problems.append(f"{u['parameter']}: auxiliary object {aux.get('object')!r} is missing")
    rep.add("uses", not problems, f"{len(art.uses)} uses" if not problems else f"{problems[0]} (+{len(problems) - 1} more)")


def _model(art: Artifact, rep: Report) -> None:
    cfg = art.components.get("text", {}).get("config") or {}
    mtype = str(cfg.get("model_type", ""))
    if not mtype.startswith("qwen3_5"):
        rep.add("parameter set", True, f"model_type {mtype or '?'}: not checked")
        return
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import logical_shapes

    try:
        args = ModelArgs.from_artifact(art)
        want = logical_shapes(args, mtp="mtp" in art.components)
    except (NinferError, KeyError, ValueError, TypeError) as e:
        rep.add("parameter set", False, f"text config is not usable: {e}")
        return
    missing = [n for n in want if n not in art.bindings]
    wrong = [n for n in want if n in art.bindings and tuple(art.parameter_shape(n)) != tuple(want[n])]
    detail = f"all {len(want)} parameters of the text model present with their shapes"
    if missing:
        detail = f"{len(missing)} parameters missing, e.g. {missing[0]}"
    elif wrong:
        detail = f"{len(wrong)} parameters have the wrong shape, e.g. {wrong[0]} {art.parameter_shape(wrong[0])}"
    rep.add("parameter set", not (missing or wrong), detail)


def _codes(art: Artifact, rep: Report, tensors, progress) -> None:
    """Deep scan: fp16 scales finite and >= 0, zero scales only with zero codes, no W8 code -128."""
    bad = []
    total = sum(o.bytes for o in tensors if o.format in formats.GROUPWISE)
    done = 0
    for o in tensors:
        if o.format not in formats.GROUPWISE:
            continue
        geo = formats.rowsplit_geometry(o.format, o.shape)
        buf = art.object_bytes(o.id)
        step = max(1, (1 << 24) // max(1, geo.k_pad))
        for r0 in range(0, geo.n, step):
            r1 = min(geo.n, r0 + step)
            base, high, scales = formats.rowsplit_planes(geo, buf, r0, r1)
            s = scales.astype(np.float32)
            if not np.isfinite(s).all() or (s < 0).any() or np.signbit(scales).any():
                bad.append(f"{o.id}: non-finite or negative scale")
                break
            codes = formats.decode_codes(geo, base, high).reshape(r1 - r0, geo.groups_per_row, geo.group)
            if geo.bits == 8 and (codes == -128).any():
                bad.append(f"{o.id}: W8 code -128")
                break
            if ((s == 0)[:, :, None] & (codes != 0)).any():
                bad.append(f"{o.id}: zero scale with non-zero codes")
                break
        done += o.bytes
        if progress is not None:
            progress(done, total)
    n = sum(1 for o in tensors if o.format in formats.GROUPWISE)
    rep.add("codes and scales", not bad, f"{n} groupwise objects scanned" if not bad else f"{bad[0]} (+{len(bad) - 1} more)")


def summary(art: Artifact) -> dict:
    """What `ninfer inspect` shows: identity, files, components, object counts and bytes by format."""
    by_format: dict = {}
    for o in art.objects.values():
        key = o.format if o.kind == "tensor" else "resource"
        n, b = by_format.get(key, (0, 0))
        by_format[key] = (n + 1, b + o.bytes)
    files = []
    for s in art.spans:
        files.append({"path": str(s.path), "payload_bytes": s.payload_bytes,
                      "file_bytes": s.path.stat().st_size if s.path.exists() else None})
    comps = {}
    for cid, c in art.components.items():
        comps[cid] = {k: v for k, v in c.items() if k != "config"}
        comps[cid]["config"] = c.get("config", {})
    params = 0
    for name in art.bindings:
        try:
            params += math.prod(art.parameter_shape(name))
        except NinferError:
            pass
    return {
        "path": str(art.path), "version": art.version,
        "artifact_id": str(uuid.UUID(bytes=bytes(art.artifact_id))) if art.artifact_id else None,
        "metadata": art.metadata, "provenance": art.provenance, "files": files,
        "total_bytes": sum(f["file_bytes"] or 0 for f in files), "payload_bytes": art.payload_bytes,
        "components": comps, "objects": len(art.objects),
        "formats": {k: {"objects": n, "bytes": b} for k, (n, b) in sorted(by_format.items())},
        "bindings": len(art.bindings), "uses": len(art.uses), "parameters": params,
    }
