"""Where things are printed: data and answers on stdout; progress, stats, warnings and errors on stderr.

Rich is imported on first use (it costs ~50 ms, and `import ninfer_cli.main` must stay fast for shell
completion). Consoles are not cached across calls because tests swap `sys.stdout`/`sys.stderr`.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence


def stdout():
    """A rich Console on the current stdout (data, answers, tables); unlimited width when piped."""
    from rich.console import Console  # noqa: PLC0415

    # A pipe or file has no width: truncating there would corrupt what scripts read.
    width = None if sys.stdout.isatty() else 100_000
    return Console(file=sys.stdout, highlight=False, soft_wrap=True, width=width)


def stderr():
    """A rich Console on the current stderr (progress, stats, warnings, errors)."""
    from rich.console import Console  # noqa: PLC0415

    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout: plain JSON, no colour, one trailing newline."""
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def line(text: str = "") -> None:
    """One plain line on stdout (no markup interpretation)."""
    sys.stdout.write(text + "\n")


def info(text: str) -> None:
    """A status line on stderr (markup allowed)."""
    stderr().print(text)


def warn(text: str) -> None:
    """A warning line on stderr."""
    stderr().print(f"[yellow]warning:[/yellow] {text}", markup=True)


def error(message: str, next_action: str | None = None) -> None:
    """The error funnel's format: `error: <message>` and `-> <next action>` on stderr, no markup."""
    sys.stderr.write(f"error: {message}\n")
    if next_action:
        sys.stderr.write(f"-> {next_action}\n")
    sys.stderr.flush()


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Sequence[str] = ()) -> None:
    """A borderless table on stdout, like `ollama ls`; columns named in `right` are right-aligned."""
    from rich import box  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for i, col in enumerate(columns):
        # The first column (names) and numbers never shrink; wider free text gives way first.
        fixed = i == 0 or col in right
        t.add_column(col, justify="right" if col in right else "left", no_wrap=fixed, min_width=len(col),
                     overflow="fold" if fixed else "ellipsis")
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    stdout().print(t)


def key_values(pairs: Iterable[tuple[str, Any]]) -> None:
    """Aligned `key  value` lines on stdout (for `show`, `env`)."""
    pairs = [(k, "" if v is None else str(v)) for k, v in pairs]
    width = max((len(k) for k, _ in pairs), default=0)
    for k, v in pairs:
        sys.stdout.write(f"{k:<{width}}  {v}\n")


def human_bytes(n: int | float | None) -> str:
    """Decimal units like `ollama ls`: 1.2 GB, 270 MB, 950 B."""
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def human_gib(n: int | float | None) -> str:
    """Binary GiB with two decimals, for memory (VRAM) figures."""
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def confirm(question: str, *, default: bool = False) -> bool:
    """Ask a yes/no question on stderr; reads one line from stdin; EOF counts as the default."""
    suffix = " [Y/n] " if default else " [y/N] "
    sys.stderr.write(question + suffix)
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer:
        sys.stderr.write("\n")
        return default
    answer = answer.strip().lower()
    return default if not answer else answer in ("y", "yes")


class AnswerPrinter:
    """Streams an answer as it arrives: reasoning to `err` between "Thinking..." and "...done thinking.",
    content to `out` (the records of engine.text.session.ChatSession: `.reasoning`, `.content`)."""

    def __init__(self, out, err, show_thinking: bool = True):
        self.out, self.err, self.show_thinking = out, err, show_thinking
        self.thinking = False  # inside a reasoning block on `err`

    def feed(self, delta) -> None:
        if delta.reasoning and self.show_thinking:
            if not self.thinking:
                self.err.write("Thinking...\n")
                self.thinking = True
            self.err.write(delta.reasoning)
            self.err.flush()
        if delta.content:
            if self.thinking:
                self.err.write("\n...done thinking.\n\n")
                self.err.flush()
                self.thinking = False
            self.out.write(delta.content)
            self.out.flush()
