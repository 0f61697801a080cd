"""`ninfer show NAME`: one installed model's manifest and files."""
from __future__ import annotations

from ninfer_cli.options import JsonOut, ModelRequired


def show(name: ModelRequired, json_out: JsonOut = False) -> None:
    """Show an installed model: source, revision, size, checksum, container version, files."""
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    m = Store().get(name)
    files = sorted(p for p in m.path.iterdir() if p.is_file()) if m.path else []
    if json_out:
        data = m.to_dict()
        data["artifact_present"] = m.artifact_path.is_file()
        data["files"] = [{"name": p.name, "bytes": p.stat().st_size} for p in files]
        output.print_json(data)
        return
    output.key_values([
        ("name", m.ref),
        ("source", m.source),
        ("revision", m.revision or "-"),
        ("size", f"{output.human_bytes(m.bytes)} ({m.bytes:,} bytes)"),
        ("sha256", m.sha256 or "-"),
        ("container", f"v{m.container_version}"),
        ("added", m.added),
        ("path", m.path),
        ("artifact", m.artifact),
    ])
    for p in files:
        output.line(f"  {p.name}  {output.human_bytes(p.stat().st_size)}")
    if not m.artifact_path.is_file():
        output.warn(f"artifact file {m.artifact_path} is missing: `ninfer rm {m.ref}` and pull it again")
