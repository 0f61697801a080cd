"""The `ninfer` command: a Typer root that wires one module per command.

Each command lives in `ninfer_cli/commands/<name>.py` and exposes a function registered below.
Command modules import heavy things (engine, numpy, cupy, textual) inside their functions, so that
`import ninfer_cli.main` stays fast: shell completion runs it on every TAB.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from engine.errors import NinferError

# (command name, "module:function", help panel). Register a command only once it works.
COMMANDS: list[tuple[str, str, str]] = [
    ("ls", "ninfer_cli.commands.ls:ls", "Models"),
    ("show", "ninfer_cli.commands.show:show", "Models"),
    ("rm", "ninfer_cli.commands.rm:rm", "Models"),
    ("pull", "ninfer_cli.commands.pull:pull", "Models"),
    ("convert", "ninfer_cli.commands.convert:convert", "Models"),
    ("inspect", "ninfer_cli.commands.inspect:inspect", "Models"),
    ("verify", "ninfer_cli.commands.verify:verify", "Models"),
    ("env", "ninfer_cli.commands.env:env", "Utils"),
    ("bench", "ninfer_cli.commands.bench:bench", "Benchmark"),
    ("run", "ninfer_cli.commands.run:run", "Run"),
    ("chat", "ninfer_cli.commands.chat:chat", "Run"),
    ("serve", "ninfer_cli.commands.serve:serve", "Run"),
    ("profile", "ninfer_cli.commands.profile:profile", "Run"),
]

PANELS = ("Models", "Run", "Benchmark", "Utils")
_PASS_THROUGH = (typer.TyperException, typer.Exit, typer.Abort, EOFError)


def _debug() -> bool:
    return os.environ.get("NINFER_DEBUG", "") not in ("", "0")


def as_user_error(exc: BaseException) -> NinferError | None:
    """Exceptions a user can cause without any bug (disk full, no permission, out of memory), as NinferError."""
    import errno  # noqa: PLC0415

    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    if isinstance(exc, PermissionError):
        return NinferError(f"permission denied{where}", "check the permissions, or set NINFER_HOME to a folder you own")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NinferError(f"no space left on the device{where}",
                           "free some space (`ninfer rm` an unused model), or set NINFER_HOME to a disk with room")
    if type(exc).__name__ == "OutOfMemoryError" and type(exc).__module__.startswith("cupy"):
        return NinferError(f"out of GPU memory: {exc}",
                           "lower --ctx, close other programs using the GPU, or pick a smaller model")
    if isinstance(exc, MemoryError):
        return NinferError("out of host memory", "lower --ctx or pick a smaller model")
    return None


def report_error(exc: BaseException) -> int:
    """Print one error the funnel way (stderr) and return its exit code."""
    from ninfer_cli import output  # noqa: PLC0415

    exc = as_user_error(exc) or exc
    if isinstance(exc, NinferError):
        output.error(exc.message, exc.next_action)
        return 1
    text = " ".join(str(exc).split())  # one line, whatever the exception's message looks like
    if len(text) > 300:
        text = text[:297] + "..."
    detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    sys.stderr.write(f"internal error: {detail} (set NINFER_DEBUG=1 for the traceback)\n")
    return 1


def _options_panel(*, name, params, ctx, markup_mode, console) -> None:
    """One option per row that fits 80 columns: every name whole (`--reasoning-effort, -r`, the negative
    form under it), a value type only where an option takes a value, ranges after the help.

    Stands in for typer's own panel while help is printed (typer cut long names to `--reasoning-effo…`
    and showed `<bool>` for plain flags)."""
    from rich.panel import Panel  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415
    from typer import rich_utils as ru  # noqa: PLC0415
    from typer.core import TyperArgument  # noqa: PLC0415

    rows = []
    for param in params:
        argument = isinstance(param, TyperArgument)
        names = Text("*" if param.required else " ", style=ru.STYLE_REQUIRED_SHORT)
        names.append(param.display_name_raw if argument else ", ".join(param.opts),
                     style=ru.STYLE_OPTION)
        if getattr(param, "secondary_opts", None):
            names.append("\n " + ", ".join(param.secondary_opts), style=ru.STYLE_NEGATIVE_OPTION)
        flag = getattr(param, "is_flag", False) or getattr(param, "count", False)
        kind = "" if flag or argument else (param.display_type_rich(ctx=ctx) or "").replace(" range", "")
        help_cell = ru._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        bounds = param._get_number_range_help_str()
        if bounds:
            help_cell.renderables.append(Text(f"[{bounds}]", style=ru.STYLE_OPTION_DEFAULT))
        rows.append((names, Text(kind, style=ru.STYLE_TYPES), help_cell))
    if not rows:
        return
    table = Table(show_header=False, expand=True, box=None, padding=(0, 1), pad_edge=False)
    table.add_column(no_wrap=True, min_width=max(len(line) for n, _, _ in rows for line in n.plain.split("\n")))
    table.add_column(no_wrap=True, min_width=max(k.cell_len for _, k, _ in rows))
    table.add_column(ratio=1)
    for row in rows:
        table.add_row(*row)
    console.print(Panel(table, border_style=ru.STYLE_OPTIONS_PANEL_BORDER, title=name,
                        title_align=ru.ALIGN_OPTIONS_PANEL))


class _CompactHelp:
    """Mixed into our command classes: help printed with `_options_panel`."""

    def format_help(self, ctx, formatter) -> None:
        from typer import rich_utils  # noqa: PLC0415

        typer_panel = rich_utils._print_options_panel
        rich_utils._print_options_panel = _options_panel
        try:
            return super().format_help(ctx, formatter)
        finally:
            rich_utils._print_options_panel = typer_panel


class HelpCommand(_CompactHelp, TyperCommand):
    """Every `ninfer` command: typer's, with the compact options panel."""


class FunnelGroup(_CompactHelp, TyperGroup):
    """The root group: turns NinferError and unexpected exceptions into one line and exit 1.

    Doing it here (not only in `main`) means `CliRunner` tests see exactly what users see.
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _PASS_THROUGH:
            raise
        except BrokenPipeError:
            raise  # typer quiets EPIPE itself (`ninfer ls | head`)
        except Exception as exc:
            if _debug():
                raise
            raise typer.Exit(report_error(exc)) from exc


app = typer.Typer(
    name="ninfer",
    cls=FunnelGroup,
    help="Run Qwen hybrid models fast on one NVIDIA GPU (NumPy fallback without one).",
    epilog="Set NINFER_HOME to move the model store; NINFER_DEBUG=1 shows tracebacks.",
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def package_version() -> str:
    """The installed distribution's version, or the checkout's pyproject version."""
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version("ninfer")
    except metadata.PackageNotFoundError:
        import re  # noqa: PLC0415
        from pathlib import Path  # noqa: PLC0415

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return m.group(1) + "+checkout" if m else "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"ninfer {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-v", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Run Qwen hybrid models fast on one NVIDIA GPU (NumPy fallback without one)."""


def _register() -> None:
    order = {p: i for i, p in enumerate(PANELS)}
    for name, target, panel in sorted(COMMANDS, key=lambda c: order.get(c[2], len(PANELS))):
        module_name, func_name = target.split(":")
        module = importlib.import_module(module_name)
        app.command(name=name, rich_help_panel=panel, cls=HelpCommand)(getattr(module, func_name))


_register()


def main() -> None:
    """Console entry point: the app, plus a last funnel for errors raised outside any command."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except NinferError as exc:
        if _debug():
            raise
        sys.exit(report_error(exc))
    except Exception as exc:  # noqa: BLE001  (e.g. raised while building the command tree)
        if _debug():
            raise
        sys.exit(report_error(exc))


if __name__ == "__main__":
    main()
