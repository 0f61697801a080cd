"""`ninfer show NAME`: one installed model's manifest, what its artifact holds, and its files."""
from __future__ import annotations

from typing import Annotated

import typer

from ninfer_cli.options import Ctx, JsonOut, KvOpt, ModelRequired, ProfileOpt, VramLimit

Memory = Annotated[bool, typer.Option("--memory", help="Print the GPU memory plan (weights, state, KV pool, "
                                                       "workspace, headroom) without loading anything.")]


def artifact_summary(path) -> dict:
    """Architecture, size and formats read from the artifact's header (no tensor data is touched)."""
    import math  # noqa: PLC0415
    from collections import Counter  # noqa: PLC0415

    from engine.artifact.container import open_artifact  # noqa: PLC0415

    with open_artifact(path) as art:
        config = art.components.get("text", {}).get("config", {}) or {}
        tensors = [o for o in art.objects.values() if o.kind == "tensor"]
        by_format = Counter()
        for o in tensors:
            by_format[o.format or "?"] += o.bytes
        total = sum(by_format.values()) or 1
        archs = config.get("architectures") or [config.get("model_type", "?")]
        return {
            "container_version": art.version,
            "architecture": archs[0] if archs else "?",
            "layers": config.get("num_hidden_layers"),
            "hidden_size": config.get("hidden_size"),
            "vocab_size": config.get("vocab_size"),
            "context_length": config.get("max_position_embeddings"),
            "parameters": sum(math.prod(o.shape) for o in tensors if o.shape),
            "formats": {f: round(b / total, 4) for f, b in by_format.most_common()},
            "resources": sorted(art.components.get("text", {}).get("resources", {})),
            "components": sorted(art.components),
            "name": (art.metadata or {}).get("name"),
            "sampling": sampling_summary(config, _template_source(art)),
        }


def _template_source(art) -> str:
    """The chat template's text (its own resource, else tokenizer_config.json's), "" when there is none."""
    import json  # noqa: PLC0415

    if art.has_resource("chat_template.jinja"):
        return art.resource("chat_template.jinja").decode("utf-8", "replace")
    if art.has_resource("tokenizer_config.json"):
        template = json.loads(art.resource("tokenizer_config.json")).get("chat_template") or ""
        return template if isinstance(template, str) else json.dumps(template)
    return ""


def sampling_summary(config: dict, template: str) -> dict:
    """The sampling preset a launch uses when no sampling flag is given, per reasoning mode, and its source."""
    from engine.text.presets import preset_source, sampling_preset  # noqa: PLC0415
    from engine.text.reasoning import supports_thinking  # noqa: PLC0415

    modes = ({"thinking": sampling_preset(config, True), "no thinking": sampling_preset(config, False)}
             if supports_thinking(template) else {"default": sampling_preset(config, False)})
    return {"source": preset_source(config), "modes": modes}


def _sampling_text(preset: dict) -> str:
    names = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k", "min_p": "min-p",
             "presence_penalty": "presence penalty", "frequency_penalty": "frequency penalty"}
    return ", ".join(f"{names.get(k, k)} {v:g}" for k, v in preset.items())


def _params(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def show(name: ModelRequired, json_out: JsonOut = False, memory: Memory = False, ctx: Ctx = None,
         kv: KvOpt = None, profile: ProfileOpt = None, vram_limit: VramLimit = None) -> None:
    """Show an installed model: source, size, checksum, architecture, formats, sampling preset, files.

    With --memory: its GPU memory plan at --ctx (default: fitted to free memory or --vram-limit), for
    --kv and --profile; catalog Qwen models need not be downloaded (sizes from the geometry's recipe).
    """
    if memory:
        from ninfer_cli.commands.profile import memory_report  # noqa: PLC0415

        return memory_report(name, ctx=ctx, kv=kv, profile=profile, vram_limit=vram_limit, json_out=json_out)
    from ninfer_cli import output  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    m = Store().get(name)
    files = sorted(p for p in m.path.iterdir() if p.is_file()) if m.path else []
    summary, problem = None, None
    if not m.artifact_path.is_file():
        problem = f"artifact file {m.artifact_path} is missing: `ninfer rm {m.ref}` and pull it again"
    else:
        try:
            summary = artifact_summary(m.artifact_path)
        except Exception as e:  # a damaged artifact must not hide the manifest
            problem = f"cannot read {m.artifact_path}: {getattr(e, 'message', None) or e}"
    if json_out:
        data = m.to_dict()
        data["artifact_present"] = m.artifact_path.is_file()
        data["model"] = summary
        data["problem"] = problem
        data["files"] = [{"name": p.name, "bytes": p.stat().st_size} for p in files]
        output.print_json(data)
        return
    pairs = [
        ("name", m.ref),
        ("source", m.source),
        ("revision", m.revision or "-"),
        ("size", f"{output.human_bytes(m.bytes)} ({m.bytes:,} bytes)"),
        ("sha256", m.sha256 or "-"),
        ("container", f"v{m.container_version}"),
        ("added", m.added),
        ("path", m.path),
    ]
    if summary:
        fmts = ", ".join(f"{f} {share:.0%}" for f, share in summary["formats"].items())
        pairs += [
            ("architecture", summary["architecture"]),
            ("parameters", _params(summary["parameters"])),
            ("layers", summary["layers"] or "-"),
            ("hidden size", summary["hidden_size"] or "-"),
            ("context", f"{summary['context_length']:,}" if summary["context_length"] else "-"),
            ("vocab", f"{summary['vocab_size']:,}" if summary["vocab_size"] else "-"),
            ("formats", fmts or "-"),
            ("resources", ", ".join(summary["resources"]) or "-"),
        ]
        sampling = summary["sampling"]
        for i, (mode, preset) in enumerate(sampling["modes"].items()):
            label = "sampling" if mode == "default" else f"sampling ({mode})"
            pairs.append((label, _sampling_text(preset) + (f"  (from the {sampling['source']})" if i == 0 else "")))
    output.key_values(pairs)
    output.line("files")
    for p in files:
        output.line(f"  {p.name}  {output.human_bytes(p.stat().st_size)}")
    if problem:
        output.warn(problem)
