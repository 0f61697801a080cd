"""`ninfer convert IN [-o OUT]`: v1/v2 .ninfer, GGUF or a Hugging Face checkpoint folder -> v3 .ninfer."""
from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer


class Recipe(str, enum.Enum):
    groupwise_int = "groupwise-int"
    q8 = "q8"
    bf16 = "bf16"
    fp32 = "fp32"


def parse_size(value: str | None) -> int | None:
    """`32GB`, `500M`, `4096` -> bytes (decimal units, as the container's split limit is)."""
    if value is None:
        return None
    v = value.strip().upper().removesuffix("B")
    mult = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}.get(v[-1:], 1)
    try:
        n = int(float(v[:-1] if mult > 1 else v) * mult)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a size (e.g. 32GB, 500MB, 4096)") from None
    if n < 8192:
        raise typer.BadParameter("the split limit must be at least 8192 bytes")
    return n


def convert(
    source: Annotated[Path, typer.Argument(help="A v1/v2 .ninfer file, a .gguf file, or a Hugging Face checkpoint folder.",
                                           show_default=False)],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Output .ninfer path (default: next to the input).")] = None,
    recipe: Annotated[Optional[Recipe], typer.Option("--recipe", help="Storage formats: groupwise-int (Q4/Q5/Q6 by role), "
                                                     "q8, bf16 or fp32. Default: groupwise-int for checkpoints; for GGUF "
                                                     "fp32 under 1B parameters, else bf16. Not for upgrades.")] = None,
    split_limit: Annotated[Optional[str], typer.Option("--split-limit", help="Largest file to write; beyond it the payload "
                                                       "continues in OUT.part-0001, ... (default 32GB).")] = None,
) -> None:
    """Convert a model to the v3 .ninfer container (old .ninfer files upgrade without re-downloading)."""
    import time

    from engine.artifact.convert import convert as convert_any, default_output, detect
    from engine.artifact.writer import DEFAULT_SPLIT_LIMIT
    from ninfer_cli import output as out

    limit = parse_size(split_limit) or DEFAULT_SPLIT_LIMIT
    kind = detect(source)
    rec = recipe.value if recipe else None
    target = output or default_output(source, kind, rec)
    label = {"legacy": "upgrading", "gguf": "importing GGUF", "hf": "importing checkpoint"}.get(kind, "converting")
    from rich.progress import (
        BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn,
    )

    start = time.perf_counter()
    console = out.stderr()
    # Bytes written of the output's total, the rate, the time spent and what is left.
    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=None)
        result = convert_any(source, target, recipe=rec, split_limit=limit,
                             progress=lambda done, total: bar.update(task, completed=done, total=total))
    seconds = time.perf_counter() - start
    from engine.artifact.container import open_artifact

    art = open_artifact(result)
    size = sum(p.stat().st_size for p in [art.path, *art.parts])
    parts = f" + {len(art.parts)} part file(s)" if art.parts else ""
    out.info(f"wrote {result}{parts}: {out.human_bytes(size)}, {len(art.bindings)} parameters, "
             f"in {seconds:.1f} s ({size / 1e9 / max(seconds, 1e-9):.2f} GB/s of output)")
    out.line(str(result))
