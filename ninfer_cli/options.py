"""Shared command-line options, declared once so every command spells them the same way.

Use them as parameter annotations; the default goes in the signature, e.g.

    def run(model: ModelArg = None, temperature: Temperature = None, think: Think = None, ...):
        overrides = sampling_overrides(temperature=temperature, top_k=top_k, ...)

`None` everywhere means "not given": the model's own preset (which may depend on the reasoning mode)
applies, so commands pass only what the user set. Only typer and the standard library are imported.
"""
from __future__ import annotations

import enum
from typing import Annotated, Optional

import typer

SAMPLING = "Sampling"
REASONING = "Reasoning"
RUNTIME = "Runtime"
FORMAT = "Output format"


class ReasoningEffort(str, enum.Enum):
    """`--reasoning-effort`: off disables thinking; high maps to the template's top level."""

    off = "off"
    low = "low"
    medium = "medium"
    high = "high"


class Device(str, enum.Enum):
    """`--device`: auto picks the GPU when CuPy sees one."""

    auto = "auto"
    cpu = "cpu"
    gpu = "gpu"


def complete_model(incomplete: str) -> list[str]:
    """Shell completion for model names: installed `name:tag`s, no manifest parsing, no heavy imports."""
    from ninfer_cli.store import Store  # noqa: PLC0415

    try:
        refs = Store().refs()
    except Exception:  # completion must never print a traceback into the shell
        return []
    names = {r.split(":")[0] for r in refs} | set(refs)
    return sorted(n for n in names if n.startswith(incomplete.lower()))


def parse_ctx(value: str | int | None) -> int | None:
    """`--ctx` value: `auto` (None: fit to memory), or a token count such as 32768, 32k, 128K (k = 1024)."""
    if value is None or isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text in ("", "auto", "0"):
        return None
    mult = 1024 if text.endswith("k") else 1
    try:
        n = int(float(text.rstrip("k")) * mult)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not a context size: use auto, 32768 or 32k") from None
    if n < 16:
        raise typer.BadParameter(f"context {n} is too small (at least 16 tokens)")
    return n


def parse_vram_limit(value: str | int | None) -> int | None:
    """`--vram-limit` value: a size such as 24GiB, 22.5GiB or 24000MB, in bytes (None: the whole card)."""
    if value is None or isinstance(value, int):
        return value
    from engine.errors import NinferError  # noqa: PLC0415
    from engine.memory_budget import parse_size  # noqa: PLC0415

    try:
        return parse_size(value)
    except NinferError as e:
        raise typer.BadParameter(f"{e.message}: {e.next_action}") from None


def complete_profile(incomplete: str) -> list[str]:
    """Shell completion for `--profile`: every profile name any model has."""
    from ninfer_cli.profiles import PROFILES  # noqa: PLC0415

    names = {p.name for group in PROFILES.values() for p in group}
    return sorted(n for n in names if n.startswith(incomplete.lower()))


class KvFormat(str, enum.Enum):
    """`--kv`: how the KV cache stores keys and values (int8 = INT8-G64, about half of bf16)."""

    bf16 = "bf16"
    int8 = "int8"


# ---- model

ModelArg = Annotated[
    Optional[str],
    typer.Argument(
        help="Model: a name from `ninfer ls` (name[:tag]) or a path to a .ninfer file.",
        autocompletion=complete_model,
        show_default=False,
    ),
]
ModelRequired = Annotated[
    str,
    typer.Argument(help="Model: name[:tag] from `ninfer ls`, or a path to a .ninfer file.",
                   autocompletion=complete_model),
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model", "-m", help="Model: name[:tag] from `ninfer ls`, or a path to a .ninfer file.",
        autocompletion=complete_model, show_default=False,
    ),
]

# ---- sampling

Temperature = Annotated[
    Optional[float],
    typer.Option("--temperature", "--temp", min=0.0, rich_help_panel=SAMPLING,
                 help="Sampling temperature; 0 is greedy. Default: the model's preset.", show_default=False),
]
TopK = Annotated[
    Optional[int],
    typer.Option("--top-k", min=0, rich_help_panel=SAMPLING, help="Keep the k most likely tokens (0 = all).",
                 show_default=False),
]
TopP = Annotated[
    Optional[float],
    typer.Option("--top-p", min=0.0, max=1.0, rich_help_panel=SAMPLING, help="Nucleus sampling mass (1 = off).",
                 show_default=False),
]
MinP = Annotated[
    Optional[float],
    typer.Option("--min-p", min=0.0, max=1.0, rich_help_panel=SAMPLING,
                 help="Drop tokens below min-p times the top probability (0 = off).", show_default=False),
]
PresencePenalty = Annotated[
    Optional[float],
    typer.Option("--presence-penalty", min=-2.0, max=2.0, rich_help_panel=SAMPLING,
                 help="Penalty for any token already generated.", show_default=False),
]
FrequencyPenalty = Annotated[
    Optional[float],
    typer.Option("--frequency-penalty", min=-2.0, max=2.0, rich_help_panel=SAMPLING,
                 help="Penalty growing with how often a token was generated.", show_default=False),
]
Seed = Annotated[
    Optional[int],
    typer.Option("--seed", rich_help_panel=SAMPLING, help="Random seed, for repeatable sampling.", show_default=False),
]
MaxTokens = Annotated[
    Optional[int],
    typer.Option("--max-tokens", "-n", min=1, rich_help_panel=SAMPLING,
                 help="Stop after this many generated tokens.", show_default=False),
]

# ---- reasoning

Effort = Annotated[
    Optional[ReasoningEffort],
    typer.Option("--reasoning-effort", "-r", case_sensitive=False, rich_help_panel=REASONING,
                 help="How much the model thinks before answering (off disables thinking).", show_default=False),
]
Think = Annotated[
    Optional[bool],
    typer.Option("--think/--no-think", rich_help_panel=REASONING,
                 help="Turn thinking on or off. Default: the model's default.", show_default=False),
]
ThinkingBudget = Annotated[
    Optional[int],
    typer.Option("--thinking-budget", min=0, rich_help_panel=REASONING,
                 help="Most thinking tokens before the answer is forced (unlimited if unset).", show_default=False),
]

# ---- output format (structured outputs; at most one)

FormatOpt = Annotated[
    Optional[str],
    typer.Option("--format", metavar="json", rich_help_panel=FORMAT, show_default=False,
                 help="json: the answer is one JSON object (any keys)."),
]
JsonSchemaOpt = Annotated[
    Optional[str],
    typer.Option("--json-schema", metavar="FILE|JSON", rich_help_panel=FORMAT, show_default=False,
                 help="The answer is JSON that validates against this JSON Schema (a file, or the schema itself)."),
]
RegexOpt = Annotated[
    Optional[str],
    typer.Option("--regex", metavar="RE", rich_help_panel=FORMAT, show_default=False,
                 help="The whole answer matches this regular expression (Rust regex syntax)."),
]
GrammarOpt = Annotated[
    Optional[str],
    typer.Option("--grammar", metavar="FILE", rich_help_panel=FORMAT, show_default=False,
                 help="The answer parses with this grammar: Lark (llguidance's dialect, rule `start`) or GBNF "
                      "(rule `root`)."),
]
ChoiceOpt = Annotated[
    Optional[str],
    typer.Option("--choice", metavar="A,B,C", rich_help_panel=FORMAT, show_default=False,
                 help='The answer is exactly one of these (comma-separated, or a JSON list such as \'["a,b","c"]\').'),
]

# ---- runtime

Ctx = Annotated[
    Optional[int],
    typer.Option("--ctx", "-c", parser=parse_ctx, metavar="auto|N", rich_help_panel=RUNTIME,
                 help="Context length in tokens (32768, 32k), or auto to fit free memory.", show_default=False),
]
DeviceOpt = Annotated[
    Device,
    typer.Option("--device", case_sensitive=False, rich_help_panel=RUNTIME, envvar="NINFER_DEVICE",
                 help="Where to run: auto (GPU when available), cpu (NumPy) or gpu (CuPy)."),
]
VramLimit = Annotated[
    Optional[int],
    typer.Option("--vram-limit", parser=parse_vram_limit, metavar="SIZE", rich_help_panel=RUNTIME,
                 help="Plan and allocate as if the GPU had SIZE in all (24GiB checks a 3090 budget on a bigger card).",
                 show_default=False),
]
PrefillChunk = Annotated[
    Optional[int],
    typer.Option("--prefill-chunk", min=1, metavar="N", rich_help_panel=RUNTIME, show_default=False,
                 help="Prompt tokens per prefill pass (default 256 on the CPU; on the GPU the largest tensor-core "
                      "chunk, up to 8192 by default where memory allows)."),
]
ProfileOpt = Annotated[
    Optional[str],
    typer.Option("--profile", metavar="NAME", rich_help_panel=RUNTIME, autocompletion=complete_profile,
                 help="Launch profile: default, long (int8 KV, longest context), fast (speculation); flags you "
                      "give override it. `ninfer profile ls` lists them.", show_default=False),
]
KvOpt = Annotated[
    Optional[KvFormat],
    typer.Option("--kv", case_sensitive=False, rich_help_panel=RUNTIME, show_default=False,
                 help="KV cache format: bf16, or int8 (half the bytes). Default: the profile's."),
]
def _spec(value: str | None) -> str | None:
    if value is None:
        return None
    from engine.errors import NinferError  # noqa: PLC0415
    from engine.speculative import parse_spec  # noqa: PLC0415

    try:
        kind, k = parse_spec(value)
    except NinferError as e:
        raise typer.BadParameter(f"{e.message} ({e.next_action})") from None
    return "off" if kind == "off" else f"{kind}:{k}"


SpecOpt = Annotated[
    Optional[str],
    typer.Option("--spec", metavar="off|mtp:K", rich_help_panel=RUNTIME, callback=_spec, show_default=False,
                 help="Speculative decoding: mtp:K drafts K tokens a round with the model's MTP head and verifies "
                      "them in one pass (greedy output unchanged; the CUDA engine: greedy, dense models). Default off."),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON on stdout instead of a table.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def sampling_overrides(**flags) -> dict:
    """Keep only the flags the user gave (not None), e.g. to update a `GenerationConfig` preset."""
    return {k: v for k, v in flags.items() if v is not None}


def reasoning_choice(effort: ReasoningEffort | None, think: bool | None) -> ReasoningEffort | None:
    """Combine `--reasoning-effort` and `--think/--no-think` into one effort (None = model default).

    `--no-think` means off; a contradiction (`--no-think -r high`) is a usage error. A bare `--think`
    returns None (no level chosen) so callers must still pass `think` on, e.g.
    `think = think if effort is None else effort is not ReasoningEffort.off`, or a model whose template
    defaults to no thinking would ignore `--think`.
    """
    if think is False:
        if effort not in (None, ReasoningEffort.off):
            raise typer.BadParameter("--no-think contradicts --reasoning-effort " + effort.value)
        return ReasoningEffort.off
    if think is True and effort is ReasoningEffort.off:
        raise typer.BadParameter("--think contradicts --reasoning-effort off")
    return effort


FORMAT_KINDS = ("json", "schema", "regex", "grammar", "choice")


def format_arg(format: str | None = None, json_schema: str | None = None, regex: str | None = None,
               grammar: str | None = None, choice: str | None = None) -> str | None:
    """The format flags as one `/format` argument (`json`, `schema FILE|JSON`, `regex RE`, `grammar FILE`,
    `choice A,B,C`), None when none is given; two flags at once is a usage error."""
    given = [(flag, kind, v) for flag, kind, v in (("--format", "", format), ("--json-schema", "schema", json_schema),
                                                   ("--regex", "regex", regex), ("--grammar", "grammar", grammar),
                                                   ("--choice", "choice", choice)) if v is not None]
    if len(given) > 1:
        raise typer.BadParameter(f"{' and '.join(g[0] for g in given)} contradict each other: give one output format")
    if not given:
        return None
    _, kind, value = given[0]
    if not kind and value.strip().lower() not in ("json", "text", "none", "off"):
        raise typer.BadParameter(f"--format {value!r}: use json (or --json-schema for a schema)")
    return f"{kind} {value}" if kind else value.strip().lower()


def parse_format(arg: str | None):
    """The checked `engine.constraints.Constraint` for a `/format` argument (None for none/off/text); an
    unknown kind, or a schema, regex or grammar llguidance rejects, is a NinferError naming the problem."""
    from engine.errors import NinferError  # noqa: PLC0415

    kind, _, value = (arg or "").strip().partition(" ")
    kind, value = kind.lower(), value.strip()
    if kind in ("", "off", "none", "text", "noformat"):
        return None
    from engine.constraints import Constraint, check  # noqa: PLC0415

    if kind == "json" and not value:
        constraint = Constraint.json_object()
    elif kind in ("schema", "json-schema", "json_schema") and value:
        constraint = Constraint.json_schema(_text_or_file(value, "JSON schema", inline=value[:1] in "{["))
    elif kind == "regex" and value:
        constraint = Constraint.regex(value)
    elif kind == "grammar" and value:
        constraint = Constraint.grammar(_text_or_file(value, "grammar", inline=_looks_like_grammar(value)))
    elif kind == "choice" and value:
        constraint = Constraint.choice(_choices(value))
    else:
        raise NinferError(f"unknown output format {arg.strip()!r}",
                          "use json, schema FILE|JSON, regex RE, grammar FILE, choice A,B,C, or off")
    check(constraint)
    return constraint


def output_constraint(**flags):
    """The checked Constraint the format flags ask for (None when none is given), before any model loads."""
    return parse_format(format_arg(**flags))


def _text_or_file(value: str, what: str, *, inline: bool) -> str:
    if inline:
        return value
    from pathlib import Path  # noqa: PLC0415

    from engine.errors import NinferError  # noqa: PLC0415

    path = Path(value).expanduser()
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        raise NinferError(f"cannot read the {what} file {path}: {exc.strerror}",
                          "check the path (or give the value itself)") from None


def _looks_like_grammar(value: str) -> bool:
    """A grammar given inline (`start: "a" | "b"`) rather than a file name."""
    from pathlib import Path  # noqa: PLC0415

    return "\n" in value or (not Path(value).expanduser().exists() and ":" in value and " " in value)


def _choices(value: str) -> list[str]:
    text = value.strip()
    if text.startswith("["):
        import json  # noqa: PLC0415

        from engine.errors import NinferError  # noqa: PLC0415

        try:
            items = json.loads(text)
        except ValueError as exc:
            raise NinferError(f"choices {value!r} are not a JSON list: {exc}") from None
        if not isinstance(items, list):
            raise NinferError("choices are a list", 'give a,b,c or ["a", "b"]')
        return [str(i) for i in items]
    return [c.strip() for c in text.split(",") if c.strip()]
