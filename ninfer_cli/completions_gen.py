"""Regenerate `completions/` (bash, zsh, fish) from the app: `python -m ninfer_cli.completions_gen [--check]`.

The scripts are Typer's shims: on TAB they call `ninfer` back with `_NINFER_COMPLETE=complete_<shell>`,
so commands, options and installed model names always match the installed `ninfer`. They change only
when Typer changes its shims (a Typer upgrade), which `--check` (and the unit test) detects.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROG = "ninfer"
COMPLETE_VAR = "_NINFER_COMPLETE"
FILES = {"bash": "ninfer.bash", "zsh": "_ninfer", "fish": "ninfer.fish"}
DIR = Path(__file__).resolve().parent.parent / "completions"


def render(shell: str) -> str:
    """The completion script the app itself prints for `shell` (run in a child: the app exits)."""
    env = {**os.environ, COMPLETE_VAR: f"source_{shell}"}
    code = f"from ninfer_cli.main import app; app(prog_name={PROG!r})"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"generating the {shell} script failed: {out.stderr.strip()}")
    # Typer prints a leading blank line; zsh autoload needs `#compdef` on the first line.
    return out.stdout.strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write each script into `completions/`; with `--check`, only report which differ (exit 1)."""
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    stale = []
    for shell, name in FILES.items():
        path, text = DIR / name, render(shell)
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(name)
        if not check:
            path.write_text(text)
    verb = "out of date" if check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "completions up to date")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
