"""`ninfer rm NAME...`: delete installed models and their partial downloads."""
from __future__ import annotations

from typing import Annotated

import typer

from ninfer_cli.options import Yes, complete_model


def rm(
    names: Annotated[list[str], typer.Argument(
        help="Models to delete (name[:tag]).", metavar="NAME...", autocompletion=complete_model,
    )],
    yes: Yes = False,
) -> None:
    """Delete models from the store, partial downloads included (asks first unless -y)."""
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.store import Store, parse_ref, read_manifest  # noqa: PLC0415

    store = Store()
    typed = {":".join(parse_ref(n)): n for n in reversed(names)}  # ref -> what the user typed
    refs = list(dict.fromkeys(":".join(parse_ref(n)) for n in names))
    partial = set(store.partial_refs())
    sizes = {}
    for ref in refs:
        folder = store.model_dir(ref)
        if not folder.is_dir() and ref not in partial:
            raise store.unknown(typed[ref])
        try:
            sizes[ref] = output.human_bytes(read_manifest(folder).bytes) if folder.is_dir() else "partial download"
        except Exception:  # a broken manifest must not stop its own removal
            sizes[ref] = "broken manifest"
    if not yes:
        listing = ", ".join(f"{r} ({sizes[r]})" for r in refs)
        if not output.confirm(f"delete {listing}?"):
            output.info("nothing deleted")
            raise typer.Exit(1)
    for ref in refs:
        freed = store.remove(ref)
        output.info(f"deleted {ref} ({output.human_bytes(freed)} freed)")
