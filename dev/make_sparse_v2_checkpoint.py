"""Build a full-size SPARSE v1/v2 `.ninfer` from a published inventory (no disk cost).

    python dev/make_sparse_v2_checkpoint.py data/inventory-qwen3.6-27b-groupwise-int.json out.ninfer [--version 2]
        [--fill-bytes N]   # write N bytes of real (random) data at the payload start, to time a dense copy

The directory JSON is rebuilt byte-for-byte as the published file has it (its SHA-256 is in the
inventory header). Tests use `write_sparse_legacy` directly.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
from pathlib import Path


def legacy_root(inventory: dict, version: int) -> dict:
    """The v1/v2 JSON root of a published file, rebuilt from an inventory."""
    objs = []
    for o in inventory["objects"]:
        if o["kind"] == "resource":
            objs.append({"name": o["name"], "kind": "resource", "encoding": o["encoding_v2"], "offset": o["offset"],
                         "bytes": o["bytes"]})
        else:
            objs.append({"name": o["name"], "kind": "tensor", "shape": o["shape"], "format": o["format_v2"],
                         "layout": o["layout_v2"], "offset": o["offset"], "bytes": o["bytes"]})
    h = inventory["header"]
    if version == 1:
        return {"model_id": h["model_id"], "objects": objs}
    return {"identity": {"model_id": h["model_id"], "weights_id": h["weights_id"]}, "objects": objs}


def write_sparse_legacy(inventory: dict, out: Path, version: int = 2, samples: dict[int, bytes] | None = None,
                        fill_bytes: int = 0) -> tuple[int, int]:
    """Write header + JSON, truncate to full size (holes), then `samples` {payload offset: bytes}.

    Returns (payload_start, payload_bytes)."""
    text = json.dumps(legacy_root(inventory, version), separators=(",", ":"), ensure_ascii=False).encode()
    payload_start = (16 + len(text) + 4095) // 4096 * 4096
    payload = inventory["header"]["payload_bytes"]
    with open(out, "wb") as f:
        f.write(b"NINFER\x00" + bytes([version]) + struct.pack("<Q", len(text)) + text)
        f.truncate(payload_start + payload)
        if fill_bytes:
            chunk = os.urandom(1 << 24)
            for off in range(0, fill_bytes, len(chunk)):
                f.seek(payload_start + off)
                f.write(chunk[: min(len(chunk), fill_bytes - off)])
        for off, blob in (samples or {}).items():
            f.seek(payload_start + off)
            f.write(blob)
    return payload_start, payload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("inventory")
    ap.add_argument("out")
    ap.add_argument("--version", type=int, default=2)
    ap.add_argument("--fill-bytes", type=int, default=0)
    a = ap.parse_args()
    start, payload = write_sparse_legacy(json.loads(Path(a.inventory).read_text()), Path(a.out), a.version,
                                         fill_bytes=a.fill_bytes)
    print(f"{a.out}: payload at {start}, {payload} bytes")


if __name__ == "__main__":
    main()
