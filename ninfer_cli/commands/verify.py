"""`ninfer verify FILE [--deep]`: structure, sizes, alignment, binding coverage, parameter set."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ninfer_cli.options import JsonOut


def verify(
    path: Annotated[Path, typer.Argument(help="A .ninfer file (v1, v2 or v3).", show_default=False)],
    deep: Annotated[bool, typer.Option("--deep", help="Also scan every quantized object's codes and scales (reads the whole file).")] = False,
    json_out: JsonOut = False,
) -> None:
    """Check an artifact: framing, JSON schema, sizes, alignment, bindings, uses, the model's parameters."""
    from engine.artifact.verify import verify as run_verify
    from engine.errors import NinferError
    from ninfer_cli import output

    rep = run_verify(path, deep=deep)
    if json_out:
        output.print_json({"path": rep.path, "ok": rep.ok,
                           "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in rep.checks]})
    else:
        output.table(["check", "result", "detail"], [(n, "ok" if ok else "FAIL", d) for n, ok, d in rep.checks])
    if not rep.ok:
        failed = [n for n, ok, _ in rep.checks if not ok]
        raise NinferError(f"{path}: {len(failed)} check(s) failed: {', '.join(failed)}",
                          "re-convert or re-download the artifact")
