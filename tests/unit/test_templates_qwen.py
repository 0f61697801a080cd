"""Our sandboxed rendering of the official Qwen3.6/3.8 templates equals transformers' apply_chat_template
(fixture from dev/make_template_fixtures.py), and reasoning flags map onto what each template accepts."""
import json
from pathlib import Path

import pytest

from engine.errors import NinferError
from engine.text.chat_template import ChatTemplate
from engine.text.reasoning import accepted_efforts, template_kwargs

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures/text/qwen_templates.json").read_text("utf-8"))
CASES = FIXTURE["cases"]
# SHA-256 of the template bytes, pinned in ../shared/data/chat_templates.md.
PINNED = {"qwen3_6": "e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259",
          "qwen3_8": "c3cf9e34abf4f9e36c2d72165aa9c132d3e2a725b6c2586aaa3a8af9d7a81041",
          "qwen3_6.ninfer-maintained": "7145316bcc837ddc11971fb9fdca588971502e707b9e6df83af0e9b683b2bd39",
          "qwen3_8.ninfer-maintained": "a497db9e663941e6f7a05307c2bafa8374c12e142ad1fbea6229888d41f1ab16"}


def _source(name):
    return FIXTURE["templates"][name]


def test_fixture_templates_are_the_pinned_bytes():
    import hashlib

    for name, sha in PINNED.items():
        assert hashlib.sha256(_source(name).encode("utf-8")).hexdigest() == sha, name


def _id(case):
    kw = ",".join(f"{k}={v}" for k, v in case["kwargs"].items()) or "default"
    return f"{case['template']}-{case['name']}-{kw}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_render_matches_transformers(case):
    template = ChatTemplate(_source(case["template"]))
    got = template.render(case["messages"], tools=case["tools"], add_generation_prompt=True, **case["kwargs"])
    assert got == case["rendered"]


def test_fixture_covers_required_modes():
    seen = {(c["template"], json.dumps(c["kwargs"], sort_keys=True), c["name"]) for c in CASES}
    efforts = {c["kwargs"].get("reasoning_effort") for c in CASES if c["template"] == "qwen3_8"}
    assert {"low", "medium", "xhigh"} <= efforts
    for model in ("qwen3_6", "qwen3_8"):
        assert (model, '{"enable_thinking": false}', "tool_history") in seen
        assert (model, '{"enable_thinking": true}', "tools") in seen


def test_generation_prompt_opens_or_closes_think():
    src = _source("qwen3_8")
    t = ChatTemplate(src)
    msgs = [{"role": "user", "content": "hi"}]
    on = t.render(msgs, **template_kwargs(src, effort="high"))
    off = t.render(msgs, **template_kwargs(src, effort="off"))
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "Reasoning effort is set to xhigh" in on


@pytest.mark.parametrize("effort, expected", [("off", {"enable_thinking": False}),
                                              ("low", {"enable_thinking": True, "reasoning_effort": "low"}),
                                              ("medium", {"enable_thinking": True, "reasoning_effort": "medium"}),
                                              ("high", {"enable_thinking": True, "reasoning_effort": "xhigh"}),
                                              ("xhigh", {"enable_thinking": True, "reasoning_effort": "xhigh"}),
                                              ("minimal", {"enable_thinking": True, "reasoning_effort": "low"}),
                                              ("none", {"enable_thinking": False})])
def test_effort_maps_onto_qwen38_values(effort, expected):
    src = _source("qwen3_8")
    assert accepted_efforts(src) == ("xhigh", "medium", "low")
    kwargs = template_kwargs(src, effort=effort)
    assert kwargs == expected
    ChatTemplate(src).render([{"role": "user", "content": "x"}], **kwargs)  # the template accepts it


def test_qwen36_has_no_effort_levels_but_thinking_switch():
    src = _source("qwen3_6")
    assert accepted_efforts(src) == ()
    assert template_kwargs(src, effort="low") == {"enable_thinking": True}
    assert template_kwargs(src, think=False) == {"enable_thinking": False}
    assert template_kwargs(src, preserve=True) == {"preserve_thinking": True}
    assert template_kwargs(src) == {}


def test_stock_template_rejects_high_so_we_never_pass_it():
    src = _source("qwen3_8")
    with pytest.raises(NinferError, match="refused"):
        ChatTemplate(src).render([{"role": "user", "content": "x"}], reasoning_effort="high")


def test_openai_string_arguments_render_like_mappings():
    src = _source("qwen3_6")
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}
    as_map = {**call, "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}]}
    msgs = [{"role": "user", "content": "x"}]
    t = ChatTemplate(src)
    assert t.render(msgs + [call]) == t.render(msgs + [as_map])
    assert "<parameter=a>\n1\n</parameter>" in t.render(msgs + [call])


def test_sandbox_blocks_attribute_escape():
    evil = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(Exception):
        ChatTemplate(evil).render([])
