"""`--spec off|mtp:K` on run, chat and serve: parsed at the command line, refused with the next action where the
engine or the model cannot speculate (the rounds themselves: tests/model/test_speculative.py)."""
import types

import pytest
from typer.testing import CliRunner

from engine.errors import NinferError
from engine.speculative import check_spec
from ninfer_cli import main as cli


@pytest.mark.parametrize("cmd", ["run", "chat", "serve"])
def test_a_bad_spec_is_a_usage_error(cmd):
    r = CliRunner().invoke(cli.app, [cmd, "--spec", "mtp:9", "hello"], prog_name="ninfer")
    assert r.exit_code == 2 and "1..5" in r.output


def test_which_engines_can_speculate():
    numpy_mtp = types.SimpleNamespace(device="cpu", model=types.SimpleNamespace(mtp_layer=object()))
    assert check_spec(numpy_mtp, "mtp:2") == ("mtp", 2) and check_spec(numpy_mtp, None) == ("off", 0)
    with pytest.raises(NinferError, match="needs a model with an MTP head"):
        check_spec(types.SimpleNamespace(device="cpu", model=types.SimpleNamespace(mtp_layer=None)), "mtp:3")
    def cuda(moe=False, mtp=True):
        model = types.SimpleNamespace(args=types.SimpleNamespace(is_moe=moe), mtp_weights={"mtp/fc": 0} if mtp else {})
        return types.SimpleNamespace(device="gpu", model=model, speculator=lambda k: None)

    assert check_spec(cuda(), "mtp:3") == ("mtp", 3) and check_spec(cuda(moe=True), "mtp:2") == ("mtp", 2)
    with pytest.raises(NinferError, match="needs a model with an MTP head"):
        check_spec(cuda(mtp=False), "mtp:3")


@pytest.fixture(scope="module")
def tiny_mtp():
    """The bench's tiny Qwen3.5 (random weights with an MTP head) on NumPy, with the stand-in tokenizer."""
    from engine import synthetic
    from engine.bench import Instance
    from engine.bench_models import build_tiny

    eng = build_tiny("cpu", 512, Instance())
    eng.tokenizer = synthetic.tokenizer(eng.args.vocab_size)
    return eng


def _run_json(monkeypatch, engine, *flags):
    import json

    from engine.text.session import ChatSession
    from ninfer_cli import model_session

    monkeypatch.setattr(model_session, "open_session", lambda *a, **k: (engine, ChatSession(engine), "tiny"))
    r = CliRunner().invoke(cli.app, ["run", "--json", "--temperature", "0", "-n", "12", *flags, "hello"],
                           prog_name="ninfer")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_run_json_carries_the_rounds_of_a_speculative_answer(monkeypatch, tiny_mtp):
    plain = _run_json(monkeypatch, tiny_mtp)
    out = _run_json(monkeypatch, tiny_mtp, "--spec", "mtp:2")
    assert "spec" not in plain and out["text"] == plain["text"]  # greedy: the same answer
    spec = out["spec"]
    assert spec["k"] == 2 and spec["rounds"] > 0 and spec["drafted"] == 2 * spec["rounds"]
    assert len(spec["accepted_per_position"]) == 2 and sum(spec["accepted_per_position"]) == spec["accepted"]
    # every token after the first came from a round: t and its accepted drafts (or a plain step at the edge)
    assert spec["rounds"] + spec["accepted"] + spec["plain_steps"] == out["usage"]["completion_tokens"] - 1
    assert spec["tokens_per_round"] == 1 + spec["accepted"] / spec["rounds"]


def test_turn_stats_add_up_the_streams_of_a_turn_and_reach_the_request_log():
    from engine.speculative import SpecStats
    from engine.text.session import Delta, TurnStats
    from ninfer_cli.serve.logs import usage_of

    spec = (SpecStats(3, 6, 4, 2, [2, 1, 1]) + SpecStats(3, 3, 3, 1, [1, 1, 1])).as_dict()
    stats = TurnStats(prompt_tokens=5, generation_tokens=11, generation_tps=40.0, total_s=1.0, spec=spec)
    assert "mtp:3 acceptance 78% 3.33 tok/round" in stats.line()
    run = types.SimpleNamespace(final=Delta(done=True, finish_reason="stop", stats=stats),
                                prepared=types.SimpleNamespace(prepare_s=0.0), queued_s=0.0)
    logged = usage_of(run)["spec"]
    assert logged["accepted_per_position"] == [3, 2, 2] and logged["rounds"] == 3 and logged["drafted"] == 9
    assert "spec" not in usage_of(types.SimpleNamespace(final=Delta(done=True, stats=TurnStats()),
                                                        prepared=run.prepared, queued_s=0.0))


def test_a_stream_that_decoded_plainly_says_why_on_the_answer_line():
    from engine.speculative import SpecStats
    from engine.text.session import TurnStats

    spec = SpecStats(3, plain_why="an output constraint decodes plainly").as_dict()
    assert spec["plain"] == "an output constraint decodes plainly" and "plain" not in SpecStats(3).as_dict()
    line = TurnStats(generation_tokens=4, spec=spec).line()
    assert "mtp:3 off: an output constraint decodes plainly" in line and "acceptance" not in line


def test_chat_takes_spec_into_the_app(monkeypatch):
    """In a terminal `ninfer chat --spec mtp:2` opens the app with speculation in its settings (no --plain needed)."""
    import sys

    from ninfer_cli.tui import launch

    seen = {}
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(launch, "run_chat_tui", lambda model, **kw: seen.update(kw))
    from ninfer_cli.commands.chat import chat

    chat(spec="mtp:2")  # (CliRunner would swap in a stdin that is no terminal)
    assert seen["sampling"]["spec"] == "mtp:2"
    assert launch.settings_from_flags(None, sampling=seen["sampling"]).spec == "mtp:2"
