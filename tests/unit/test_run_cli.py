"""`ninfer run`, the plain REPL and ChatSession on a scripted engine (no model, no download)."""
import io
import json
import threading

import pytest
from typer.testing import CliRunner

from engine.generate import GenerationConfig, Response
from engine.text.chat_template import ChatTemplate
from engine.text.reasoning import THINKING_BUDGET_CLOSE
from engine.text.session import ChatSession
from engine.text.tokenizer import Tokenizer, build_bpe_json, bytes_to_unicode

QWENISH = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant\n"
           "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
           "{% else %}<think>\n{% endif %}{% endif %}")


def _tokenizer():
    spell = bytes_to_unicode()
    vocab = {spell[b]: b for b in range(256)}
    specials = [(256, "<|im_start|>", True), (257, "<|im_end|>", True)]
    return Tokenizer.from_json(build_bpe_json(vocab, [], specials, "default"), {"eos_token": "<|im_end|>"})


class ScriptedEngine:
    """Streams a fixed reply byte by byte through the real detokenizer, honouring cancel and max_tokens."""

    def __init__(self, reply: str, after_budget: str = "", endless_reasoning: bool = False):
        self.tokenizer = _tokenizer()
        self.config = {"model_type": "llama"}
        self.reply, self.after_budget, self.endless = reply, after_budget, endless_reasoning
        self.prompts = []
        self.configs = []

    def stream(self, prompt_ids, config, *, cancel=None):
        self.prompts.append(list(prompt_ids))
        self.configs.append(config)
        prompt = self.tokenizer.decode(prompt_ids)
        text = self.after_budget if prompt.endswith(THINKING_BUDGET_CLOSE) else self.reply
        ids = self.tokenizer.encode(text)
        detok = self.tokenizer.detokenizer()
        n = 0
        i = 0
        while True:
            if cancel is not None and cancel.is_set():
                yield Response(detok.flush(), None, generation_tokens=n, finish_reason="cancelled")
                return
            if i >= len(ids):
                if self.endless and not prompt.endswith(THINKING_BUDGET_CLOSE):
                    ids = ids + self.tokenizer.encode("x")
                else:
                    yield Response(detok.flush(), 257, generation_tokens=n, generation_tps=50.0,
                                   finish_reason="stop")
                    return
            n += 1
            tok = ids[i]
            i += 1
            if n == config.max_tokens:
                yield Response(detok.add(tok) + detok.flush(), tok, generation_tokens=n, finish_reason="length")
                return
            yield Response(detok.add(tok), tok, prompt_tokens=len(prompt_ids), generation_tokens=n,
                           prompt_tps=100.0, generation_tps=50.0)


def _session(engine, template=QWENISH, **kw):
    return ChatSession(engine, template=ChatTemplate(template) if template else None, **kw)


def _collect(gen):
    r = c = ""
    final = None
    for d in gen:
        if d.done:
            final = d
        else:
            r, c = r + d.reasoning, c + d.content
    return r, c, final


def test_session_splits_reasoning_and_records_history():
    eng = ScriptedEngine("I recall Paris.</think>\n\nParis é 🙂")
    s = _session(eng)
    r, c, final = _collect(s.send("Capital of France?", GenerationConfig(max_tokens=100)))
    assert (r, c) == ("I recall Paris.", "Paris é 🙂")
    assert final.answer == c and final.answer_reasoning == r and final.finish_reason == "stop"
    assert s.messages[-1] == {"role": "assistant", "content": c, "reasoning_content": r}
    assert final.stats.generation_tokens == len("I recall Paris.</think>\n\nParis é 🙂".encode())
    assert 257 in eng.configs[0].stop_token_ids  # the tokenizer's EOS is always a stop id


def test_session_thinking_off_renders_closed_block():
    eng = ScriptedEngine("Paris")
    s = _session(eng, effort="off")
    _, c, _ = _collect(s.send("q", GenerationConfig()))
    assert c == "Paris"
    assert eng.tokenizer.decode(eng.prompts[0]).endswith("<think>\n\n</think>\n\n")


def test_thinking_budget_forces_close_then_answers():
    eng = ScriptedEngine("hmm", after_budget="Answer.", endless_reasoning=True)
    s = _session(eng, thinking_budget=10)
    r, c, final = _collect(s.send("q", GenerationConfig(max_tokens=200)))
    assert c == "Answer."
    assert r.startswith("hmm") and r.endswith("directly now.")
    assert len(eng.prompts) == 2
    assert eng.tokenizer.decode(eng.prompts[1]).endswith(THINKING_BUDGET_CLOSE)
    assert final.stats.reasoning_tokens >= 10


def test_cancel_stops_the_answer():
    eng = ScriptedEngine("x" * 1000)
    s = _session(eng, template=None)
    cancel = threading.Event()
    seen = 0
    for d in s.send("q", GenerationConfig(max_tokens=5000), cancel):
        seen += 1
        if seen == 5:
            cancel.set()
        if d.done:
            assert d.finish_reason == "cancelled"
    assert seen < 20


def test_tool_calls_parsed_from_answer():
    reply = ("</think>\n\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>")
    s = _session(ScriptedEngine(reply), tools=[{"type": "function", "function": {"name": "add"}}])
    _, _, final = _collect(s.send("q", GenerationConfig()))
    assert final.tool_calls[0]["function"]["name"] == "add"
    assert s.messages[-1]["tool_calls"] == final.tool_calls


@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.setenv("NINFER_HOME", str(tmp_path / "models"))
    from ninfer_cli import model_session

    state = {}

    def fake_open(ref, **kw):
        eng = ScriptedEngine(state.get("reply", "Paris."))
        state["engine"], state["ref"], state["kw"] = eng, ref, kw
        return eng, _session(eng, system=kw.get("system"), effort=kw.get("effort"),
                             thinking_budget=kw.get("thinking_budget")), "fake:latest"

    monkeypatch.setattr(model_session, "open_session", fake_open)
    known = model_session.is_model_ref  # the scripted model names count as models, as stored ones do
    monkeypatch.setattr(model_session, "is_model_ref", lambda text: text in ("fake", "some-model") or known(text))
    from ninfer_cli.main import app

    return CliRunner(), app, state


def test_run_prompt_only_uses_default_model(cli):
    runner, app, state = cli
    state["reply"] = "Let me think.</think>\n\nParis."
    res = runner.invoke(app, ["run", "What is the capital of France?", "--temperature", "0"])
    assert res.exit_code == 0, res.output
    assert res.stdout == "Paris.\n"
    assert "Let me think." in res.stderr and "tok/s" in res.stderr
    assert state["ref"] is None
    assert state["engine"].configs[0].temperature == 0


def test_run_json(cli):
    runner, app, state = cli
    state["reply"] = "why</think>\n\nBecause."
    res = runner.invoke(app, ["run", "fake", "Why?", "--json", "-n", "50", "--seed", "3"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["text"] == "Because." and data["reasoning"] == "why"
    assert data["usage"]["completion_tokens"] == len("why</think>\n\nBecause.".encode())
    assert set(data["timings"]) >= {"time_to_first_token_s", "generation_tokens_per_s", "total_s"}
    assert state["engine"].configs[0].seed == 3 and state["engine"].configs[0].max_tokens == 50


def test_run_reads_stdin_and_system(cli):
    runner, app, state = cli
    res = runner.invoke(app, ["run", "some-model", "-", "--system", "Be brief."], input="From stdin\n")
    assert res.exit_code == 0, res.output
    prompt = state["engine"].tokenizer.decode(state["engine"].prompts[0])
    assert "From stdin" in prompt and "<|im_start|>system\nBe brief.<|im_end|>" in prompt


def test_run_no_prompt_is_an_error(cli):
    runner, app, _ = cli
    res = runner.invoke(app, ["run", "fake", "   "])
    assert res.exit_code == 1
    assert "no prompt" in res.stderr


def test_run_no_think_contradiction_is_usage_error(cli):
    runner, app, _ = cli
    res = runner.invoke(app, ["run", "q?", "--no-think", "-r", "high"])
    assert res.exit_code == 2


def test_repl_commands_and_answers():
    from ninfer_cli.repl import Repl

    eng = ScriptedEngine("hmm</think>\n\nok")
    s = _session(eng)
    out, err = io.StringIO(), io.StringIO()
    repl = Repl(s, GenerationConfig(max_tokens=64), out=out, err=err, interactive=False)
    script = ['hello\n', '/set temperature 0.3\n', '/set top_k 5\n', '/think off\n', '"""multi\n', 'line"""\n',
              '/system Be nice.\n', '/clear\n', '/nonsense\n', '/bye\n', 'never answered\n']
    repl.run(iter(script))
    # With thinking off the prompt closes the block, so a stray </think> from the model is plain content.
    assert out.getvalue() == "ok\nhmm</think>\n\nok\n"
    assert repl.config.temperature == 0.3 and repl.config.top_k == 5
    assert s.think is False and s.system == "Be nice." and s.messages == []
    assert "unknown command" in err.getvalue() and "tokens" in err.getvalue()
    second = eng.tokenizer.decode(eng.prompts[1])
    assert "multi\nline" in second and second.endswith("<think>\n\n</think>\n\n")


def test_repl_bad_set_reports_error():
    from ninfer_cli.repl import Repl

    err = io.StringIO()
    repl = Repl(_session(ScriptedEngine("x")), GenerationConfig(), out=io.StringIO(), err=err, interactive=False)
    repl.run(iter(["/set temperature hot\n", "/set nope 1\n", "/set preserve_thinking on\n"]))
    assert repl.session.preserve_thinking is True
    assert "needs a number" in err.getvalue() and "unknown parameter" in err.getvalue()


def test_run_tools_file_renders_and_prints_calls(cli, tmp_path):
    runner, app, state = cli
    tools = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {}}}]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    state["reply"] = "</think>\n\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n</function>\n</tool_call>"
    res = runner.invoke(app, ["run", "fake", "add 2", "--tools", str(path), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2}'}
    assert data["text"] == ""


def test_run_bad_tools_file(cli, tmp_path):
    runner, app, _ = cli
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = runner.invoke(app, ["run", "fake", "x", "--tools", str(bad)])
    assert res.exit_code == 1 and "cannot read tools" in res.stderr


def test_repl_interactive_prompt_toolkit_history_and_multiline(tmp_path):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from ninfer_cli.repl import Repl

    eng = ScriptedEngine("</think>\n\nok")
    out, err = io.StringIO(), io.StringIO()
    history = tmp_path / "hist"
    with create_pipe_input() as pipe:
        # Esc+Enter inserts a newline; Ctrl+C at the prompt clears the line; Ctrl+D leaves.
        pipe.send_text("first line\x1b\rsecond line\r" "dropped\x03" "/clear\r" "\x04")
        repl = Repl(_session(eng), GenerationConfig(), out=out, err=err, pt_input=pipe, pt_output=DummyOutput(),
                    history_file=history)
        repl.run()
    assert out.getvalue() == "ok\n"
    assert "first line\nsecond line" in eng.tokenizer.decode(eng.prompts[0])
    assert len(eng.prompts) == 1
    assert "first line" in history.read_text() and "/clear" in history.read_text()


def test_repl_survives_a_user_error():
    from engine.errors import NinferError
    from ninfer_cli.repl import Repl

    class Full(ScriptedEngine):
        def stream(self, prompt_ids, config, *, cancel=None):
            raise NinferError("context full: 9000 tokens > 8192", "start a new chat (/clear)")
            yield  # pragma: no cover

    err = io.StringIO()
    repl = Repl(_session(Full("x")), GenerationConfig(), out=io.StringIO(), err=err, interactive=False)
    repl.run(iter(["hello\n", "/clear\n"]))
    assert "error: context full" in err.getvalue() and "conversation cleared" in err.getvalue()


def test_run_think_flag_reaches_the_session(cli):
    runner, app, state = cli
    res = runner.invoke(app, ["run", "q?", "--think"])
    assert res.exit_code == 0, res.output
    assert state["kw"]["think"] is True and state["kw"]["effort"] is None
    res = runner.invoke(app, ["run", "q?", "-r", "low"])
    assert state["kw"]["think"] is True and state["kw"]["effort"] == "low"
    res = runner.invoke(app, ["run", "q?", "--no-think"])
    assert state["kw"]["think"] is False and state["kw"]["effort"] == "off"


def test_run_warns_when_the_model_cannot_think(cli, monkeypatch):
    from ninfer_cli import model_session

    runner, app, state = cli
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"

    def no_think_open(ref, **kw):
        eng = ScriptedEngine("ok")
        return eng, _session(eng, template=plain, effort=kw.get("effort"),
                             thinking_budget=kw.get("thinking_budget")), "plain:latest"

    monkeypatch.setattr(model_session, "open_session", no_think_open)
    res = runner.invoke(app, ["run", "q?", "-r", "low"])
    assert res.exit_code == 0 and "no thinking mode" in res.stderr
    res = runner.invoke(app, ["run", "q?", "--thinking-budget", "64"])  # a budget alone: the same one note
    assert res.exit_code == 0 and res.stderr.count(model_session.NO_THINKING) == 1
    res = runner.invoke(app, ["run", "q?"])
    assert "no thinking mode" not in res.stderr


def test_tool_call_xml_is_held_back_from_the_stream():
    call = "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    s = _session(ScriptedEngine("</think>\n\nLet me add." + call), tools=[{"type": "function"}])
    _, streamed, final = _collect(s.send("q", GenerationConfig()))
    assert streamed == "Let me add." and final.answer == "Let me add." and len(final.tool_calls) == 1


def test_malformed_tool_call_is_released_as_content():
    bad = "</think>\n\nSee <tool_call>\n<function=bad name>\n</function>\n</tool_call>"
    s = _session(ScriptedEngine(bad), tools=[{"type": "function"}])
    _, streamed, final = _collect(s.send("q", GenerationConfig()))
    assert streamed == final.answer == bad.split("\n\n", 1)[1] and final.tool_calls == []


def test_run_chat_template_override(cli, tmp_path):
    runner, app, state = cli
    tpl = tmp_path / "t.jinja"
    tpl.write_text("CUSTOM {{ messages[-1].content }} ->")
    res = runner.invoke(app, ["run", "fake", "hello", "--chat-template", str(tpl)])
    assert res.exit_code == 0, res.output
    assert state["engine"].tokenizer.decode(state["engine"].prompts[0]) == "CUSTOM hello ->"
    tpl.write_text("{% if %}")
    res = runner.invoke(app, ["run", "fake", "hello", "--chat-template", str(tpl)])
    assert res.exit_code == 1 and "does not compile" in res.stderr


def test_prefill_chunk_flag_reaches_the_session(cli):
    runner, app, state = cli
    res = runner.invoke(app, ["run", "fake", "Hi?", "--prefill-chunk", "64", "--temperature", "0"])
    assert res.exit_code == 0, res.output
    assert state["kw"]["prefill_chunk"] == 64
    res = runner.invoke(app, ["run", "fake", "Hi?", "--prefill-chunk", "0"])
    assert res.exit_code != 0  # at least 1


def test_engine_load_takes_the_prefill_chunk():
    import engine
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import random_weights
    from engine.synthetic import TINY_CUDA as cfg

    w = random_weights(ModelArgs.from_config(cfg), seed=1)
    assert engine.load({"config": cfg, "weights": w}, device="cpu", prefill_chunk=16).prefill_chunk == 16
    assert engine.load({"config": cfg, "weights": w}, device="cpu").prefill_chunk == 256
