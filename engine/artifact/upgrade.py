"""v1/v2 -> v3 upgrade without touching a weight byte (spec container.md §2.4, data/v2-to-v3-bindings.md).

The old payload is copied verbatim (gaps included, holes skipped, so a sparse or reflink-capable
file system makes it cheap); the maintained chat template is appended at the next 256-byte
boundary and becomes the `chat_template.jinja` resource. Every other object keeps its offset.
"""
from __future__ import annotations

import os
import struct
from importlib import resources as importlib_resources
from pathlib import Path

import numpy as np

from engine.artifact import upgrade_rules as rules
from engine.artifact.legacy import is_known, read_legacy
from engine.artifact.writer import DEFAULT_SPLIT_LIMIT, FileSetWriter, align_up
from engine.errors import NinferError

_WINDOW = 1 << 30  # progress granularity of the payload copy


def maintained_template(model_id: str) -> bytes:
    """The NInfer-maintained chat template the upgrader installs for this model."""
    name = "qwen3_8.jinja" if model_id.startswith("qwen3.8-") else "qwen3_6.jinja"
    return importlib_resources.files("engine.artifact").joinpath("chat_templates", name).read_bytes()


def plan_upgrade(src, template: bytes | None = None):
    """(legacy file, v3 root without files, payload bytes, template offset, template) for src."""
    lf = read_legacy(src)
    if not is_known(lf):
        known = ", ".join(f"{m}/{w}" for m, w in rules.KNOWN_INPUTS)
        raise NinferError(f"{lf.path}: v{lf.version} file of an unknown model ({lf.model_id}/{lf.weights_id}, "
                          f"{len(lf.objects)} objects); only the published artifacts can be upgraded ({known})",
                          "convert the model from its Hugging Face checkpoint with `ninfer convert DIR`")
    comps = rules.build_components(lf.model_id, lf.objects)
    bindings = rules.build_bindings(comps, lf.objects)
    want = rules.expected_binding_count(lf.model_id, comps)
    if len(bindings) != want:
        raise NinferError(f"{lf.path}: {len(bindings)} bindings where {want} were expected",
                          "the file does not match the published inventory")
    _check_divisors(lf)
    uses = rules.build_uses(comps, lf.objects, bindings)
    template = maintained_template(lf.model_id) if template is None else template
    tpl_id = comps["text"]["resources"]["chat_template.jinja"]
    tpl_off = align_up(lf.payload_bytes, 256)
    objects = [dict(o) for o in lf.objects if o["id"] != tpl_id]
    objects.append({"id": tpl_id, "kind": "resource", "offset": tpl_off, "bytes": len(template), "encoding": "raw_bytes_v1"})
    root = {"components": comps, "objects": objects, "bindings": bindings, "uses": uses,
            "metadata": {"name": lf.model_id},
            "provenance": {"upgraded_from": {"version": lf.version, "model_id": lf.model_id, "weights_id": lf.weights_id}}}
    return lf, root, tpl_off + len(template), tpl_off, template


def _check_divisors(lf) -> None:
    with open(lf.path, "rb") as f:
        for o in lf.objects:
            if o["id"].endswith("/input_scale_divisor"):
                f.seek(lf.payload_start + o["offset"])
                (v,) = struct.unpack("<f", f.read(4))
                if not (np.isfinite(v) and v > 0):
                    raise NinferError(f"{lf.path}: {o['id']} is {v}, not a finite positive divisor")


def upgrade(src, dst, *, split_limit: int = DEFAULT_SPLIT_LIMIT, template: bytes | None = None, progress=None) -> Path:
    """Upgrade a v1/v2 file to v3 at dst (plus dst.part-NNNN when over split_limit).

    progress: optional callable(done_bytes, total_bytes). Returns dst.
    """
    src, dst = Path(src), Path(dst)
    if dst.exists() and src.exists() and os.path.samefile(src, dst):
        raise NinferError(f"{dst}: input and output are the same file", "write the upgrade to a new file")
    lf, root, payload_bytes, tpl_off, template = plan_upgrade(src, template)
    fd = os.open(lf.path, os.O_RDONLY)
    try:
        allocated = min(lf.payload_bytes, os.fstat(fd).st_blocks * 512)  # holes cost no disk
        with FileSetWriter(dst, root, payload_bytes, split_limit, disk_bytes=allocated + len(template)) as w:
            for start in range(0, lf.payload_bytes, _WINDOW):
                n = min(_WINDOW, lf.payload_bytes - start)
                w.copy_from(fd, lf.payload_start + start, n, start)
                if progress is not None:
                    progress(start + n, payload_bytes)
            w.write(tpl_off, template)
            if progress is not None:
                progress(payload_bytes, payload_bytes)
    finally:
        os.close(fd)
    return dst


upgrade_file = upgrade
