"""Launch profiles (named settings per catalog model) and fitting a launch to the GPU's memory.

A profile is data: context (None = auto, the largest ladder rung the memory plan allows), KV format,
lanes, speculative decoding, prefill chunk. `ninfer run MODEL --profile long` applies one; a flag the
user gives always wins over the profile, and the profile over the built-in defaults (`merge`).

`resolve_launch` turns (model, profile, flags, device, --vram-limit) into the `max_context` the engine
is built with, before anything is loaded, and the lines saying what it chose and why. What a launch
cannot do is said plainly: int8 KV where the engine lacks it (asked by a flag: an error; by a profile:
bf16 is used and the note says so), and speculation (the `fast` profile's mtp:3) on a model without
the MTP head, or on an engine `engine.speculative.check_spec` refuses (off, with a note).

Only the standard library is imported at module level (`ninfer profile ls` and completion stay fast).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import NinferError
from ninfer_cli.output import human_gib as _gib

FIELDS = ("ctx", "kv", "lanes", "spec", "draft_tokens", "prefill_chunk", "vision")
INT8_NOT_ON_GPU = "int8 KV is not implemented on the GPU yet (the CUDA engine stores bf16 KV)"
INT8_NOT_IN_LOAD = ("int8 KV is not reachable through engine.load yet (the CUDA engine has it: "
                    "`ninfer bench --synthetic ... --kv int8` uses it)")


@dataclass(frozen=True)
class Profile:
    """One named launch setting. `ctx` None = auto (largest context that fits); `spec` "mtp" | "dflash"
    | "dflash2" with `draft_tokens` drafts per round; `status` says what is not available yet."""

    name: str
    summary: str
    ctx: int | None = None
    kv: str = "bf16"
    lanes: int = 1
    spec: str | None = None
    draft_tokens: int = 0
    prefill_chunk: int = 512
    vision: bool = False
    status: str | None = None

    def values(self) -> dict:
        """The launch fields only (no name/summary/status)."""
        return {f: getattr(self, f) for f in FIELDS}


DEFAULT = Profile("default", "context fitted to free memory, bf16 KV, one lane, no speculation")
LONG = Profile("long", "the longest context: int8 KV (half the bytes of bf16), context fitted to free memory",
               kv="int8")


def _fast(spec: str, draft: int) -> Profile:
    return Profile("fast", f"speculative decoding ({spec}:{draft}: {draft} draft tokens a round from the model's MTP "
                           "head)", spec=spec, draft_tokens=draft)


def spec_flag(values: dict) -> str | None:
    """The `--spec` value of a launch's spec fields ("mtp", 3 -> "mtp:3"), None when it has none."""
    return f"{values['spec']}:{values['draft_tokens']}" if values.get("spec") else None


# Per catalog model (surfaces.md §4.3 launchers: MTP3 is upstream's int8/mtp setting; the 35B tuned too).
_HYBRID = (DEFAULT, LONG, _fast("mtp", 3))
PROFILES: dict[str, tuple[Profile, ...]] = {
    "qwen38-27b": _HYBRID,
    "qwen36-27b": _HYBRID,
    "qwen36-35b-a3b": _HYBRID,
    "smollm2-135m": (Profile("default", "the embedded default model on NumPy: the model's own context",
                             prefill_chunk=256),),
}
# `ninfer bench --synthetic GEOMETRY` names -> catalog names
SYNTHETIC_MODELS = {"qwen3.8-27b": "qwen38-27b", "qwen3.6-27b": "qwen36-27b", "qwen3.6-35b-a3b": "qwen36-35b-a3b"}


def model_key(ref: str | None) -> str | None:
    """Catalog name of a model reference: `qwen38-27b:latest` -> qwen38-27b, a synthetic geometry -> its
    catalog name, a path -> its stem when that is a catalog name, else None."""
    if not ref:
        return None
    text = str(ref)
    if text in SYNTHETIC_MODELS:
        return SYNTHETIC_MODELS[text]
    if text.endswith(".ninfer") or "/" in text:
        stem = Path(text).stem.replace("_", "-").replace("qwen3-", "qwen3")
        return stem if stem in PROFILES else None
    return text.split(":", 1)[0].lower()


def profiles_for(ref: str | None, *, has_mtp: bool | None = None) -> tuple[Profile, ...]:
    """The profiles of a model: its catalog set, or for anything else default and long (and fast when
    the model carries an MTP head)."""
    key = model_key(ref)
    if key in PROFILES:
        return PROFILES[key]
    return _HYBRID if has_mtp else _HYBRID[:2]


def get_profile(ref: str | None, name: str | None, *, has_mtp: bool | None = None) -> Profile:
    """One profile by name (None = default); NinferError listing the model's profiles otherwise."""
    options = profiles_for(ref, has_mtp=has_mtp)
    wanted = (name or "default").lower()
    for p in options:
        if p.name == wanted:
            return p
    names = ", ".join(p.name for p in options)
    raise NinferError(f"{ref or 'this model'} has no profile {wanted!r} (it has: {names})",
                      f"use --profile with one of {names}, or `ninfer profile ls {model_key(ref) or ''}`".rstrip())


def merge(profile: Profile, **flags) -> tuple[dict, dict]:
    """(values, sources): flags that are not None win over the profile's values.

    sources maps each field to "flag" or "profile <name>".
    """
    unknown = set(flags) - set(FIELDS)
    if unknown:
        raise TypeError(f"not launch fields: {sorted(unknown)}")
    values, sources = profile.values(), {f: f"profile {profile.name}" for f in FIELDS}
    for key, value in flags.items():
        if value is not None:
            values[key], sources[key] = value, "flag"
    return values, sources


def flags_of(profile: Profile) -> str:
    """The command-line flags equivalent to a profile (what `--profile NAME` stands for)."""
    parts = [f"--ctx {profile.ctx}" if profile.ctx else "--ctx auto", f"--kv {profile.kv}"]
    if profile.lanes != 1:
        parts.append(f"--lanes {profile.lanes}")
    if profile.spec:
        parts.append(f"--spec {spec_flag(profile.values())}")
    return " ".join(parts)


# ---------------------------------------------------------------------------------- launch
@dataclass
class Launch:
    """What a launch will use: effective values, where each came from, the context to build with
    (`max_context`; None = the engine's default), the plan and budget behind it, and notes to print."""

    profile: str
    values: dict
    sources: dict
    max_context: int | None = None
    plan: object | None = None
    budget: object | None = None
    notes: list[str] = field(default_factory=list)


def components_for(values: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    comps = ["text"]
    if values["spec"] == "mtp":
        comps.append("mtp")
    elif values["spec"] in ("dflash", "dflash2"):
        comps.append(values["spec"])
    if values["vision"]:
        comps.append("vision")
    # (the MTP's proposal head, which the GPU loader uploads beside it when the artifact carries one)
    return tuple(comps), (("draft_head",) if values["spec"] == "mtp" else ())


def spec_unavailable(values: dict, has_mtp: bool, ref: str | None = None) -> str | None:
    """Why a launch's speculation cannot run on this model (None when it can, or asks for none); whether the
    engine runs it is `engine.speculative.check_spec`'s to say once it is loaded (`load_fitted`)."""
    if not values["spec"]:
        return None
    if values["spec"] != "mtp":
        return f"{values['spec']} speculation is not built (mtp is)"
    if not has_mtp:
        return f"{ref or 'this model'} carries no MTP head (no mtp weights in the artifact)"
    return None


def resolve_launch(ref: str | None, args, weights: dict | None, *, profile: str | None = None, ctx: int | None = None,
                   kv: str | None = None, vram_limit: int | None = None, device: str = "gpu",
                   weights_source: str = "", planned: bool = True, memory="probe",
                   kv_formats: tuple[str, ...] | None = None) -> Launch:
    """Settle a launch before loading: merge profile and flags, drop what the model or the GPU cannot do (saying
    so), and on the GPU fit the context to the free memory (or `vram_limit`) with the memory plan.

    `weights` is the per-component byte table (None: no plan); `planned` False means the engine for this
    model is not the CUDA engine (the plan does not describe it); `kv_formats` are those this launch
    path can build (default `engine.gpu.memory.GPU_KV_FORMATS`). Raises NinferError for an explicit `ctx`
    that cannot fit and for a flag asking what is not implemented.
    """
    from engine.gpu import memory as mp  # noqa: PLC0415
    from engine import memory_budget as mb  # noqa: PLC0415

    has_mtp = bool(getattr(args, "mtp_num_hidden_layers", 0)) or bool(weights and "mtp" in weights)
    prof = get_profile(ref, profile, has_mtp=has_mtp)
    values, sources = merge(prof, ctx=ctx, kv=kv)
    launch = Launch(prof.name, values, sources)
    if values["kv"] not in mp.KV_FORMATS:
        raise NinferError(f"unknown KV format {values['kv']!r}", f"use one of {', '.join(mp.KV_FORMATS)}")
    gpu = device == "gpu"
    formats = mp.GPU_KV_FORMATS if kv_formats is None else kv_formats
    if values["kv"] != "bf16" and (not gpu or values["kv"] not in formats):
        if not gpu:
            what = "int8 KV is not implemented on the CPU (the NumPy engine keeps float32 KV)"
        else:
            what = INT8_NOT_ON_GPU if values["kv"] not in mp.GPU_KV_FORMATS else INT8_NOT_IN_LOAD
        if sources["kv"] == "flag":
            raise NinferError(what, "drop --kv int8" + (" (`ninfer show MODEL --memory --kv int8` shows what it would "
                                                        "allow)" if gpu else ""))
        launch.notes.append(f"{what}: profile {prof.name} uses bf16 KV")
        values["kv"] = "bf16"
    why = spec_unavailable(values, has_mtp, ref)
    if why:
        launch.notes.append(f"{why}: profile {prof.name} runs without speculation")
        values["spec"], values["draft_tokens"] = None, 0
    if values["lanes"] != 1:
        launch.notes.append(f"one lane only for now: profile {prof.name} asks for {values['lanes']}")
        values["lanes"] = 1
    if not gpu:
        if vram_limit is not None:
            launch.notes.append("--vram-limit applies to the GPU only: ignored on the CPU")
        launch.max_context = values["ctx"]
        return launch
    if weights is None or not planned:
        launch.max_context = values["ctx"]
        if vram_limit is not None:
            launch.notes.append("--vram-limit: no memory plan for this model on the GPU (only Qwen3.5 hybrid "
                                "models on the CUDA engine have one): the context is not fitted, allocations "
                                "are still capped")
        return launch
    comps, optional = components_for(values)
    if "mtp" in comps and "mtp" not in weights:  # a head the geometry has, with no size in the table (a recipe)
        comps, optional = tuple(c for c in comps if c != "mtp"), (*optional, "mtp")
        launch.notes.append("the MTP head's weights have no size in this table: the plan leaves them out")
    plan = mp.plan_memory(args, weights, model=ref or "", source=weights_source, kv=values["kv"],
                          lanes=values["lanes"], components=comps, optional=optional, spec=values["spec"],
                          draft_tokens=values["draft_tokens"], prefill_chunk=values["prefill_chunk"],
                          **mp.engine_prefill_executors())
    launch.plan, launch.budget = plan, mb.budget(vram_limit, memory)
    b = launch.budget
    if b is None:
        launch.max_context = values["ctx"]
        return launch
    if values["ctx"]:
        mp.check_context(plan, values["ctx"], b.free)
        launch.max_context = values["ctx"]
        launch.notes.append(f"context {values['ctx']:,} ({sources['ctx']}): needs {_gib(plan.total(values['ctx']))} "
                            f"with headroom; {b.source}")
        return launch
    chosen = mp.fit_context(plan, b.free)
    launch.max_context = chosen
    why = f"largest rung that fits: needs {_gib(plan.total(chosen))} of {_gib(b.free)} ({b.source})"
    bigger = [r for r in mp.ladder_for(plan) if r > chosen]
    if bigger:
        why += f"; {bigger[-1]:,} would need {_gib(plan.total(bigger[-1]))}"
    launch.notes.append(f"context auto -> {chosen:,} ({plan.kv} KV, {plan.kv_bytes_per_token:,} B/token): {why}")
    return launch


def launch_for_artifact(path, ref: str | None, *, device: str, profile: str | None = None, ctx: int | None = None,
                        kv: str | None = None, vram_limit: int | None = None, memory="probe") -> Launch:
    """`resolve_launch` for a stored artifact: geometry and object sizes from its JSON header only."""
    from engine.gpu import memory as mp  # noqa: PLC0415
    from engine.artifact.container import open_artifact  # noqa: PLC0415
    from engine.config import ModelArgs  # noqa: PLC0415

    art = open_artifact(path)
    args = ModelArgs.from_artifact(art)
    weights = mp.weights_from_artifact(art)
    planned = device == "gpu" and _cuda_runs(args)
    formats = tuple(f for f in mp.GPU_KV_FORMATS if f == "bf16" or load_takes_kv())
    return resolve_launch(ref or Path(path).name, args, weights, profile=profile, ctx=ctx, kv=kv,
                          vram_limit=vram_limit, device=device, weights_source="artifact header",
                          planned=planned, memory=memory, kv_formats=formats)


def load_takes_kv() -> bool:
    """Whether `engine.load` accepts `kv=` (the CUDA engine stores int8 KV; load may not pass it on yet)."""
    import inspect  # noqa: PLC0415

    from engine.api import load  # noqa: PLC0415

    return "kv" in inspect.signature(load).parameters


def launch_for_synthetic(geometry: str, recipe: str | None = None, *, profile: str | None = None,
                         ctx: int | None = None, kv: str | None = None, vram_limit: int | None = None,
                         memory="probe") -> Launch:
    """`resolve_launch` for `ninfer bench --synthetic GEOMETRY` (weights sized from the recipe)."""
    from engine.gpu import memory as mp  # noqa: PLC0415
    from engine.config import ModelArgs  # noqa: PLC0415
    from engine.synthetic import GEOMETRIES, geometry_config  # noqa: PLC0415

    args = ModelArgs.from_config(geometry_config(geometry))
    recipe = recipe or GEOMETRIES[geometry][1]
    weights = mp.weights_from_recipe(args, recipe)
    return resolve_launch(geometry, args, weights, profile=profile, ctx=ctx, kv=kv, vram_limit=vram_limit,
                          device="gpu", weights_source=f"synthetic recipe {recipe}", memory=memory)


def load_fitted(path, ref: str | None, load, *, device: str = "auto", profile: str | None = None,
                ctx: int | None = None, kv: str | None = None, vram_limit: int | None = None, say=None):
    """Load through `load(max_context[, kv=...])` with the context this launch fits: merge profile and flags, cap
    the pool at `vram_limit`, and when the context was chosen automatically step down the ladder if
    the GPU refuses an allocation. `say(text)` hears what was chosen and why. On the CPU with no
    launch flags this is just `load(ctx)`."""
    from engine.gpu import memory as mp  # noqa: PLC0415
    from engine import memory_budget as mb  # noqa: PLC0415
    from engine.backend import resolve_device  # noqa: PLC0415

    device = getattr(device, "value", device)
    kv = getattr(kv, "value", kv)
    try:
        dev = resolve_device(device)
    except (RuntimeError, ValueError):
        return load(ctx)  # the loader says what is wrong with the device
    if dev != "gpu" and profile is None and kv is None and vram_limit is None:
        return load(ctx)
    launch = launch_for_artifact(path, ref, device=dev, profile=profile, ctx=ctx, kv=kv, vram_limit=vram_limit)
    for note in launch.notes:
        if say is not None:
            say(note)
    if dev == "gpu":
        mb.apply_vram_limit(vram_limit)
    if launch.values["kv"] != "bf16":
        def load_kv(n, _load=load, _kv=launch.values["kv"]):
            return _load(n, kv=_kv)

        load = load_kv
    if launch.plan is None or launch.values["ctx"] or launch.max_context is None:
        return _with_spec(load(launch.max_context), launch, say)
    rungs = [launch.max_context] + [r for r in mp.ladder_for(launch.plan) if r < launch.max_context]

    def step(ctx_now, ctx_next, _err):
        if say is not None:
            say(f"the GPU refused context {ctx_now:,}: trying {ctx_next:,}")

    engine, _ = mb.build_with_ladder(load, rungs, on_step=step)
    return _with_spec(engine, launch, say)


def _with_spec(engine, launch: Launch, say):
    """The loaded engine, speculating as the launch's profile asks (`engine.launch_spec`, the default of every
    request's `--spec`: `ninfer_cli.model_session.generation_config`) when `check_spec` lets it; else a note."""
    spec = spec_flag(launch.values)
    if spec is None:
        return engine
    from engine.speculative import check_spec  # noqa: PLC0415

    try:
        check_spec(engine, spec)
    except NinferError as e:
        if say is not None:
            say(f"{e.message}: profile {launch.profile} runs without speculation")
        return engine
    engine.launch_spec = spec
    if say is not None:
        say(f"speculative decoding {spec} (profile {launch.profile})")
    return engine


def prefit_context(ref: str | None, *, device: str = "auto", profile: str | None = None, ctx: int | None = None,
                   kv: str | None = None, vram_limit: int | None = None, say=None) -> int | None:
    """The context a launch of `ref` gets, settled before a loader that takes only `ctx` (the TUI): says
    the notes, caps the pool at `vram_limit`, returns the context to pass on. Unchanged `ctx` when no
    launch flag is given (the loader fits it itself)."""
    if profile is None and kv is None and vram_limit is None:
        return ctx
    from engine.gpu import memory as mp  # noqa: PLC0415
    from engine import memory_budget as mb  # noqa: PLC0415
    from engine.backend import resolve_device  # noqa: PLC0415
    from ninfer_cli.model_session import resolve_model  # noqa: PLC0415

    try:
        dev = resolve_device(getattr(device, "value", device))
    except (RuntimeError, ValueError):
        return ctx
    path, name = resolve_model(ref, quiet=True)
    launch = launch_for_artifact(path, name, device=dev, profile=profile, ctx=ctx, kv=getattr(kv, "value", kv),
                                 vram_limit=vram_limit)
    for note in launch.notes:
        if say is not None:
            say(note)
    if dev == "gpu":
        mb.apply_vram_limit(vram_limit)
    return launch.max_context


def bench_fitter(*, device: str, synthetic: str | None = None, recipe: str | None = None, model_path=None,
                 model: str | None = None, profile: str | None = None, ctx: int | None = None,
                 vram_limit: int | None = None, say=None):
    """For `ninfer bench`: a function kv -> the context to build each instance with (None = what the
    tests need), after fitting it to free memory or `vram_limit` and capping the pool; notes go to `say`."""
    from engine.gpu import memory as mp  # noqa: PLC0415
    from engine import memory_budget as mb  # noqa: PLC0415

    def fit(kv: str | None) -> int | None:
        if device != "gpu" or synthetic == "tiny":
            if vram_limit is not None and say is not None:
                say("--vram-limit applies to the GPU only: ignored")
            return ctx
        if synthetic:
            launch = launch_for_synthetic(synthetic, recipe, profile=profile, ctx=ctx, kv=kv, vram_limit=vram_limit)
        else:
            launch = launch_for_artifact(model_path, model, device="gpu", profile=profile, ctx=ctx, kv=kv,
                                         vram_limit=vram_limit)
        for note in launch.notes:
            if say is not None:
                say(f"[kv={launch.values['kv']}] {note}")
        mb.apply_vram_limit(vram_limit)
        return launch.max_context

    return fit


def _cuda_runs(args) -> bool:
    """Whether `engine.load(..., device="gpu")` builds the CUDA engine for this model (else the plan
    does not describe what gets allocated)."""
    try:
        from engine.gpu_engine import cuda_supported  # noqa: PLC0415
    except Exception:  # noqa: BLE001 - no CUDA engine importable: nothing to plan for
        return False
    return bool(cuda_supported(args))
