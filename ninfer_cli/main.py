"""The `ninfer` command: a Typer root that wires one module per command.

Each command lives in `ninfer_cli/commands/<name>.py` and exposes a function registered below.
Command modules import heavy things (engine, numpy, cupy, textual) inside their functions, so that
`import ninfer_cli.main` stays fast: shell completion runs it on every TAB.
"""
from __future__ import annotations

import importlib

import typer

# (command name, "module:function", help panel). Register a command only once it works.
COMMANDS: list[tuple[str, str, str]] = [
]

app = typer.Typer(
    name="ninfer",
    help="Run Qwen hybrid models fast on one NVIDIA GPU (NumPy fallback without one).",
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    for name, target, panel in COMMANDS:
        module_name, func_name = target.split(":")
        module = importlib.import_module(module_name)
        app.command(name=name, rich_help_panel=panel)(getattr(module, func_name))


_register()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
