"""`ninfer inspect FILE [--json]`: what a .ninfer artifact holds."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ninfer_cli.options import JsonOut

_CONFIG_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads",
                "num_key_value_heads", "num_experts", "intermediate_size", "moe_intermediate_size")


def inspect(
    path: Annotated[Path, typer.Argument(help="A .ninfer file (v1, v2 or v3).", show_default=False)],
    json_out: JsonOut = False,
) -> None:
    """Show an artifact's version, id, components and configs, objects by format, sizes and parts."""
    from engine.artifact.container import open_artifact
    from engine.artifact.verify import summary
    from ninfer_cli import output

    s = summary(open_artifact(path))
    if json_out:
        output.print_json(s)
        return
    rows = [("file", s["path"]), ("container", f"v{s['version']}"), ("artifact id", s["artifact_id"] or "-"),
            ("name", (s["metadata"] or {}).get("name", "-")), ("size", f"{output.human_bytes(s['total_bytes'])} "
                                                                        f"({s['total_bytes']:,} bytes)")]
    if len(s["files"]) > 1:
        rows.append(("parts", ", ".join(Path(f["path"]).name for f in s["files"][1:])))
    if s["provenance"]:
        rows.append(("provenance", _compact(s["provenance"])))
    rows += [("objects", s["objects"]), ("parameters", f"{s['bindings']:,} bindings, {s['parameters']:,} values"),
             ("uses", s["uses"])]
    output.key_values(rows)
    for cid, c in s["components"].items():
        cfg = c["config"]
        shown = ", ".join(f"{k}={_compact(cfg[k])}" for k in _CONFIG_KEYS if k in cfg)
        extra = [f"target={c['target']}"] if "target" in c else []
        if c.get("resources"):
            extra.append("resources: " + ", ".join(c["resources"]))
        output.line(f"component {cid}: {shown or '(no config)'}" + (" | " + "; ".join(extra) if extra else ""))
    output.table(["format", "objects", "bytes"],
                 [(k, v["objects"], output.human_bytes(v["bytes"])) for k, v in s["formats"].items()],
                 right=["objects", "bytes"])


def _compact(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
