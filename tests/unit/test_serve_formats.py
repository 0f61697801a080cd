"""`constraint_for`: the structured-output fields of OpenAI Chat Completions, Responses and Anthropic
Messages requests (plain dicts) -> an engine Constraint, or a ConstraintError the server answers with 400."""
import json

import pytest

from engine.constraints import Constraint, ConstraintError
from ninfer_cli.serve_formats import constraint_for

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
                {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": WEATHER},
                   {"type": "web_search"}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": WEATHER},
                   {"type": "web_search_20250305", "name": "web_search"}]


def _functions(c: Constraint) -> set[str]:
    lark = json.loads(c.source)["grammars"][0]["lark_grammar"]
    return {part.split("<function=")[1].split(">")[0] for part in lark.split("\n") if "<function=" in part}


def _single(c: Constraint) -> bool:
    return json.loads(c.source)["grammars"][0]["lark_grammar"].startswith("start: call\n")


@pytest.mark.parametrize("api, fmt", [
    ("openai", {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}),
    ("responses", {"type": "json_schema", "name": "x", "schema": SCHEMA, "strict": True}),
    ("anthropic", {"type": "json_schema", "schema": SCHEMA}),
])
def test_json_schema_in_each_api(api, fmt):
    c = constraint_for(fmt, api=api)
    assert c == Constraint.json_schema(SCHEMA) and not c.lenient


def test_json_object_text_and_nothing():
    assert constraint_for({"type": "json_object"}) == Constraint.json_object()
    assert constraint_for({"type": "json_object"}, api="responses") == Constraint.json_object()
    assert constraint_for({"type": "text"}) is None and constraint_for(None) is None
    assert constraint_for(None, OPENAI_TOOLS, "auto") is None and constraint_for(None, OPENAI_TOOLS, "none") is None


def test_strict_false_is_best_effort_and_strict_refuses():
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": False,
                                                  "schema": {"type": "array", "uniqueItems": True}}}
    assert constraint_for(fmt).lenient
    fmt["json_schema"]["strict"] = True
    with pytest.raises(ConstraintError) as exc:
        constraint_for(fmt)
    assert exc.value.code == "unsupported_json_schema" and "uniqueItems" in exc.value.message
    assert exc.value.param == "response_format.json_schema.schema"


@pytest.mark.parametrize("fmt, code, param", [
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "invalid_response_format", "response_format.json_schema.schema"),
    ({"type": "yaml"}, "invalid_response_format", "response_format"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 3, "maximum": 1}}},
     "unsatisfiable_json_schema", "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": "{broken"}}, "invalid_json_schema",
     "response_format.json_schema.schema"),
])
def test_bad_response_format_names_the_field(fmt, code, param):
    with pytest.raises(ConstraintError) as exc:
        constraint_for(fmt)
    assert (exc.value.code, exc.value.param) == (code, param)


def test_responses_param_names():
    with pytest.raises(ConstraintError) as exc:
        constraint_for({"type": "json_schema", "name": "x", "schema": {"type": "strin"}}, api="responses")
    assert exc.value.param == "text.format.schema"


def test_openai_tool_choice_required_and_named():
    c = constraint_for(None, OPENAI_TOOLS, "required")
    assert c.kind == "llguidance" and _functions(c) == {"get_weather", "now"} and not _single(c)
    assert _single(constraint_for(None, OPENAI_TOOLS, "required", parallel_tool_calls=False))
    named = constraint_for({"type": "json_object"}, OPENAI_TOOLS, {"type": "function", "function": {"name": "now"}})
    assert _functions(named) == {"now"} and _single(named)  # a forced call wins over response_format
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]}}
    assert _functions(constraint_for(None, OPENAI_TOOLS, allowed)) == {"get_weather"}
    allowed["allowed_tools"]["mode"] = "auto"
    assert constraint_for(None, OPENAI_TOOLS, allowed) is None


def test_responses_and_anthropic_tool_choice():
    assert _functions(constraint_for(None, RESPONSES_TOOLS, "required", api="responses")) == {"get_weather"}
    named = constraint_for(None, RESPONSES_TOOLS, {"type": "function", "name": "get_weather"}, api="responses")
    assert _functions(named) == {"get_weather"}
    anth = constraint_for(None, ANTHROPIC_TOOLS, {"type": "any"}, api="anthropic")
    assert _functions(anth) == {"get_weather"} and not _single(anth)  # the server tool is not ours to call
    one = constraint_for(None, ANTHROPIC_TOOLS, {"type": "any", "disable_parallel_tool_use": True}, api="anthropic")
    assert _single(one)
    assert _functions(constraint_for(None, ANTHROPIC_TOOLS, {"type": "tool", "name": "get_weather"},
                                     api="anthropic")) == {"get_weather"}
    assert constraint_for(None, ANTHROPIC_TOOLS, {"type": "auto"}, api="anthropic") is None


@pytest.mark.parametrize("tools, choice, api", [
    (OPENAI_TOOLS, {"type": "function", "function": {"name": "nope"}}, "openai"),
    ([], "required", "openai"),
    (OPENAI_TOOLS, "sometimes", "openai"),
    (ANTHROPIC_TOOLS, {"type": "tool", "name": "web_search"}, "anthropic"),
    (ANTHROPIC_TOOLS, "any", "anthropic"),
    (RESPONSES_TOOLS, {"type": "mcp"}, "responses"),
])
def test_bad_tool_choice(tools, choice, api):
    with pytest.raises(ConstraintError) as exc:
        constraint_for(None, tools, choice, api=api)
    assert exc.value.code == "invalid_tool_choice" and exc.value.param in ("tool_choice", "tools")


def test_tool_schema_problems_are_400s():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "format": "uri-template"}}}}}]
    with pytest.raises(ConstraintError) as exc:
        constraint_for(None, tools, "required")
    assert exc.value.code == "unsupported_json_schema" and exc.value.param == "tools"
    tools[0]["function"]["strict"] = False
    assert constraint_for(None, tools, "required").kind == "llguidance"


def test_structured_outputs_extension():
    assert constraint_for(structured_outputs={"regex": "[a-z]+"}) == Constraint.regex("[a-z]+")
    assert constraint_for(structured_outputs={"choice": ["a", "b"]}) == Constraint.choice(["a", "b"])
    assert constraint_for(structured_outputs={"json": SCHEMA}) == Constraint.json_schema(SCHEMA)
    assert constraint_for(structured_outputs={"grammar": 'start: "x"'}) == Constraint.grammar('start: "x"')
    with pytest.raises(ConstraintError) as exc:
        constraint_for(structured_outputs={"regex": "a", "choice": ["b"]})
    assert exc.value.param == "structured_outputs"
    with pytest.raises(ConstraintError) as exc:
        constraint_for(structured_outputs={"regex": "(a"})
    assert exc.value.code == "invalid_regex" and exc.value.param == "structured_outputs"


def test_unknown_api_is_a_programming_error():
    with pytest.raises(ValueError):
        constraint_for({"type": "json_object"}, api="gemini")


def test_openai_client_payload_maps():
    """The `response_format` the official client builds from a pydantic model (client.chat.completions.parse)."""
    pydantic = pytest.importorskip("pydantic")
    parsing = pytest.importorskip("openai.lib._parsing._completions")
    if not hasattr(parsing, "type_to_response_format_param"):
        pytest.skip("this openai version builds response_format elsewhere")

    class Person(pydantic.BaseModel):
        name: str
        age: int

    fmt = parsing.type_to_response_format_param(Person)
    c = constraint_for(dict(fmt))
    assert c.kind == "json_schema" and set(json.loads(c.source)["properties"]) == {"name", "age"}
