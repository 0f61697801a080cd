"""Benchmark report: one dict (schema `ninfer.bench`), written as Markdown, JSON, JSON Lines or CSV.

Every writer is a pure function of the report dict, so what a table shows and what a JSON file keeps
cannot drift apart. Rows carry the environment fields too (as llama-bench's CSV/JSONL do), so a
single line of JSONL or CSV is self-describing.
"""
from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math

from engine.bench import Result, Stats

SCHEMA = "ninfer.bench"
SCHEMA_VERSION = 1
FORMATS = ("md", "json", "jsonl", "csv")

ENV_FIELDS = ("ninfer_version", "git_commit", "backend", "gpu", "driver", "cuda_runtime", "cupy", "cpu")
MODEL_FIELDS = ("model", "synthetic", "recipe", "weight_bytes", "weight_bytes_per_token", "state_bytes",
                "kv_bytes_per_token")


def _stat_fields(prefix: str, s: Stats | None) -> dict:
    if s is None:
        return {f"avg_{prefix}": None, f"stddev_{prefix}": None, f"samples_{prefix}": None}
    clean = lambda x: None if x is None or math.isnan(x) else x  # noqa: E731
    return {
        f"avg_{prefix}": clean(s.mean),
        f"stddev_{prefix}": clean(s.std),
        f"samples_{prefix}": list(s.samples),
    }


def result_row(r: Result, engine_name: str = "ninfer") -> dict:
    """Flat record of one result (llama-bench names where they exist: n_prompt, avg_ts, samples_ts...)."""
    row = {
        "engine": engine_name,
        "test": r.test.name,
        "n_prompt": r.test.n_prompt,
        "n_gen": r.test.n_gen,
        "n_depth": r.test.depth,
        "kv": r.instance.kv,
        "lanes": r.instance.lanes,
        "spec": r.instance.spec,
        "repetitions": len(r.tps.samples),
    }
    row |= _stat_fields("ts", r.tps)
    row |= _stat_fields("s", r.seconds)
    row |= _stat_fields("ttft_ms", r.ttft_ms)
    row |= _stat_fields("prefill_ts", r.prefill_tps)
    row |= _stat_fields("decode_ts", r.decode_tps)
    row |= {
        "achieved_gbps": r.gbps,
        "pct_copy_bw": r.pct_copy,
        "achieved_tflops": r.tflops,
        "pct_matmul": r.pct_matmul,
        "peak_mem_bytes": r.peak_mem_bytes,
    }
    row |= r.extra
    return row


def build_report(
    *,
    command: str,
    env: dict,
    roofline: dict | None,
    model: dict,
    settings: dict,
    results: list[Result],
    baseline: dict | None = None,
    baseline_results: list[Result] | None = None,
) -> dict:
    """Assemble the report; when a baseline ran, each of our rows gets `baseline_ts` and `ratio`."""
    rows = [result_row(r) for r in results]
    _compare_spec(rows)
    base_rows = [result_row(r, "transformers") for r in baseline_results or []]
    by_key = {(b["test"], b["lanes"]): b for b in base_rows}
    if baseline is not None:
        for row in rows:
            b = by_key.get((row["test"], row["lanes"]))
            ours, theirs = row["avg_ts"], b["avg_ts"] if b else None
            row["baseline_ts"] = theirs
            row["ratio"] = ours / theirs if ours and theirs else None
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "env": env,
        "roofline": roofline,
        "model": model,
        "settings": settings,
        "results": rows,
        "baseline": None if baseline is None else dict(baseline, results=base_rows),
    }


def _compare_spec(rows: list[dict]) -> None:
    """Each speculative row's decode against the plain row of the same test and engine settings: `speedup`
    (decode tok/s over plain) and `round_vs_step` (a round's time over a plain decode step's)."""
    plain = {(r["test"], r["kv"], r["lanes"]): r for r in rows if r["spec"] == "off"}
    for row in rows:
        base = plain.get((row["test"], row["kv"], row["lanes"])) if row["spec"] != "off" else None
        ours, theirs = row.get("avg_decode_ts"), base.get("avg_decode_ts") if base else None
        if ours and theirs:
            row["speedup"] = ours / theirs
            if row.get("round_ms"):
                row["round_vs_step"] = row["round_ms"] / (1e3 / theirs)


def spec_note(rows: list[dict]) -> str | None:
    """The line under the header saying how speculative rows drafted (forced acceptance is said plainly)."""
    forced = next((r["spec_forced"] for r in rows if r.get("spec_forced")), None)
    head = next((r["draft_head"] for r in rows if r.get("draft_head")), "target")
    head = (f"a proposal head of {int(head.split()[1]):,} rows" if head.startswith("proposal ")
            else "the target's head")
    if forced:
        return (f"speculation: acceptance forced {'/'.join(f'{a:g}' for a in forced)} per draft position (drafts: the "
                f"plain greedy continuation, corrupted where a coin says; the MTP head, drafting through {head}, "
                "still runs every round); speculative output checked token for token against plain greedy")
    if any(r.get("rounds") for r in rows):
        return (f"speculation: drafts from the model's MTP head through {head} (random weights accept almost "
                "nothing)")
    return None


def _spec_cells(row: dict) -> list[str]:
    if row["spec"] == "off" or not row.get("rounds"):
        return ["-"] * 5
    per = "/".join(f"{a:.2f}" for a in row["acceptance_per_position"])
    return [f"{100 * row['acceptance']:.0f}% ({per})", f"{row['tokens_per_round']:.2f}", _num(row.get("round_ms")),
            "-" if row.get("round_vs_step") is None else f"{row['round_vs_step']:.2f}x",
            "-" if row.get("speedup") is None else f"{row['speedup']:.2f}x"]


# ---------------------------------------------------------------------------------- writers
def _flat(report: dict, row: dict) -> dict:
    out = {"schema": report["schema"], "schema_version": report["schema_version"]}
    out |= {k: report["env"].get(k) for k in ENV_FIELDS}
    out |= {k: report["model"].get(k) for k in MODEL_FIELDS}
    roof = report.get("roofline") or {}
    out |= {"copy_gbps": roof.get("copy_gbps"), "matmul_tflops": roof.get("matmul_tflops")}
    return out | row


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2) + "\n"


def to_jsonl(report: dict) -> str:
    rows = report["results"] + ((report.get("baseline") or {}).get("results") or [])
    return "".join(json.dumps(_flat(report, r)) + "\n" for r in rows)


def to_csv(report: dict) -> str:
    rows = [_flat(report, r) for r in report["results"] + ((report.get("baseline") or {}).get("results") or [])]
    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ";".join(f"{x:.6g}" for x in v) if isinstance(v, list) else v for k, v in r.items()})
    return buf.getvalue()


def _bytes(n) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _num(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _sig(x, digits=3) -> str:
    """Significant digits, for figures that span orders of magnitude (TFLOP/s on a CPU vs a GPU)."""
    return "-" if x is None else f"{x:.{digits}g}"


def _pm(row: dict, key: str, digits: int = 2) -> str:
    m, s = row.get(f"avg_{key}"), row.get(f"stddev_{key}")
    return "-" if m is None else f"{m:.{digits}f} ± {s:.{digits}f}"


def to_markdown(report: dict) -> str:
    """llama-bench-like table: varied engine settings get a column, one row per test."""
    env, model, roof = report["env"], report["model"], report.get("roofline") or {}
    rows = report["results"]
    lines = []
    gpu = (f"{env['gpu']} · driver {env['driver']} · CUDA {env['cuda_runtime']} · CuPy {env['cupy']}"
           if env.get("gpu") else f"{env.get('cpu')} ({env.get('cpu_count')} cores) · NumPy {env.get('numpy')}")
    lines.append(f"ninfer {env.get('ninfer_version')} ({env.get('git_commit')}) · {env.get('backend')} · {gpu}")
    if roof:
        lines.append(
            f"roofline: copy {roof['copy_gbps']:.1f} GB/s · {roof.get('matmul_dtype')} matmul "
            f"{roof['matmul_tflops']:.2f} TFLOP/s (measured {roof.get('measured_at', '?')})"
        )
    base = report.get("baseline")
    if base and base.get("error"):
        lines.append(f"baseline: transformers failed: {base['error']}")
        base = None
    elif base:
        lines.append(f"baseline: transformers {base.get('version')} · {base.get('dtype')} on {base.get('device')}"
                     + (f" · {base['note']}" if base.get("note") else ""))
    paths = {(r.get("path"), str(r.get("sampling"))) for r in rows if r.get("path")}
    if paths:
        path, sampling = sorted(paths)[0]
        st = next(r["sampling"] for r in rows if r.get("path") == path)
        what = "greedy" if not st.get("temperature") else ", ".join(
            f"{k} {v}" for k, v in st.items() if v not in (0, 0.0, 1.0) or k == "temperature")
        lines.append(f"decode timed through {'Engine.stream' if path == 'stream' else 'decode_greedy (burst)'}: {what}")
    note = spec_note(rows)
    if note:
        lines.append(note)
    lines.append("")
    burst = any(r.get("burst_ts") is not None for r in rows)
    varied = [k for k in ("kv", "lanes", "spec") if len({r[k] for r in rows}) > 1
              or any(r[k] not in (None, 1, "off") for r in rows)]
    name = model.get("model") or "?"
    if model.get("synthetic"):
        name = f"synthetic {model['synthetic']} {model.get('recipe') or ''}".strip()
    mem_head = "peak VRAM" if env.get("gpu") else "peak RSS"
    head = ["model", "size", "backend", *varied, "test", "t/s", "TTFT ms", "GB/s", "% copy BW",
            "TFLOP/s", "% matmul", mem_head]
    if burst:
        head += ["burst t/s"]
    speculated = any(r["spec"] != "off" for r in rows)
    if speculated:
        head += ["acceptance (per position)", "tok/round", "round ms", "round/step", "vs plain"]
    if base:
        head += ["HF t/s", "ours/HF"]
    table = [head]
    for r in rows:
        cells = [name, _bytes(model.get("weight_bytes")), env.get("backend") or "-",
                 *[str(r[k]) for k in varied], r["test"], _pm(r, "ts"), _pm(r, "ttft_ms", 1),
                 _sig(r["achieved_gbps"], 4), _num(r["pct_copy_bw"], 1), _sig(r["achieved_tflops"]),
                 _num(r["pct_matmul"], 1), _bytes(r["peak_mem_bytes"])]
        if burst:
            cells += [_num(r.get("burst_ts"))]
        if speculated:
            cells += _spec_cells(r)
        if r.get("error"):
            cells[head.index("t/s")] = "error (below)"
        if base:
            cells += [_num(r.get("baseline_ts")), "-" if r.get("ratio") is None else f"{r['ratio']:.2f}x"]
        table.append(cells)
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    right = {"size", "t/s", "TTFT ms", "GB/s", "% copy BW", "TFLOP/s", "% matmul", mem_head, "burst t/s", "HF t/s",
             "ours/HF", "tok/round", "round ms", "round/step", "vs plain"}
    def fmt(row):
        return "| " + " | ".join(
            str(c).rjust(w) if h in right else str(c).ljust(w) for c, w, h in zip(row, widths, head)
        ) + " |"
    lines.append(fmt(head))
    lines.append("| " + " | ".join(("-" * (w - 1) + ":") if h in right else "-" * w
                                   for w, h in zip(widths, head)) + " |")
    lines += [fmt(row) for row in table[1:]]
    lines += [f"error: {r['test']} spec={r['spec']}: {r['error']}" for r in rows if r.get("error")]
    return "\n".join(lines) + "\n"


WRITERS = {"md": to_markdown, "json": to_json, "jsonl": to_jsonl, "csv": to_csv}


def render(report: dict, fmt: str) -> str:
    """The report in one of FORMATS."""
    return WRITERS[fmt](report)
