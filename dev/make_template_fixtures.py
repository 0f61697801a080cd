"""Write tests/fixtures/text/qwen_templates.json: what transformers' `apply_chat_template` renders from the
official Qwen3.6 and Qwen3.8 templates (../shared/data/) for thinking on/off, each reasoning effort, a tool
schema and a history with tool calls and results. Needs transformers (dev extra).

    .venv/bin/python dev/make_template_fixtures.py
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/data") if Path("/work/shared/data").exists() else ROOT.parent / "shared" / "data"
OUT = ROOT / "tests/fixtures/text/qwen_templates.json"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
CALC = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}

SIMPLE = [{"role": "user", "content": "What is 2+2?"}]
WITH_SYSTEM = [{"role": "system", "content": "You are concise. Answer in one line."},
               {"role": "user", "content": "Name a prime number above 100 — and 日本語 too 🙂"}]
MULTI_TURN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?", "reasoning_content": "The user greets me."},
    {"role": "user", "content": "Tell me a joke."},
    {"role": "assistant", "content": "<think>\nA pun works.\n</think>\n\nWhy did the bee marry? She found her honey."},
    {"role": "user", "content": "Another one."},
]
TOOL_HISTORY = [
    {"role": "system", "content": "Use tools when helpful."},
    {"role": "user", "content": "Weather in Paris and 3+4?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two tools needed.",
     "tool_calls": [
         {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}},
         {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
    {"role": "tool", "content": "{\"temp\": 18, \"sky\": \"cloudy\"}"},
    {"role": "tool", "content": "7"},
    {"role": "assistant", "content": "Paris: 18 °C and cloudy. 3+4 = 7."},
    {"role": "user", "content": "Thanks! And Berlin?"},
]
AFTER_TOOL = TOOL_HISTORY[:5]


def cases() -> list[dict]:
    out = []
    for model, effort_values in (("qwen3_6", [None]), ("qwen3_8", [None, "low", "medium", "xhigh"]),
                                 ("qwen3_6.ninfer-maintained", [None]),
                                 ("qwen3_8.ninfer-maintained", [None, "low", "xhigh"])):
        for name, messages, tools in (("simple", SIMPLE, None), ("system", WITH_SYSTEM, None),
                                      ("multi_turn", MULTI_TURN, None), ("tools", WITH_SYSTEM, [WEATHER, CALC]),
                                      ("tool_history", TOOL_HISTORY, [WEATHER, CALC]),
                                      ("after_tool", AFTER_TOOL, [WEATHER, CALC])):
            for think in (None, True, False):
                for effort in effort_values:
                    if effort is not None and think is False:
                        continue
                    kwargs = {}
                    if think is not None:
                        kwargs["enable_thinking"] = think
                    if effort is not None:
                        kwargs["reasoning_effort"] = effort
                    out.append({"template": model, "name": name, "messages": messages, "tools": tools,
                                "kwargs": kwargs})
        if "maintained" in model:  # developer role and a tool result without a user turn
            out.append({"template": model, "name": "developer", "tools": None, "kwargs": {},
                        "messages": [{"role": "developer", "content": "Be exact."}, *SIMPLE,
                                     {"role": "assistant", "content": "4"},
                                     {"role": "system", "content": "Now answer in French."},
                                     {"role": "user", "content": "Et 3+3 ?"}]})
        for preserve in (True, False):
            out.append({"template": model, "name": "multi_turn_preserve", "messages": MULTI_TURN, "tools": None,
                        "kwargs": {"preserve_thinking": preserve}})
    return out


def main() -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(BPE()))
    templates, rendered_cases = {}, []
    for case in cases():
        name = case["template"]
        if name not in templates:
            templates[name] = (SHARED / f"chat_template.{name}.jinja").read_bytes().decode("utf-8")
        rendered = tok.apply_chat_template(case["messages"], tools=case["tools"], chat_template=templates[name],
                                           add_generation_prompt=True, tokenize=False, **case["kwargs"])
        rendered_cases.append({**case, "rendered": rendered})
    # The template texts travel with the fixture so CI (no ../shared) renders the same bytes.
    fixture = {"templates": templates, "cases": rendered_cases}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", "utf-8")
    print(f"wrote {len(rendered_cases)} cases to {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
