"""Benchmark report writers: Markdown table, JSON (schema + version), JSON Lines and CSV."""
from __future__ import annotations

import csv
import io
import json

import pytest

from engine.bench import Instance, Result, Stats, Test
from engine.bench_report import FORMATS, SCHEMA, SCHEMA_VERSION, build_report, render

ENV = {"ninfer_version": "0.1.0", "git_commit": "abc123", "backend": "cupy", "gpu": "NVIDIA H200",
       "driver": "580.159.03", "cuda_runtime": "13.0", "cupy": "14.2.0", "cpu": "x", "cpu_count": 16}
ROOF = {"copy_gbps": 4300.0, "matmul_tflops": 790.0, "matmul_dtype": "bfloat16", "measured_at": "2026-11-29"}
MODEL = {"model": None, "synthetic": "qwen3.8-27b", "recipe": "groupwise-int", "weight_bytes": 15 * 2**30,
         "weight_bytes_per_token": 13_900_000_000, "state_bytes": 151_000_000, "kv_bytes_per_token": 65536}


def _result(test, tps, inst=Instance(), gbps=None, pct=None):
    r = Result(test, inst, Stats.of([1 / t for t in tps]), Stats.of(tps), peak_mem_bytes=20 * 2**30)
    if test.kind != "tg":
        r.ttft_ms = Stats.of([1e3 * test.n_prompt / t for t in tps])
    r.gbps, r.pct_copy = gbps, pct
    return r


def _report(baseline=False, instances=(Instance(),)):
    ours = []
    for inst in instances:
        ours += [_result(Test(512, 0), [10000.0, 10100.0, 9900.0], inst),
                 _result(Test(0, 128), [250.0, 252.0, 248.0], inst, gbps=3600.0, pct=83.7)]
    base = [_result(Test(512, 0), [2000.0, 2000.0]), _result(Test(0, 128), [6.6, 6.4])] if baseline else None
    return build_report(command="ninfer bench --synthetic qwen3.8-27b", env=ENV, roofline=ROOF, model=MODEL,
                        settings={"repetitions": 3, "warmup": 1}, results=ours,
                        baseline={"name": "transformers", "version": "5.17.0", "dtype": "bfloat16",
                                  "device": "cuda"} if baseline else None,
                        baseline_results=base)


def test_json_has_schema_version_and_every_sample():
    data = json.loads(render(_report(), "json"))
    assert data["schema"] == SCHEMA == "ninfer.bench" and data["schema_version"] == SCHEMA_VERSION
    assert data["env"]["gpu"] == "NVIDIA H200" and data["roofline"]["copy_gbps"] == 4300.0
    pp, tg = data["results"]
    assert pp["test"] == "pp512" and pp["samples_ts"] == [10000.0, 10100.0, 9900.0]
    assert pp["avg_ts"] == pytest.approx(10000.0) and pp["stddev_ts"] == pytest.approx(100.0)
    assert tg["test"] == "tg128" and tg["avg_ttft_ms"] is None and tg["pct_copy_bw"] == 83.7
    assert data["baseline"] is None


def test_baseline_ratio_per_test():
    data = json.loads(render(_report(baseline=True), "json"))
    pp, tg = data["results"]
    assert pp["baseline_ts"] == pytest.approx(2000.0) and pp["ratio"] == pytest.approx(5.0)
    assert tg["ratio"] == pytest.approx(250.0 / 6.5)
    assert [r["engine"] for r in data["baseline"]["results"]] == ["transformers"] * 2


def test_markdown_table():
    text = render(_report(baseline=True), "md")
    lines = text.splitlines()
    assert "NVIDIA H200" in lines[0] and "580.159.03" in lines[0] and "CUDA 13.0" in lines[0]
    assert "abc123" in lines[0] and "14.2.0" in lines[0]
    assert "4300.0 GB/s" in lines[1]
    table = [line for line in lines if line.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    assert head[:5] == ["model", "size", "backend", "test", "t/s"]
    assert {"TTFT ms", "GB/s", "% copy BW", "peak VRAM", "HF t/s", "ours/HF"} <= set(head)
    assert len(table) == 2 + 2  # header, rule, two tests
    tg = dict(zip(head, [c.strip() for c in table[3].strip("|").split("|")]))
    assert tg["test"] == "tg128" and tg["t/s"] == "250.00 ± 2.00" and tg["% copy BW"] == "83.7"
    assert tg["model"] == "synthetic qwen3.8-27b groupwise-int" and tg["size"] == "15.00 GiB"
    assert tg["ours/HF"] == "38.46x" and tg["TTFT ms"] == "-"
    assert len({len(row) for row in table}) == 1  # columns are aligned


def test_markdown_shows_varied_engine_settings_only():
    plain = render(_report(), "md")
    assert "| kv" not in plain and "lanes" not in plain
    varied = render(_report(instances=(Instance("bf16"), Instance("int8"))), "md")
    head = [c.strip() for c in [ln for ln in varied.splitlines() if ln.startswith("|")][0].strip("|").split("|")]
    assert "kv" in head and "lanes" not in head


def test_jsonl_one_self_describing_line_per_result():
    lines = render(_report(baseline=True), "jsonl").splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 4
    assert all(r["schema"] == SCHEMA and r["gpu"] == "NVIDIA H200" for r in rows)
    assert [r["engine"] for r in rows] == ["ninfer", "ninfer", "transformers", "transformers"]


def test_csv_round_trips_samples():
    rows = list(csv.DictReader(io.StringIO(render(_report(), "csv"))))
    assert [r["test"] for r in rows] == ["pp512", "tg128"]
    assert [float(x) for x in rows[0]["samples_ts"].split(";")] == [10000.0, 10100.0, 9900.0]
    assert float(rows[1]["avg_ts"]) == pytest.approx(250.0)
    assert rows[1]["driver"] == "580.159.03" and rows[1]["synthetic"] == "qwen3.8-27b"


def test_every_format_renders():
    for fmt in FORMATS:
        assert render(_report(baseline=True), fmt).endswith("\n")


def test_git_commit_takes_the_named_commit_of_a_copy(monkeypatch):
    """A copy of the checkout on another machine names its commit (NINFER_GIT_COMMIT), whatever `.git` it carries."""
    from engine import bench_device

    monkeypatch.setenv("NINFER_GIT_COMMIT", "d42ed1f")
    assert bench_device.git_commit() == "d42ed1f"
    monkeypatch.delenv("NINFER_GIT_COMMIT")
    assert bench_device.git_commit() not in ("", "d42ed1f")
