"""`ninfer ls`: the installed models."""
from __future__ import annotations

from typing import Annotated

import typer

from ninfer_cli.options import JsonOut


def ls(
    json_out: JsonOut = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the names (name:tag).")] = False,
    available: Annotated[bool, typer.Option(
        "--available", "-a", help="List the catalog `ninfer pull` fetches from: sizes, fit on this GPU and disk.",
    )] = False,
) -> None:
    """List installed models (NAME, SIZE, FORMAT, SOURCE, ADDED), or with --available the pullable ones."""
    if available:
        from ninfer_cli.catalog import show_available  # noqa: PLC0415

        return show_available(json_out)
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    store = Store()
    models, broken = store.scan()
    for problem in broken:
        output.warn(f"{problem.message} ({problem.next_action})")
    if json_out:
        output.print_json([m.to_dict() for m in models])
    elif quiet:
        for m in models:
            output.line(m.ref)
    elif not models:
        output.info(f"no models in {store.root} (try `ninfer pull smollm2-135m`)")
    else:
        rows = [(m.ref, output.human_bytes(m.bytes), f"v{m.container_version}", m.source, m.added[:10]) for m in models]
        output.table(("NAME", "SIZE", "FORMAT", "SOURCE", "ADDED"), rows, right=("SIZE",))
