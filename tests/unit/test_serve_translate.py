"""The serve package's pieces without a server: request -> template messages for each API, tool choice, the
format hook, the FIFO gate, and ModelHost's defaults, context check and stop-sequence attribution."""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi")

from ninfer_cli.serve import anthropic, openai, responses  # noqa: E402
from ninfer_cli.serve.app import Gate  # noqa: E402
from ninfer_cli.serve.schema import constraint_for  # noqa: E402
from ninfer_cli.serve.errors import ApiError  # noqa: E402


def test_chat_messages_map_roles_parts_and_tool_calls():
    req = openai.ChatRequest.model_validate({"model": "m", "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "thought",
         "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]})
    msgs = openai.chat_messages(req.messages)
    assert msgs[0] == {"role": "system", "content": "Be brief."}
    assert msgs[1] == {"role": "user", "content": "a\nb"}
    assert msgs[2]["reasoning_content"] == "thought"
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert msgs[3] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}


def test_chat_job_reasoning_stop_and_limits():
    job = openai.chat_job(openai.ChatRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 9, "max_completion_tokens": 5,
        "stop": "END", "temperature": 0, "top_k": 3, "reasoning_effort": "xhigh", "thinking_budget": 7}))
    assert job.max_tokens == 5 and job.stop == ("END",) and job.sampling == {"temperature": 0, "top_k": 3}
    assert job.effort == "high" and job.thinking_budget == 7
    off = openai.chat_job(openai.ChatRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "q"}],
        "chat_template_kwargs": {"enable_thinking": False}}))
    assert off.think is False and off.effort is None
    with pytest.raises(ApiError, match="enable_thinking"):
        openai.chat_job(openai.ChatRequest.model_validate({
            "model": "m", "messages": [{"role": "user", "content": "q"}],
            "chat_template_kwargs": {"enable_thinking": "yes"}}))


@pytest.mark.parametrize("choice, expect", [(None, ["a", "b"]), ("auto", ["a", "b"]), ("required", ["a", "b"]),
                                            ("none", None), ({"type": "function", "function": {"name": "b"}}, ["b"])])
def test_tool_choice(choice, expect):
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]
    job = openai.chat_job(openai.ChatRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "q"}], "tools": tools, "tool_choice": choice}))
    assert (None if job.tools is None else [t["function"]["name"] for t in job.tools]) == expect


def test_tool_choice_errors():
    tools = [{"type": "function", "function": {"name": "a"}}]
    with pytest.raises(ApiError, match="no tool named 'zzz'"):
        openai.chat_job(openai.ChatRequest.model_validate({
            "model": "m", "messages": [{"role": "user", "content": "q"}], "tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "zzz"}}}))
    with pytest.raises(ApiError, match="needs tools"):
        openai.chat_job(openai.ChatRequest.model_validate({
            "model": "m", "messages": [{"role": "user", "content": "q"}], "tool_choice": "required"}))


def test_anthropic_blocks():
    req = anthropic.MessagesRequest.model_validate({"model": "m", "max_tokens": 5, "system": [
        {"type": "text", "text": "S"}], "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
                                          {"type": "text", "text": "calling"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "bad"}]},
                                     {"type": "text", "text": "and now?"}]}],
        "thinking": {"type": "enabled", "budget_tokens": 64}, "stop_sequences": ["X", ""], "top_k": 4})
    job = anthropic.messages_job(req)
    m = job.messages
    assert m[0] == {"role": "system", "content": "S"} and m[1] == {"role": "user", "content": "q"}
    assert m[2]["reasoning_content"] == "hm" and m[2]["content"] == "calling"
    assert json.loads(m[2]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    assert m[3] == {"role": "tool", "content": "Error: bad", "tool_call_id": "toolu_1"}
    assert m[4] == {"role": "user", "content": "and now?"}
    assert job.think is True and job.thinking_budget == 64 and job.stop == ("X",) and job.sampling == {"top_k": 4}
    with pytest.raises(ApiError, match="'image' blocks"):
        anthropic.anthropic_messages(None, [anthropic.Message(role="user", content=[{"type": "image"}])])


def test_anthropic_tool_choice_maps_to_openai_semantics():
    base = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}],
            "tools": [{"name": "a", "input_schema": {}}, {"name": "b", "input_schema": {}}]}
    names = lambda job: [t["function"]["name"] for t in job.tools or ()]  # noqa: E731
    assert names(anthropic.messages_job(anthropic.MessagesRequest.model_validate(
        {**base, "tool_choice": {"type": "tool", "name": "b"}}))) == ["b"]
    assert names(anthropic.messages_job(anthropic.MessagesRequest.model_validate(
        {**base, "tool_choice": {"type": "none"}}))) == []
    assert anthropic.messages_job(anthropic.MessagesRequest.model_validate(
        {**base, "thinking": {"type": "disabled"}})).think is False


def test_responses_items():
    msgs = responses.input_messages([
        {"role": "developer", "content": "D"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ], "I")
    assert [m["role"] for m in msgs] == ["system", "system", "user", "assistant", "tool", "tool"]
    assert msgs[3]["reasoning_content"] == "think" and [c["id"] for c in msgs[3]["tool_calls"]] == ["c1", "c2"]
    assert msgs[5]["content"] == "two"
    with pytest.raises(ApiError, match="input.0.type"):
        responses.input_messages([{"type": "web_search_call"}], None)


def test_constraint_hook():
    from engine.constraints import Constraint

    assert constraint_for(None) is None and constraint_for({"type": "text"}) is None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    got = constraint_for({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, None, None)
    assert isinstance(got, Constraint)
    with pytest.raises(ApiError) as exc:  # a schema the grammar library rejects: a 400 naming the field
        constraint_for({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})
    assert exc.value.status == 400 and exc.value.param and exc.value.param.startswith("response_format")
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    assert isinstance(constraint_for(None, tools, "required", "responses"), Constraint)
    assert constraint_for(None, structured_outputs={"choice": ["yes", "no"]}) == Constraint.choice(["yes", "no"])


def test_gate_is_a_bounded_fifo():
    async def body():
        gate = Gate(max_pending=2, timeout_s=5)
        gone = asyncio.Event()
        assert await gate.acquire(gone)
        order = []

        async def wait(i):
            assert await gate.acquire(asyncio.Event())
            order.append(i)

        tasks = [asyncio.ensure_future(wait(i)) for i in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(ApiError) as full:
            await gate.acquire(gone)
        assert full.value.status == 429 and full.value.headers["Retry-After"]
        for _ in range(2):
            gate.release()
            await asyncio.sleep(0.01)
        assert order == [0, 1]
        short = Gate(max_pending=1, timeout_s=0.05)
        await short.acquire(gone)
        with pytest.raises(ApiError) as late:
            await short.acquire(asyncio.Event())
        assert late.value.status == 503 and short.waiting == 0
        left = asyncio.Event()
        waiter = asyncio.ensure_future(short.acquire(left))
        await asyncio.sleep(0.01)
        left.set()
        assert await waiter is False and short.waiting == 0
        short.release()
        assert not short.busy

    asyncio.run(body())


class _Tok:
    eos_token_ids = (0,)
    chat_template = None

    def encode(self, text, add_special=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class _Eng:
    tokenizer = _Tok()
    config = {"model_type": "llama"}
    max_context = 64


def _host(**kw):
    from engine.text.session import ChatSession
    from ninfer_cli.serve.generation import ModelHost

    return ModelHost(_Eng(), ChatSession(_Eng()), model_id="m", default_max_tokens=11, **kw)


def test_host_defaults_and_context_check():
    from ninfer_cli.serve.generation import Job

    host = _host(sampling={"temperature": 0.5}, thinking_budget=3)
    p = host.prepare(Job(messages=[{"role": "user", "content": "hi"}], sampling={"top_p": 0.5}))
    assert p.config.max_tokens == 11 and p.config.temperature == 0.5 and p.config.top_p == 0.5
    assert p.session.thinking_budget == 3 and not p.raw
    assert host.prepare(Job(messages=[{"role": "user", "content": "hi"}], sampling={"temperature": 0})).config.temperature == 0
    assert host.prepare(Job(prompt="abc", max_tokens=2)).ids == [97, 98, 99]
    with pytest.raises(ApiError) as exc:
        host.prepare(Job(prompt="x" * 64))
    assert exc.value.status == 400 and "64 tokens" in exc.value.message and "holds 64" in exc.value.message
    assert host.count_tokens(Job(messages=[{"role": "user", "content": "hi"}])) == len(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_matched_stop_names_the_first_stop_string():
    from engine.generate import Response
    from ninfer_cli.serve.generation import _Watched

    class Streams(_Eng):
        def stream(self, ids, config, cancel=None):
            for t in "ab END x":
                yield Response(t, ord(t))
            yield Response("", ord("x"), finish_reason="stop")

    w = _Watched(Streams())
    list(w.stream([1], None))
    assert w.matched_stop(("x", "END")) == "END" and w.matched_stop(()) is None
