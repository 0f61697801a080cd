"""`ninfer bench` through CliRunner: bad flags, the roofline store, and an end-to-end tiny run."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from engine import bench_device
from ninfer_cli import main as cli

runner = CliRunner()


def invoke(*args):
    return runner.invoke(cli.app, ["bench", *args], prog_name="ninfer")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A private NINFER_HOME with a stored CPU roofline, so no test pays for measuring one."""
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.setenv("NINFER_DEVICE", "cpu")
    env = bench_device.environment("cpu")
    bench_device.store_roofline(env, {"copy_gbps": 10.0, "matmul_tflops": 0.1, "matmul_dtype": "float32",
                                      "measured_at": "test"})
    return tmp_path


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--synthetic", "tiny", "-p", "abc"], "-p"),
        (["--synthetic", "tiny", "-n", "5-1"], "-n"),
        (["--synthetic", "tiny", "-pg", "512"], "PROMPT,GEN"),
        (["--synthetic", "tiny", "--kv", "fp8"], "bf16, int8"),
        (["--synthetic", "tiny", "--lanes", "0"], "at least 1"),
        (["--synthetic", "tiny", "-r", "0"], "-r"),
        (["--synthetic", "tiny", "-o", "xml"], "xml"),
        (["--synthetic", "tiny", "-p", "0", "-n", "0"], "nothing to run"),
        (["model.ninfer", "--synthetic", "tiny"], "not both"),
        (["--synthetic", "tiny", "--baseline", "vllm"], "vllm"),
        (["--synthetic", "tiny", "--spec", "mtp:9"], "1..5"),
        (["--synthetic", "tiny", "--spec", "eagle"], "--spec mtp:K"),
        (["--synthetic", "tiny", "--spec-accept", "0.9"], "give --spec mtp:K too"),
        (["--synthetic", "tiny", "--spec", "mtp:3", "--spec-accept", "0.9,0.8"], "one non-increasing probability"),
        (["--synthetic", "tiny", "--spec", "mtp:2", "--spec-accept", "0.7,0.8"], "one non-increasing probability"),
        (["--synthetic", "tiny", "--spec", "mtp:1", "--spec-accept", "1.5"], "one non-increasing probability"),
        (["--synthetic", "tiny", "--spec", "mtp:1,mtp:2", "--spec-accept", "0.5"], "one non-increasing probability"),
        (["--synthetic", "tiny", "--spec", "mtp:1", "--spec-accept", "0.5", "--temp", "0.7"], "drop --temp"),
    ],
)
def test_usage_errors_exit_2_and_name_the_flag(args, needle):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert needle in re.sub(r"[\s│]+", " ", r.output)  # (the error box wraps long lines)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--synthetic", "qwen3.8-27b"], "needs a CUDA GPU"),
        (["--synthetic", "qwen3.6-35b-a3b", "--device", "cpu"], "needs a CUDA GPU"),
        (["--synthetic", "llama-7b"], "unknown synthetic geometry"),
        (["--synthetic", "tiny", "--lanes", "2", "-p", "8", "-n", "0", "-r", "1"], "--lanes 2"),
        (["no-such-model", "-p", "8", "-n", "0"], "no-such-model"),
    ],
)
def test_user_errors_exit_1_with_one_line(args, needle):
    r = invoke(*args)
    assert r.exit_code == 1, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert r.output.startswith("error: ")


def test_synthetic_tiny_end_to_end_table():
    r = invoke("--synthetic", "tiny", "-p", "16", "-n", "8", "-r", "2")
    assert r.exit_code == 0, r.output
    table = [line for line in r.stdout.splitlines() if line.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    rows = [dict(zip(head, [c.strip() for c in line.strip("|").split("|")])) for line in table[2:]]
    assert [row["test"] for row in rows] == ["pp16", "tg8"]
    for row in rows:
        mean = float(row["t/s"].split(" ± ")[0])
        assert mean > 0 and row["backend"] == "numpy" and row["model"] == "synthetic tiny float32"
    assert rows[1]["GB/s"] != "-" and rows[1]["% copy BW"] != "-"  # bound columns use the stored roofline
    assert rows[0]["TTFT ms"] != "-" and rows[0]["TFLOP/s"] != "-"
    assert "copy 10.0 GB/s" in r.stdout


def test_json_out_file_keeps_samples_and_command(home):
    path = home / "r" / "tiny.json"
    r = invoke("--synthetic", "tiny", "-p", "8", "-n", "4", "-pg", "8,4", "-d", "0,8", "-r", "2",
               "--warmup", "0", "-o", "json", "--out", str(path), "--no-progress")
    assert r.exit_code == 0, r.output
    assert any(line.startswith("| synthetic tiny") for line in r.stdout.splitlines())  # the table still prints
    data = json.loads(path.read_text())
    assert data["schema"] == "ninfer.bench" and data["schema_version"] == 1
    assert [x["test"] for x in data["results"]] == ["pp8", "tg4", "pp8+tg4", "pp8 @ d8", "tg4 @ d8", "pp8+tg4 @ d8"]
    assert all(len(x["samples_ts"]) == 2 for x in data["results"])
    assert data["command"].startswith("ninfer bench --synthetic tiny --n-prompt 8")
    assert data["model"]["weight_bytes"] > 0 and data["settings"]["repetitions"] == 2


def test_decode_rows_say_which_path_and_sampler_they_timed(home):
    path = home / "r" / "sampled.json"
    r = invoke("--synthetic", "tiny", "-p", "0", "-n", "6", "-r", "2", "--warmup", "0", "--temp", "0.7",
               "--top-k", "20", "--top-p", "0.8", "--presence-penalty", "1.5", "--burst", "-o", "json",
               "--out", str(path), "--no-progress")
    assert r.exit_code == 0, r.output
    assert "decode timed through Engine.stream: temperature 0.7, top_k 20, top_p 0.8, presence_penalty 1.5" in r.stdout
    assert "burst t/s" in r.stdout
    (row,) = json.loads(path.read_text())["results"]
    assert row["path"] == "stream" and row["burst_ts"] > 0
    assert row["sampling"] == {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.0,
                               "presence_penalty": 1.5, "frequency_penalty": 0.0}
    greedy = invoke("--synthetic", "tiny", "-p", "0", "-n", "4", "-r", "1", "--warmup", "0", "-o", "json")
    assert json.loads(greedy.stdout)["results"][0]["sampling"]["temperature"] == 0.0


def test_roofline_alone_measures_and_stores(home, monkeypatch):
    calls = []

    def fake_measure():
        calls.append(1)
        return {"copy_gbps": 12.5, "matmul_tflops": 0.25, "matmul_dtype": "float32"}

    monkeypatch.setattr(bench_device, "measure_cpu", fake_measure)
    r = invoke("--roofline")
    assert r.exit_code == 0, r.output
    assert "copy 12.5 GB/s" in r.stdout and calls == [1]
    stored = json.loads((home / "cache" / "roofline.json").read_text())
    (entry,) = stored.values()
    assert entry["copy_gbps"] == 12.5 and entry["measured_at"]
    roof, measured = bench_device.roofline(bench_device.environment("cpu"))
    assert roof["copy_gbps"] == 12.5 and not measured and calls == [1]  # used from the store, not remeasured


def test_measure_cpu_small():
    roof = bench_device.measure_cpu(copy_mib=8, n=128, reps=2)
    assert roof["copy_gbps"] > 0.1 and roof["matmul_tflops"] > 1e-5 and roof["matmul_dtype"] == "float32"


def test_bench_is_in_the_benchmark_panel():
    r = runner.invoke(cli.app, ["--help"], prog_name="ninfer")
    assert "Benchmark" in r.stdout and " bench " in r.stdout


def test_missing_baseline_fails_before_running(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    r = invoke("--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--baseline", "transformers")
    assert r.exit_code == 1 and "torch" in r.output and "pp8" not in r.output


def test_a_failing_baseline_keeps_our_results(monkeypatch):
    from engine import bench_baseline, bench_run

    monkeypatch.setattr(bench_baseline, "check_available", lambda: None)
    monkeypatch.setattr(bench_baseline, "preload", lambda cfg: None)  # (torch and transformers "there")

    def boom(*a, **k):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(bench_run, "_run_baseline", boom)
    r = invoke("--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--baseline", "transformers", "-o", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["baseline"]["error"] == "RuntimeError: CUDA out of memory"
    assert [x["test"] for x in data["results"]] == ["pp8"]


def test_a_baseline_import_failure_is_caught_early_and_named(monkeypatch):
    """The baseline's imports run before our engines (preload); their failure is reported after our
    results, a SyntaxError with the file it read."""
    from engine import bench_baseline

    monkeypatch.setattr(bench_baseline, "check_available", lambda: None)
    calls = []

    def junk(cfg):
        calls.append(cfg)
        raise SyntaxError("source code string cannot contain null bytes", ("/x/torch/_utils_internal.py", 13, 0, ""))

    monkeypatch.setattr(bench_baseline, "preload", junk)
    r = invoke("--synthetic", "tiny", "-p", "8", "-n", "0", "-r", "1", "--baseline", "transformers", "-o", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert len(calls) == 1 and [x["test"] for x in data["results"]] == ["pp8"]
    assert data["baseline"]["error"] == ("SyntaxError: source code string cannot contain null bytes "
                                         "(reading /x/torch/_utils_internal.py)")


def test_ctrl_c_reports_the_finished_tests_and_exits_130(monkeypatch):
    from engine import bench_run

    real = bench_run.run_test

    def stop_at_tg(engine, test, *a, **k):
        if test.kind == "tg":
            raise KeyboardInterrupt
        return real(engine, test, *a, **k)

    monkeypatch.setattr(bench_run, "run_test", stop_at_tg)
    r = invoke("--synthetic", "tiny", "-p", "8", "-n", "4", "-r", "1", "-o", "json")
    assert r.exit_code == 130
    data = json.loads(r.stdout)
    assert data["settings"]["interrupted"] is True and [x["test"] for x in data["results"]] == ["pp8"]


def test_environment_records_the_engine_switches(monkeypatch):
    monkeypatch.setenv("NINFER_PLAN", '{"branches": false}')
    env = bench_device.environment("cpu")
    assert env["engine_env"].get("NINFER_PLAN") == '{"branches": false}'
    assert "NINFER_HOME" not in env["engine_env"] and "NINFER_DEVICE" not in env["engine_env"]


def _rows(stdout: str) -> list[dict]:
    table = [line for line in stdout.splitlines() if line.startswith("|")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    return [dict(zip(head, [c.strip() for c in line.strip("|").split("|")])) for line in table[2:]]


def test_spec_with_forced_acceptance_beside_the_plain_rows(home):
    """`--spec off,mtp:3 --spec-accept ...` on tiny (random weights with an MTP head): the spec row says the
    acceptance was forced, measures it per position, and keeps greedy identity; JSON rows carry the counters."""
    path = home / "r" / "spec.json"
    r = invoke("--synthetic", "tiny", "-p", "0", "-n", "48", "-r", "3", "--warmup", "0", "--spec", "off,mtp3",
               "--spec-accept", "0.9,0.6,0.3", "-o", "json", "--out", str(path), "--no-progress")
    assert r.exit_code == 0, r.output
    assert "acceptance forced 0.9/0.6/0.3 per draft position" in r.stdout
    plain, spec = _rows(r.stdout)
    assert (plain["spec"], spec["spec"]) == ("off", "mtp:3") and plain["tok/round"] == "-"
    assert float(spec["tok/round"]) > 1.5 and float(spec["round ms"]) > 0 and spec["vs plain"].endswith("x")
    off, row = json.loads(path.read_text())["results"]
    assert "rounds" not in off and row["spec_forced"] == [0.9, 0.6, 0.3] and row["greedy_identity"] == "checked"
    assert row["drafted"] == 3 * row["rounds"] and sum(row["accepted_per_position"]) == row["accepted"]
    at = row["acceptance_per_position"]
    assert at == [a / row["rounds"] for a in row["accepted_per_position"]]
    assert at[0] > at[2] and abs(at[0] - 0.9) < 0.2 and abs(at[2] - 0.3) < 0.2  # ~50 rounds: loose
    assert row["tokens_per_round"] == 1 + row["accepted"] / row["rounds"]
    assert row["speedup"] == row["avg_decode_ts"] / off["avg_decode_ts"]


def test_spec_with_the_mtp_head_reports_its_rounds():
    r = invoke("--synthetic", "tiny", "-p", "8", "-n", "6", "-pg", "8,6", "-d", "0,8", "-r", "1", "--warmup", "0",
               "--spec", "mtp:2", "-o", "json", "--no-progress")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["results"]
    assert [x["test"] for x in rows] == ["pp8", "tg6", "pp8+tg6", "pp8 @ d8", "tg6 @ d8", "pp8+tg6 @ d8"]
    for x in rows:
        assert x["spec"] == "mtp:2"
        if x["n_gen"]:
            assert x["rounds"] > 0 and x["drafted"] == 2 * x["rounds"] and x["spec_forced"] is None
            assert x["rounds"] + x["accepted"] + x["plain_steps"] == 6  # every decoded token came from a round
        else:
            assert "rounds" not in x


def test_a_speculative_output_that_differs_from_plain_greedy_is_an_error_row(monkeypatch):
    import engine.bench as B

    real = B.spec_oracle

    def wrong(engine, test, tokens, k):
        oracle = list(real(engine, test, tokens, k))
        oracle[5] = (oracle[5] + 1) % 2048
        return tuple(oracle)

    monkeypatch.setattr(B, "spec_oracle", wrong)
    r = invoke("--synthetic", "tiny", "-p", "0", "-n", "12", "-r", "1", "--warmup", "0", "--spec", "mtp:2",
               "--spec-accept", "1,1")
    assert r.exit_code == 1
    (row,) = _rows(r.stdout)
    assert row["t/s"] == "error (below)"
    assert "error: tg12 spec=mtp:2: greedy identity broken: speculative token 5 is" in r.stdout
