"""The output-format flags of `ninfer run`/`chat` and `/format` in the REPL and the TUI, without a model: a
rejected schema or grammar fails before any model loads, with one error and exit 1."""
import io
import json

import pytest
import typer
from typer.testing import CliRunner

from engine.constraints import Constraint
from engine.errors import NinferError
from engine.generate import GenerationConfig
from ninfer_cli.main import app
from ninfer_cli.options import format_arg, output_constraint, parse_format


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: the flags must be refused before that."""
    from ninfer_cli import model_session

    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(model_session, "open_session", refuse)
    monkeypatch.setattr(model_session, "resolve_model", refuse)


@pytest.mark.parametrize("cmd", ["run", "chat"])
@pytest.mark.parametrize("flags, needle", [
    (["--json-schema", '{"type": "integer", "minimum": 5, "maximum": 3}'], "cannot be satisfied"),
    (["--json-schema", '{"type": "array", "uniqueItems": true}'], "uniqueItems"),
    (["--json-schema", "{oops"], "not valid JSON"),
    (["--json-schema", "missing.json"], "cannot read the JSON schema file"),
    (["--regex", "(?<=a)b"], "look-around"),
    (["--grammar", 'start: foo\nfoo: "a" bar'], "unknown name"),
    (["--grammar", 'root ::= ( "x"'], "GBNF"),
    (["--choice", ","], "non-empty"),
])
def test_rejected_format_is_one_error_exit_1(no_model, cmd, flags, needle):
    r = CliRunner().invoke(app, [cmd, *flags, "--plain", "hello"] if cmd == "chat" else [cmd, *flags, "hello"])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and needle in lines[0] and len(lines) <= 2 and "Traceback" not in r.output


def test_two_formats_are_a_usage_error(no_model):
    r = CliRunner().invoke(app, ["run", "--regex", "a+", "--choice", "a,b", "hello"])
    assert r.exit_code == 2 and "contradict" in r.output


def test_flags_to_constraints(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "object", "properties": {"a": {"type": "integer"}}}')
    grammar = tmp_path / "g.lark"
    grammar.write_text('start: "x" | "y"\n')
    assert output_constraint() is None and output_constraint(format="text") is None
    assert output_constraint(format="JSON") == Constraint.json_object()
    assert output_constraint(json_schema=str(schema)) == Constraint.json_schema(schema.read_text())
    assert output_constraint(json_schema='{"type": "string"}') == Constraint.json_schema({"type": "string"})
    assert output_constraint(regex="[0-9]+") == Constraint.regex("[0-9]+")
    assert output_constraint(grammar=str(grammar)) == Constraint.grammar('start: "x" | "y"\n')
    assert output_constraint(grammar='start: "x"') == Constraint.grammar('start: "x"')
    assert output_constraint(choice="yes, no ,maybe") == Constraint.choice(["yes", "no", "maybe"])
    assert output_constraint(choice='["a,b", "c"]') == Constraint.choice(["a,b", "c"])
    with pytest.raises(typer.BadParameter):
        format_arg(format="yaml")
    assert format_arg(regex="a b") == "regex a b" and parse_format("regex a b") == Constraint.regex("a b")
    with pytest.raises(NinferError, match="unknown output format"):
        parse_format("xml")


def test_repl_format_command():
    from engine.text.chat_template import ChatTemplate
    from engine.text.session import ChatSession
    from ninfer_cli.repl import Repl
    from test_run_cli import QWENISH, ScriptedEngine

    err = io.StringIO()
    repl = Repl(ChatSession(ScriptedEngine("x"), template=ChatTemplate(QWENISH)), GenerationConfig(),
                out=io.StringIO(), err=err, interactive=False)
    repl.run(iter(["/format choice red,green\n"]))
    assert repl.config.constraint == Constraint.choice(["red", "green"])
    repl.run(iter(["/format\n", "/format schema {\"type\": \"strin\"}\n"]))
    assert repl.config.constraint == Constraint.choice(["red", "green"])  # a rejected format changes nothing
    repl.run(iter(["/format off\n"]))
    assert repl.config.constraint is None
    text = err.getvalue()
    assert "output format: choice of 2" in text and "error: invalid JSON schema" in text and "free text" in text


def test_tui_format_settings_reach_the_engine():
    from ninfer_cli.tui import slash
    from ninfer_cli.tui.engine_session import EngineSession
    from ninfer_cli.tui.session import ChatSettings

    assert slash.parse("/format regex [a-z]+ [0-9]") == ("/format", ["regex [a-z]+ [0-9]"])
    assert "/format json" in slash.complete("/format j")
    settings = ChatSettings(format="choice yes,no")
    assert ChatSettings.from_dict(json.loads(json.dumps(settings.to_dict()))).format == "choice yes,no"

    class Chat:
        template = think = effort = thinking_budget = engine = None

        def set_reasoning(self, **kw):
            pass

        class tokenizer:
            @staticmethod
            def encode(text, add_special=False):
                return [1, 2]

        def render(self, messages):
            return "q"

        def stream_ids(self, ids, config, cancel, in_thinking=False):
            self.config = config
            return iter(())

    session = EngineSession("m.ninfer", "m")
    session.chat = Chat()
    list(session.send([{"role": "user", "content": "q"}], settings, None))
    assert session.chat.config.constraint == Constraint.choice(["yes", "no"])
