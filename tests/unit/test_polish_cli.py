"""The command line as a newcomer meets it: unquoted prompts, the default model everywhere, help that fits
80 columns, the sampling preset from the model's card (and its example answered right), asking before a
GPU model's download on a machine that cannot run it, and a convert bar with bytes and rate. (The note for
`--thinking-budget` on a model without thinking is tested with the others in test_run_cli.py.)"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ninfer_cli.main import app
from test_run_cli import cli  # noqa: F401  (the scripted `ninfer run` fixture)

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args, **kw):
    return runner.invoke(app, [str(a) for a in args], prog_name="ninfer", **kw)


# ---- item 3: unquoted words are one prompt

def test_run_joins_unquoted_words_into_the_prompt(cli):  # noqa: F811
    runner_, app_, state = cli
    res = runner_.invoke(app_, ["run", "What", "is", "the", "capital", "of", "France?", "-n", "8"])
    assert res.exit_code == 0, res.output
    assert state["ref"] is None  # the first word is not a model: the default model answers
    prompt = state["engine"].tokenizer.decode(state["engine"].prompts[0])
    assert "What is the capital of France?" in prompt
    res = runner_.invoke(app_, ["run", "some-model.ninfer", "Why", "not?"])
    assert state["ref"] == "some-model.ninfer"
    assert "Why not?" in state["engine"].tokenizer.decode(state["engine"].prompts[0])
    res = runner_.invoke(app_, ["run", "qwen38-27", "hello", "there"])  # a near miss stays the model
    assert state["ref"] == "qwen38-27"
    res = runner_.invoke(app_, ["run", "hello", "there"])
    assert state["ref"] is None and "hello there" in state["engine"].tokenizer.decode(state["engine"].prompts[0])


# ---- item 7: --help at 80 columns

@pytest.mark.parametrize("command", ["run", "chat", "bench", "pull", "show", "convert"])
def test_help_at_80_columns_keeps_option_names_whole_and_no_bool(command):
    res = invoke(command, "--help", env={"COLUMNS": "80"})  # CliRunner's width is 80 as well
    assert res.exit_code == 0, res.output
    assert "…" not in res.stdout and "<bool>" not in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    import click

    for param in _commands()[command].params:
        if isinstance(param, click.Option):
            for name in param.opts + param.secondary_opts:  # every spelling appears whole
                assert re.search(rf"(^|[\s,]){re.escape(name)}([\s,]|$)", res.stdout, re.M), name


def _commands():
    import typer.main

    return typer.main.get_command(app).commands


def test_help_shows_value_types_only_for_options_that_take_a_value():
    out = invoke("run", "--help").stdout
    assert re.search(r"--reasoning-effort, -r\s+<off\|low\|medium\|high>", out)
    assert re.search(r"--temperature, --temp\s+<float>", out)
    assert re.search(r"--json\s+Print one JSON object", out)  # a flag: no type at all
    assert re.search(r"--think\s.*\n.*--no-think", out)


# ---- item 8: bench without a model benchmarks the default one

def test_bench_without_a_model_uses_the_default_model(tmp_path, monkeypatch):
    from engine import bench_device, bench_run
    from ninfer_cli import model_session

    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.setenv("NINFER_DEVICE", "cpu")
    bench_device.store_roofline(bench_device.environment("cpu"),
                                {"copy_gbps": 10.0, "matmul_tflops": 0.1, "matmul_dtype": "float32", "measured_at": "t"})
    asked = {}
    monkeypatch.setattr(model_session, "resolve_model", lambda ref, **kw: (tmp_path / "smol.ninfer", ref))

    def fake_bench(**kw):
        asked.update(kw)
        raise SystemExit(0)

    monkeypatch.setattr(bench_run, "run_bench", fake_bench)
    res = invoke("bench", "-p", "8", "-n", "4", "-r", "1")
    assert res.exit_code == 0, res.output
    assert asked["model"] == model_session.DEFAULT_MODEL
    assert asked["model_path"] == tmp_path / "smol.ninfer"
    assert "default model" in res.stderr


# ---- item 2: the preset comes from the model's card, shows in `ninfer show`, and answers its example

def test_smollm2_preset_is_its_cards_and_show_prints_it(tmp_path, monkeypatch):
    import numpy as np

    from engine.artifact.container import write_artifact
    from engine.text.presets import preset_source, sampling_preset
    from ninfer_cli.store import Store

    assert sampling_preset({"model_type": "llama"}, False) == {"temperature": 0.2, "top_p": 0.9}
    assert "SmolLM2" in preset_source({"model_type": "llama"})
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "store"))
    for mtype, template in (("llama", "{{ messages }}"), ("qwen3_5_text", "{% if enable_thinking %}<think>{% endif %}")):
        config = {"architectures": ["X"], "model_type": mtype, "num_hidden_layers": 1, "hidden_size": 8,
                  "vocab_size": 16}
        w = np.ones((16, 8), np.float32)
        src = write_artifact(tmp_path / f"{mtype}.ninfer",
                             {"text": {"config": config, "resources": {"chat_template.jinja": "tmpl"}}},
                             [("text/embed", "fp32", "contiguous_le_v1", w.shape, w)], {"tmpl": template.encode()})
        Store().add(mtype.replace("_", "-"), src, source="test")
    out = invoke("show", "llama").stdout
    assert re.search(r"^sampling\s+temperature 0\.2, top-p 0\.9  \(from the SmolLM2-135M-Instruct model card\)$",
                     out, re.M), out
    out = invoke("show", "qwen3-5-text").stdout
    assert re.search(r"^sampling \(thinking\)\s+temperature 1, top-p 0\.95, top-k 20", out, re.M), out
    assert re.search(r"^sampling \(no thinking\)\s+temperature 0\.7, .*presence penalty 1\.5$", out, re.M), out
    import json

    data = json.loads(invoke("show", "llama", "--json").stdout)["model"]["sampling"]
    assert data["modes"] == {"default": {"temperature": 0.2, "top_p": 0.9}}


def _help_example() -> str:
    from ninfer_cli.commands.run import run

    found = re.search(r"`ninfer run ([^`]+)`", run.__doc__)
    return found.group(1).strip('"')


@pytest.mark.slow
def test_the_help_example_is_answered_right_by_the_default_model_for_9_of_10_seeds():
    from ninfer_cli.model_session import DEFAULT_MODEL, generation_config, open_session
    from ninfer_cli.store import Store

    found = Store().find(DEFAULT_MODEL)
    if found is None or not found.artifact_path.exists():
        pytest.skip("the default model is not in the store (ninfer pull smollm2-135m)")
    prompt = _help_example()
    assert "capital of France" in prompt
    _, chat, _ = open_session(str(found.artifact_path), device="cpu", quiet=True)
    right = 0
    for seed in range(10):
        chat.clear()
        config = generation_config(chat, {"seed": seed, "max_tokens": 12})  # the preset `ninfer run` uses
        right += "paris" in "".join(d.content for d in chat.send(prompt, config) if not d.done).lower()
    assert right >= 9, right


# ---- item 11: a GPU model on a machine that cannot run it

@pytest.fixture
def no_gpu(tmp_path, monkeypatch):
    from ninfer_cli import catalog
    from ninfer_cli.commands import pull

    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    monkeypatch.setattr(catalog, "gpu_memory", lambda: None)
    monkeypatch.setattr(pull, "_local_candidates", lambda entry: [])
    started = []
    monkeypatch.setattr(pull, "_download", lambda *a, **k: started.append(a[2]) or None)
    return started


def test_pull_of_a_gpu_model_without_a_gpu_needs_a_yes(no_gpu):
    res = invoke("pull", "qwen38-27b")  # no terminal: nothing is asked, nothing downloaded
    assert res.exit_code == 1 and no_gpu == []
    assert "needs an NVIDIA GPU with ≈" in res.stderr and "GiB of memory at 8K context" in res.stderr
    assert "no NVIDIA GPU was found" in res.stderr and "--yes" in res.stderr
    res = invoke("pull", "qwen38-27b", "--yes")
    assert res.exit_code == 0, res.output
    assert no_gpu == ["qwen38-27b:latest"] and "downloading 19.0 GB anyway" in res.stderr


def test_pull_asks_at_a_terminal(no_gpu, monkeypatch):
    from ninfer_cli import output
    from ninfer_cli.commands import pull

    monkeypatch.setattr(pull, "_interactive", lambda: True)
    answers = iter([False, True])
    monkeypatch.setattr(output, "confirm", lambda question, **kw: next(answers))
    res = invoke("pull", "qwen38-27b")
    assert res.exit_code == 1 and no_gpu == [] and "nothing was downloaded" in res.stderr
    assert "needs an NVIDIA GPU" in res.stderr and "--yes" in res.stderr
    res = invoke("pull", "qwen38-27b")
    assert res.exit_code == 0, res.output
    assert no_gpu == ["qwen38-27b:latest"]


# ---- item 10: convert shows bytes and rate

def test_convert_bar_has_bytes_and_rate(tmp_path):
    res = invoke("convert", ROOT / "tests" / "fixtures" / "artifact" / "hf_moe", "-o", tmp_path / "m.ninfer",
                 "--recipe", "q8", env={"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", res.stderr)
    assert re.search(r"importing checkpoint .*\b602\.0/602\.0 kB \d+(\.\d+)? [kMG]?B/s", plain), plain


def test_the_writer_reports_its_total_before_the_first_tensor(tmp_path):
    import numpy as np

    from engine.artifact.container import write_artifact

    seen = []
    w = np.ones((64, 8), np.float32)
    write_artifact(tmp_path / "t.ninfer", {"text": {"config": {}}},
                   [("a", "fp32", "contiguous_le_v1", w.shape, w), ("b", "fp32", "contiguous_le_v1", w.shape, w)],
                   progress=lambda done, total, name: seen.append((done, total)))
    assert seen[0] == (0, 2 * w.nbytes) and seen[-1] == (2 * w.nbytes, 2 * w.nbytes)
