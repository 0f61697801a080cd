"""`ninfer bench`: reproducible pp/tg numbers with the bandwidth bound beside them (llama-bench style)."""
from __future__ import annotations

import enum
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ninfer_cli.options import Ctx, Device, DeviceOpt, ModelArg, ProfileOpt, VramLimit

TESTS, ENGINE, SAMPLING, OUTPUT = "Tests", "Engine", "Decode path", "Output"


class OutFormat(str, enum.Enum):
    md = "md"
    json = "json"
    jsonl = "jsonl"
    csv = "csv"


class Baseline(str, enum.Enum):
    transformers = "transformers"


def _ints(values, flag, default):
    from engine.bench import parse_int_list  # noqa: PLC0415
    from engine.errors import NinferError  # noqa: PLC0415

    try:
        out = parse_int_list(values, flag) if values else list(default)
    except NinferError as e:
        raise typer.BadParameter(f"{e.message} ({e.next_action})", param_hint=flag) from None
    return out


def _words(values, allowed, flag):
    words = [w.strip() for v in values or [] for w in v.split(",") if w.strip()]
    bad = [w for w in words if allowed and w not in allowed]
    if bad:
        raise typer.BadParameter(f"{bad[0]!r} is not one of {', '.join(allowed)}", param_hint=flag)
    return list(dict.fromkeys(words))


def _specs(values) -> list[str]:
    """`--spec off,mtp:3` (mtp3 and mtp read as mtp:3 too) -> canonical modes, "off" or "mtp:K"."""
    from engine.errors import NinferError  # noqa: PLC0415
    from engine.speculative import parse_spec  # noqa: PLC0415

    out = []
    for word in _words(values, (), "--spec") or ["off"]:
        if word.lower().startswith("mtp") and word[3:].isdigit():
            word = f"mtp:{word[3:]}"
        try:
            kind, k = parse_spec(word)
        except NinferError as e:
            raise typer.BadParameter(f"{e.message} ({e.next_action})", param_hint="--spec") from None
        out.append("off" if kind == "off" else f"{kind}:{k}")
    return list(dict.fromkeys(out))


def _spec_accept(text: str | None, specs: list[str], temperature: float) -> tuple[float, ...] | None:
    """`--spec-accept 0.88,0.77,0.67`: K non-increasing probabilities for the mtp:K being compared."""
    if text is None:
        return None
    ks = {int(s.split(":")[1]) for s in specs if s != "off"}
    usage = "e.g. --spec mtp:3 --spec-accept 0.88,0.77,0.67 (K values for mtp:K, each at most the one before)"
    if not ks:
        raise typer.BadParameter(f"forces the acceptance of speculative rounds: give --spec mtp:K too ({usage})",
                                 param_hint="--spec-accept")
    if temperature:
        raise typer.BadParameter("forced acceptance checks the output against plain greedy decode: drop --temp",
                                 param_hint="--spec-accept")
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if (len(ks) != 1 or len(values) != next(iter(ks)) or any(not 0 <= v <= 1 for v in values)
            or any(b > a for a, b in zip(values, values[1:]))):
        raise typer.BadParameter(f"{text!r} is not one non-increasing probability per draft position of "
                                 f"{', '.join(s for s in specs if s != 'off')} ({usage})", param_hint="--spec-accept")
    return values


def _command_line(ctx: typer.Context) -> str:
    """The command as typed (flags the user gave, long spellings), for the report's provenance."""
    parts = ["ninfer", "bench"]
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        source = getattr(ctx.get_parameter_source(p.name), "name", "")
        if source not in ("COMMANDLINE", "ENVIRONMENT"):  # by name: typer may vendor its own click
            continue
        v = v.value if isinstance(v, enum.Enum) else v
        v = "auto" if v is None else v  # `--ctx auto` parses to None
        if not p.opts or not p.opts[0].startswith("-"):
            parts.append(str(v))
            continue
        flag = max(p.opts, key=len)
        if isinstance(v, bool):
            parts.append(flag if v else (max(p.secondary_opts, key=len) if p.secondary_opts else ""))
        elif isinstance(v, (list, tuple)):
            for item in v:
                parts += [flag, str(item)]
        else:
            parts += [flag, str(v)]
    return shlex.join([x for x in parts if x])


def _model_path(model: str) -> Path:
    """A path to an artifact, or the artifact of a name in the local model store (the default model is
    pulled when missing)."""
    p = Path(model).expanduser()
    if p.exists():
        return p
    from ninfer_cli.default_model import needs_pull  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    if needs_pull(model):
        from ninfer_cli.model_session import resolve_model  # noqa: PLC0415

        return resolve_model(model)[0]
    return Store().get(model).artifact_path


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def bench(
    ctx: typer.Context,
    model: ModelArg = None,
    synthetic: Annotated[Optional[str], typer.Option(
        "--synthetic", metavar="GEOMETRY", rich_help_panel=ENGINE, show_default=False,
        help="Random weights of a real geometry instead of a model: qwen3.8-27b, qwen3.6-27b, qwen3.6-35b-a3b "
             "(GPU only), or tiny (a small Qwen3.5 on NumPy).")] = None,
    recipe: Annotated[Optional[str], typer.Option(
        "--recipe", rich_help_panel=ENGINE, show_default=False,
        help="Weight format recipe of a synthetic model (default: the geometry's, groupwise-int).")] = None,
    n_prompt: Annotated[Optional[list[str]], typer.Option(
        "-p", "--n-prompt", metavar="LIST", rich_help_panel=TESTS, show_default=False,
        help="Prompt sizes for ppN tests: 512,8192 or first-last+step. Default 512; 0 skips pp.")] = None,
    n_gen: Annotated[Optional[list[str]], typer.Option(
        "-n", "--n-gen", metavar="LIST", rich_help_panel=TESTS, show_default=False,
        help="Generated tokens for tgN tests. Default 128; 0 skips tg.")] = None,
    prompt_gen: Annotated[Optional[list[str]], typer.Option(
        "-pg", "--prompt-gen", metavar="P,G", rich_help_panel=TESTS, show_default=False,
        help="ppP+tgG tests (repeat the flag, or P,G;P,G).")] = None,
    n_depth: Annotated[Optional[list[str]], typer.Option(
        "-d", "--n-depth", metavar="LIST", rich_help_panel=TESTS, show_default=False,
        help="Context depths filled (untimed) before each test. Default 0.")] = None,
    repetitions: Annotated[int, typer.Option("-r", "--repetitions", min=1, rich_help_panel=TESTS,
                                             help="Timed repetitions per test.")] = 5,
    warmup: Annotated[int, typer.Option("--warmup", min=0, rich_help_panel=TESTS,
                                        help="Untimed runs before the timed ones.")] = 1,
    kv: Annotated[Optional[list[str]], typer.Option(
        "--kv", metavar="bf16|int8", rich_help_panel=ENGINE, show_default=False,
        help="KV cache formats to compare (default: the engine's).")] = None,
    spec: Annotated[Optional[list[str]], typer.Option(
        "--spec", metavar="LIST", rich_help_panel=ENGINE, show_default=False,
        help="Speculative decoding modes to compare, e.g. off,mtp:3 (default off): acceptance, tokens per round, "
             "round time and the speedup over the plain row of each test.")] = None,
    spec_accept: Annotated[Optional[str], typer.Option(
        "--spec-accept", metavar="P1,P2,..", rich_help_panel=ENGINE, show_default=False,
        help="Force the acceptance of draft position i to Pi of the rounds (cumulative, e.g. 0.88,0.77,0.67 for "
             "mtp:3): the drafts are the plain greedy continuation, corrupted where a coin says, the MTP head still "
             "runs every round, and the output is checked against plain greedy. Greedy only.")] = None,
    lanes: Annotated[Optional[list[str]], typer.Option(
        "--lanes", metavar="LIST", rich_help_panel=ENGINE, show_default=False,
        help="Concurrent sequences, e.g. 1,2,4,8 (aggregate tok/s). Default 1.")] = None,
    device: DeviceOpt = Device.auto,
    context: Ctx = None,
    vram_limit: VramLimit = None,
    profile: ProfileOpt = None,
    output_format: Annotated[OutFormat, typer.Option("-o", "--output", rich_help_panel=OUTPUT,
                                                     help="Format of the report.")] = OutFormat.md,
    out: Annotated[Optional[Path], typer.Option(
        "--out", metavar="FILE", rich_help_panel=OUTPUT, show_default=False,
        help="Write the report to FILE (the table still goes to stdout).")] = None,
    baseline: Annotated[Optional[Baseline], typer.Option(
        "--baseline", rich_help_panel=ENGINE, show_default=False,
        help="Also run the tests through Hugging Face transformers on the same geometry; adds ours/theirs.")] = None,
    roofline: Annotated[bool, typer.Option(
        "--roofline", rich_help_panel=OUTPUT,
        help="Measure (again) and store this device's copy bandwidth and matmul rate.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", rich_help_panel=OUTPUT,
                                           help="One line per finished test on stderr.")] = True,
    temperature: Annotated[float, typer.Option(
        "--temp", "--temperature", min=0.0, rich_help_panel=SAMPLING,
        help="Sample the streamed decode at this temperature (0: greedy).")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, rich_help_panel=SAMPLING, help="Top-k (0: off).")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, rich_help_panel=SAMPLING,
                                         help="Top-p (1: off).")] = 1.0,
    min_p: Annotated[float, typer.Option("--min-p", min=0.0, rich_help_panel=SAMPLING, help="Min-p (0: off).")] = 0.0,
    presence_penalty: Annotated[float, typer.Option("--presence-penalty", rich_help_panel=SAMPLING,
                                                    help="Presence penalty (0: off).")] = 0.0,
    frequency_penalty: Annotated[float, typer.Option("--frequency-penalty", rich_help_panel=SAMPLING,
                                                     help="Frequency penalty (0: off).")] = 0.0,
    regex: Annotated[Optional[str], typer.Option(
        "--regex", metavar="RE", rich_help_panel=SAMPLING, show_default=False,
        help="Draw every decoded token under this regular expression's grammar mask (what structured outputs cost; "
             "a synthetic model's ids read as t0, t1, ...: e.g. '(t[0-9])*').")] = None,
    burst: Annotated[bool, typer.Option(
        "--burst", rich_help_panel=SAMPLING,
        help="Also time each decode as a device-side greedy burst (one host read), beside the streamed figure.")] = False,
) -> None:
    """Benchmark prefill (ppN), decode (tgN), both (ppN+tgM) at context depths (@ dD), llama-bench style.

    Every combination of the lists runs; prompts are a fixed token sequence, stops and prefix reuse
    are off, warmups are dropped, and each test reports mean ± standard deviation with its samples,
    achieved GB/s against the measured copy bandwidth, and TFLOP/s against the matmul rate. Decode is
    timed through the stream `run`, `chat` and `serve` read (greedy unless --temp is given).

    Examples: [b]ninfer bench smollm2-135m -p 64 -n 32 -r 3[/b] ·
    [b]ninfer bench --synthetic qwen3.8-27b -p 0 -n 128 --temp 0.7 --top-p 0.8 --top-k 20 --presence-penalty 1.5[/b] ·
    [b]ninfer bench --synthetic qwen3.8-27b -p 512 -n 128 --baseline transformers -o json --out r.json[/b] ·
    [b]ninfer bench --synthetic tiny -p 0 --spec off,mtp:3 --spec-accept 0.88,0.77,0.67[/b] (speculative rounds at a
    forced acceptance beside plain decode) ·
    [b]ninfer bench --roofline[/b] (measure and store the copy bandwidth and matmul rate)
    """
    from engine.bench import expand_instances, expand_matrix, parse_pairs  # noqa: PLC0415
    from engine.errors import NinferError  # noqa: PLC0415

    prompts = _ints(n_prompt, "-p", [512])
    gens = _ints(n_gen, "-n", [128])
    depths = _ints(n_depth, "-d", [0])
    lane_list = _ints(lanes, "--lanes", [1])
    if any(n < 1 for n in lane_list):
        raise typer.BadParameter("lanes must be at least 1", param_hint="--lanes")
    try:
        pairs = parse_pairs(prompt_gen)
    except NinferError as e:
        raise typer.BadParameter(f"{e.message} ({e.next_action})", param_hint="-pg") from None
    kvs = _words(kv, ("bf16", "int8"), "--kv") or [None]
    specs = _specs(spec)
    if any(n > 1 for n in lane_list):
        raise NinferError(f"--lanes {max(lane_list)}: the engines run one sequence at a time", "use --lanes 1")
    accept = _spec_accept(spec_accept, specs, temperature)
    if model and synthetic:
        raise typer.BadParameter("give a MODEL or --synthetic GEOMETRY, not both", param_hint="MODEL")
    tests = expand_matrix(prompts, gens, pairs, depths)
    if (model or synthetic or not roofline) and not tests:
        raise typer.BadParameter("every test size is 0: nothing to run", param_hint="-p/-n/-pg")

    from engine import bench_device  # noqa: PLC0415
    from engine.backend import resolve_device  # noqa: PLC0415
    from ninfer_cli import output  # noqa: PLC0415

    asked = device.value if isinstance(device, enum.Enum) else device
    if synthetic == "tiny" and asked == "auto":
        asked = "cpu"  # tiny exists to exercise the NumPy engine; --device gpu still runs it on CuPy
    try:
        dev = resolve_device(asked)
    except (RuntimeError, ValueError) as e:
        raise NinferError(str(e).split(":")[0], "use --device cpu, or install CuPy for your CUDA") from None
    if dev == "cpu":
        from ninfer_cli.model_session import tune_blas_threads  # noqa: PLC0415

        tune_blas_threads()  # the same BLAS threading `ninfer run` and `chat` use, so the numbers compare
    env = bench_device.environment(dev)
    if not (model or synthetic or roofline):  # like run and chat: the default model (pulled when missing)
        from ninfer_cli.model_session import DEFAULT_MODEL  # noqa: PLC0415

        model = DEFAULT_MODEL
        output.stderr().print(f"benchmarking the default model, {model}", markup=False, highlight=False)
    if not (model or synthetic):
        roof, _ = bench_device.roofline(env, remeasure=True)
        output.line(f"{bench_device.device_key(env)}: copy {roof['copy_gbps']:.1f} GB/s (read + written), "
                    f"{roof['matmul_dtype']} matmul {roof['matmul_tflops']:.2f} TFLOP/s")
        output.line(f"stored in {bench_device.cache_dir() / bench_device.ROOFLINE_FILE}")
        return

    from engine.bench import Sampling  # noqa: PLC0415
    from engine.bench_run import run_bench  # noqa: PLC0415

    fit = None
    ctx_given = getattr(ctx.get_parameter_source("context"), "name", "") in ("COMMANDLINE", "ENVIRONMENT")
    if ctx_given or vram_limit is not None or profile is not None:  # --ctx auto|N: fit to memory first
        from ninfer_cli.profiles import bench_fitter, get_profile  # noqa: PLC0415

        if profile is not None and kvs == [None]:
            kvs = [get_profile(model or synthetic, profile).kv]
        fit = bench_fitter(device=dev, synthetic=synthetic, recipe=recipe, model_path=_model_path(model) if model
                           else None, model=model, profile=profile, ctx=context, vram_limit=vram_limit,
                           say=lambda text: output.stderr().print(text, markup=False, highlight=False))

    report = run_bench(
        model=model, model_path=_model_path(model) if model else None, synthetic=synthetic, recipe=recipe, tests=tests,
        instances=expand_instances(kvs, lane_list, specs), repetitions=repetitions, warmup=warmup,
        device=dev, env=env, remeasure=roofline, baseline=baseline is not None,
        progress=(lambda text: output.stderr().print(text, markup=False, highlight=False)) if progress else None,
        command=_command_line(ctx), fit=fit, burst=burst, spec_accept=accept,
        sampling=Sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, regex=regex),
    )
    from engine.bench_report import render  # noqa: PLC0415

    fmt = output_format.value
    if out is not None:
        _write(out, render(report, fmt))
        sys.stdout.write(render(report, "md"))
        output.stderr().print(f"wrote {out}", markup=False, highlight=False)
    else:
        sys.stdout.write(render(report, fmt))
    if report["settings"].get("interrupted"):
        raise typer.Exit(130)
    if any(r.get("error") for r in report["results"]):
        output.stderr().print("error: a speculative row broke greedy identity (see the table)", markup=False,
                              highlight=False)
        raise typer.Exit(1)
