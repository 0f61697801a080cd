"""`ninfer profile ls|show`: the launch profiles of each model; and the memory plan table that
`ninfer show MODEL --memory` prints (nothing is loaded: sizes come from the artifact's header, or
from the synthetic recipe for a catalog model that is not downloaded)."""
from __future__ import annotations

import enum
from typing import Annotated, Optional

import typer

from ninfer_cli.options import JsonOut

BUDGETS_GIB = (16, 24, 32, 48, 80, 141)


class Action(str, enum.Enum):
    ls = "ls"
    show = "show"


def profile(
    action: Annotated[Action, typer.Argument(
        help="ls: every model's profiles; show: one profile in full.")] = Action.ls,
    model: Annotated[Optional[str], typer.Argument(help="Model name (catalog or store), or a .ninfer path.",
                                                   show_default=False)] = None,
    name: Annotated[Optional[str], typer.Argument(help="Profile name (show; default: default).",
                                                  show_default=False)] = None,
    json_out: JsonOut = False,
) -> None:
    """List launch profiles, or show one. Use one with [b]ninfer run MODEL --profile NAME[/b]; flags override it.

    Examples: [b]ninfer profile ls[/b] · [b]ninfer profile ls qwen38-27b[/b] ·
    [b]ninfer profile show qwen38-27b long[/b]
    """
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.profiles import PROFILES, flags_of, get_profile, model_key, profiles_for, spec_flag  # noqa: PLC0415

    if action is Action.show:
        if not model:
            raise typer.BadParameter("name a model: ninfer profile show MODEL [PROFILE]", param_hint="MODEL")
        p = get_profile(model, name)
        data = {"model": model_key(model) or model, **_profile_dict(p), "flags": flags_of(p)}
        if json_out:
            output.print_json(data)
            return
        output.key_values([
            ("model", data["model"]), ("profile", p.name), ("summary", p.summary),
            ("context", _ctx(p.ctx)), ("kv", p.kv), ("lanes", p.lanes),
            ("speculation", f"{spec_flag(p.values())} ({p.draft_tokens} draft tokens a round)" if p.spec else "off"),
            ("prefill chunk", p.prefill_chunk), ("same as", flags_of(p)),
            ("status", p.status or _status(p)),
            ("memory", f"ninfer show {data['model']} --memory --profile {p.name}"),
        ])
        return
    models = [model_key(model) or model] if model else sorted(PROFILES)
    rows = []
    for m in models:
        for p in profiles_for(m):
            rows.append({"model": m, **_profile_dict(p)})
    if json_out:
        output.print_json(rows)
        return
    output.table(("model", "profile", "context", "kv", "lanes", "speculation", "status"),
                 [(r["model"], r["name"], _ctx(r["ctx"]), r["kv"], r["lanes"],
                   spec_flag(r) or "off", r["status"]) for r in rows])


def _profile_dict(p) -> dict:
    return {"name": p.name, "summary": p.summary, "ctx": p.ctx, "kv": p.kv, "lanes": p.lanes, "spec": p.spec,
            "draft_tokens": p.draft_tokens, "prefill_chunk": p.prefill_chunk, "status": p.status or _status(p)}


def _status(p) -> str:
    from engine.gpu.memory import GPU_KV_FORMATS  # noqa: PLC0415
    from ninfer_cli.profiles import INT8_NOT_IN_LOAD, INT8_NOT_ON_GPU, load_takes_kv  # noqa: PLC0415

    if p.kv == "int8" and "int8" not in GPU_KV_FORMATS:
        return f"{INT8_NOT_ON_GPU}: runs with bf16 KV until it is"
    if p.kv == "int8" and not load_takes_kv():
        return f"run/chat: {INT8_NOT_IN_LOAD}; they use bf16 KV until it is"
    if p.spec:
        return ("speculates where the model carries the MTP head and the engine runs it; else off, with a note "
                "(`--spec` says the same as an error)")
    return "available"


def _ctx(ctx) -> str:
    return "auto (fit)" if ctx is None else f"{ctx:,}"


# ---------------------------------------------------------------------------------- show --memory
def _plan_source(ref: str):
    """(label, ModelArgs, weights by component, where the sizes came from) without loading weights."""
    from pathlib import Path  # noqa: PLC0415

    from engine.gpu import memory as mp  # noqa: PLC0415
    from engine.config import ModelArgs  # noqa: PLC0415
    from engine.errors import NinferError  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    path = Path(ref).expanduser()
    if not path.is_file():
        found = Store().find(ref)
        path = found.artifact_path if found is not None and found.artifact_path.is_file() else None
    if path is not None:
        from engine.artifact.container import open_artifact  # noqa: PLC0415

        art = open_artifact(path)
        return ref, ModelArgs.from_artifact(art), mp.weights_from_artifact(art), f"object sizes in {path.name}'s header"
    from engine.synthetic import GEOMETRIES, geometry_config  # noqa: PLC0415
    from ninfer_cli.profiles import SYNTHETIC_MODELS  # noqa: PLC0415

    geometry = ref if ref in GEOMETRIES else {v: k for k, v in SYNTHETIC_MODELS.items()}.get(ref.split(":")[0])
    if geometry is None:
        raise NinferError(f"no installed model, .ninfer file or known geometry named {ref!r}",
                          "`ninfer ls` lists installed models; catalog Qwen models work without downloading")
    args = ModelArgs.from_config(geometry_config(geometry))
    recipe = GEOMETRIES[geometry][1]
    return ref, args, mp.weights_from_recipe(args, recipe), f"estimate: {geometry} geometry, {recipe} recipe"


def memory_report(ref: str, *, ctx: int | None = None, kv: str | None = None, profile: str | None = None,
                  vram_limit: int | None = None, json_out: bool = False, memory="probe") -> None:
    """Print the memory plan of `ref` (the `ninfer show MODEL --memory` table) without loading weights."""
    from engine import memory_budget as mb  # noqa: PLC0415
    from engine.gpu import memory as mp  # noqa: PLC0415
    from ninfer_cli import output  # noqa: PLC0415

    _gib = output.human_gib
    from ninfer_cli.profiles import INT8_NOT_IN_LOAD, components_for, get_profile, load_takes_kv, merge  # noqa: PLC0415

    label, args, weights, source = _plan_source(ref)
    has_mtp = "mtp" in weights or bool(getattr(args, "mtp_num_hidden_layers", 0))
    prof = get_profile(ref, profile, has_mtp=has_mtp)
    values, sources = merge(prof, ctx=ctx, kv=getattr(kv, "value", kv))
    notes = []
    if values["kv"] not in mp.GPU_KV_FORMATS:
        notes.append(f"{values['kv']} KV is not implemented on the GPU yet: this is what it would take")
    elif values["kv"] != "bf16" and not load_takes_kv():
        notes.append(f"{INT8_NOT_IN_LOAD}: run/chat would use bf16")
    from ninfer_cli.profiles import spec_unavailable  # noqa: PLC0415

    why = spec_unavailable(values, has_mtp, label)
    if why:
        notes.append(f"{why}: profile {prof.name} runs without speculation, and the plan has no parts for it")
        values["spec"] = None
    elif values["spec"] and "mtp" not in weights:
        notes.append("the MTP head's weights have no size in this table: the plan leaves them out")
    from ninfer_cli.profiles import _cuda_runs  # noqa: PLC0415

    if not _cuda_runs(args):
        notes.append("run/chat do not load this model on the CUDA engine yet: the plan is what that engine "
                     "would allocate")
    comps, optional = components_for(values)
    comps = tuple(c for c in comps if c in weights)
    short = "artifact header" if source.startswith("object sizes") else "recipe estimate"
    plan = mp.plan_memory(args, weights, model=label, source=short, kv=values["kv"], lanes=values["lanes"],
                          components=comps, optional=optional, spec=values["spec"],
                          draft_tokens=values["draft_tokens"], prefill_chunk=values["prefill_chunk"],
                          **mp.engine_prefill_executors())
    b = mb.budget(vram_limit, memory)
    context, how = values["ctx"], sources["ctx"]
    fits = None
    if context is None:
        if b is not None:
            context = plan.max_positions if plan.total(plan.max_positions) <= b.free else None
            if context is None:
                try:
                    context, how = mp.fit_context(plan, b.free), "auto: largest rung that fits"
                except Exception as e:  # noqa: BLE001 - show the plan anyway, with the reason
                    notes.append(getattr(e, "message", str(e)))
                    context, how = mp.ladder_for(plan)[-1], "smallest rung (nothing fits)"
            else:
                how = "auto: the model's maximum fits"
        else:
            context = min(32768, plan.max_positions)
            how = f"auto needs a GPU or --vram-limit; shown at {context:,}"
    if b is not None:
        fits = plan.total(context) <= b.free
        if not fits:
            notes.append(f"does not fit: needs {_gib(plan.total(context))}, {_gib(b.free)} free")
    ladder = {f"{g} GiB": plan.largest_context(mb.budget(g * 2**30, None).free) for g in BUDGETS_GIB}
    if json_out:
        data = plan.to_dict(context)
        data.update(context_source=how, budget=None if b is None else {"free": b.free, "total": b.total,
                                                                        "source": b.source},
                    fits=fits, largest_context_by_card=ladder, notes=notes + list(plan.notes))
        output.print_json(data)
        return
    output.line(f"memory plan: {label}, {plan.kv} KV, {plan.lanes} lane, context {context:,} ({how})")
    output.line(f"sizes: {source}")
    rows = [(i.name, f"{i.bytes:,}", f"{i.bytes / 2**30:.2f}", i.detail) for i in plan.items(context)]
    total = plan.total(context)
    rows.append(("total", f"{total:,}", f"{total / 2**30:.2f}", "must be free before loading"))
    output.table(("part", "bytes", "GiB", "how"), rows, right=("bytes", "GiB"))
    if b is not None:
        output.line(f"budget: {_gib(b.free)} ({b.source})" + ("" if fits else " -- does NOT fit"))
    output.line("largest context by card size (minus a 0.5 GiB CUDA context): "
                + ", ".join(f"{k} {v:,}" if v else f"{k} -" for k, v in ladder.items()))
    for n in notes:
        output.warn(n)
