"""Shared options: parsing, reasoning flags, sampling overrides, model-name completion."""
from __future__ import annotations

from typing import Optional

import pytest
import typer
from typer.testing import CliRunner

from ninfer_cli import options as o
from ninfer_cli.store import Store

app = typer.Typer()


@app.command()
def probe(
    model: o.ModelArg = None,
    temperature: o.Temperature = None,
    top_k: o.TopK = None,
    top_p: o.TopP = None,
    min_p: o.MinP = None,
    presence_penalty: o.PresencePenalty = None,
    frequency_penalty: o.FrequencyPenalty = None,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    effort: o.Effort = None,
    think: o.Think = None,
    thinking_budget: o.ThinkingBudget = None,
    ctx: o.Ctx = None,
    device: o.DeviceOpt = o.Device.auto,
) -> None:
    flags = o.sampling_overrides(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                 presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                 seed=seed, max_tokens=max_tokens)
    choice: Optional[o.ReasoningEffort] = o.reasoning_choice(effort, think)
    print(sorted(flags.items()), choice and choice.value, thinking_budget, ctx, device.value, model)


runner = CliRunner()


def run(*args, env=None):
    return runner.invoke(app, list(args), env=env or {"NINFER_DEVICE": ""})


def test_nothing_given_means_model_defaults():
    r = run()
    assert r.exit_code == 0 and r.stdout.strip() == "[] None None None auto None"


def test_every_flag_spelling():
    r = run("m", "--temp", "0", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.05", "--presence-penalty", "1.5",
            "--frequency-penalty", "-0.5", "--seed", "7", "-n", "64", "-r", "HIGH", "--think", "--thinking-budget", "0",
            "-c", "32k", "--device", "GPU")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == ("[('frequency_penalty', -0.5), ('max_tokens', 64), ('min_p', 0.05), "
                                "('presence_penalty', 1.5), ('seed', 7), ('temperature', 0.0), ('top_k', 20), "
                                "('top_p', 0.9)] high 0 32768 gpu m")


@pytest.mark.parametrize("args", [["--temp", "-1"], ["--top-p", "1.5"], ["-n", "0"], ["-r", "max"], ["--ctx", "lots"],
                                  ["--ctx", "8"], ["--device", "tpu"], ["--no-think", "-r", "low"], ["--think", "-r", "off"]])
def test_bad_values_are_usage_errors(args):
    r = run(*args)
    assert r.exit_code == 2, (args, r.output)


def test_no_think_means_off_and_device_env():
    assert run("--no-think").stdout.split()[1] == "off"
    assert run(env={"NINFER_DEVICE": "cpu"}).stdout.split()[-2] == "cpu"


@pytest.mark.parametrize(("text", "value"), [("auto", None), ("0", None), ("4096", 4096), ("32k", 32768),
                                             ("128K", 131072), ("1.5k", 1536), (None, None), (2048, 2048)])
def test_parse_ctx(text, value):
    assert o.parse_ctx(text) == value


def test_complete_model_lists_installed_names(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path))
    src = tmp_path / "a.ninfer"
    for ref in ("qwen38-27b", "qwen38-27b:q8", "smollm2-135m"):
        src.write_bytes(b"x")
        Store().add(ref, src, source="t")
    assert o.complete_model("QWEN") == ["qwen38-27b", "qwen38-27b:latest", "qwen38-27b:q8"]
    assert o.complete_model("zz") == []
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "a.ninfer" / "not-a-dir"))
    assert o.complete_model("") == []
