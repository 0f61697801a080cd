"""`ninfer serve`'s app under a real uvicorn, over a scripted engine with the tiny Qwen3.5 fixture's tokenizer and
chat template: tool calls and reasoning reach the official openai and anthropic clients in their own shapes, the
queue answers 429/503, loading answers 503, a disconnect frees the engine, CORS only when asked."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from serve_helpers import InProcessServer, ScriptedEngine, qwen_tokenizer

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

MODEL = "tiny-qwen"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Current weather in a city",
                    "input_schema": TOOLS[0]["function"]["parameters"]}]
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
THOUGHT = "The user wants the weather in Paris."
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tiny():
    engine = ScriptedEngine(qwen_tokenizer())
    with InProcessServer(engine, model_id=MODEL) as server:
        server.wait_ready()
        yield server


@pytest.fixture
def engine(tiny):
    tiny.engine.reply, tiny.engine.delay = "Hello.", 0.0
    return tiny.engine


def oai(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def ant(server) -> "anthropic.Anthropic":
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def strict(model_type, obj):
    """Validate what the client built against the SDK's own type (required fields, literals)."""
    return model_type.model_validate(obj.to_dict())


def test_chat_tool_call(tiny, engine):
    from openai.types.chat import ChatCompletion

    engine.reply = f"{THOUGHT}\n</think>\n\n{CALL}"
    resp = oai(tiny).chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    strict(ChatCompletion, resp)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.model_extra["reasoning_content"] == THOUGHT
    assert resp.usage.completion_tokens_details.reasoning_tokens > 0
    assert "<tools>" in engine.prompts[-1] and '"get_weather"' in engine.prompts[-1]
    assert engine.prompts[-1].endswith("<|im_start|>assistant\n<think>\n")


def test_chat_tool_call_streamed(tiny, engine):
    engine.reply = f"Let me look.\n\n{CALL}"
    client = oai(tiny)
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS, stream=True,
                                                 stream_options={"include_usage": True}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert content == "Let me look.\n\n" and "<tool_call>" not in content
    assert [tc.function.name for tc in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    with client.chat.completions.stream(model=MODEL, messages=QUESTION, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert final.choices[0].finish_reason == "tool_calls"


def test_chat_reasoning_streamed_as_deltas(tiny, engine):
    engine.reply = f"{THOUGHT}\n</think>\n\nParis is sunny."
    chunks = list(oai(tiny).chat.completions.create(model=MODEL, messages=QUESTION, stream=True,
                                                    reasoning_effort="high"))
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert reasoning == THOUGHT and content == "Paris is sunny."
    assert sum(1 for c in chunks if c.choices[0].delta.model_extra.get("reasoning_content")) > 1
    plain = oai(tiny).chat.completions.create(model=MODEL, messages=QUESTION, reasoning_effort="none")
    assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")  # thinking off: the template closes the block
    assert plain.choices[0].message.model_extra.get("reasoning_content") is None


def test_chat_tool_results_reach_the_template(tiny, engine):
    history = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    oai(tiny).chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    prompt = engine.prompts[-1]
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


def test_tool_choice_none_hides_tools_and_named_picks_one(tiny, engine):
    two = TOOLS + [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    oai(tiny).chat.completions.create(model=MODEL, messages=QUESTION, tools=two, tool_choice="none")
    assert "<tools>" not in engine.prompts[-1]
    oai(tiny).chat.completions.create(model=MODEL, messages=QUESTION, tools=two,
                                      tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert '"get_time"' in engine.prompts[-1] and '"get_weather"' not in engine.prompts[-1]


def test_responses_function_call_and_reasoning(tiny, engine):
    from openai.types.responses import Response

    engine.reply = f"{THOUGHT}\n</think>\n\n{CALL}"
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    client = oai(tiny)
    resp = client.responses.create(model=MODEL, input="Weather in Paris?", tools=tools, reasoning={"effort": "high"})
    strict(Response, resp)
    kinds = [item.type for item in resp.output]
    assert kinds == ["reasoning", "function_call"] and resp.status == "completed"
    assert resp.output[0].content[0].text == THOUGHT
    call = resp.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")
    assert resp.usage.output_tokens_details.reasoning_tokens > 0

    with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=tools,
                                 reasoning={"effort": "high"}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.reasoning_text.delta" in types and "response.function_call_arguments.done" in types
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 2
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    assert json.loads(final.output[1].arguments) == {"city": "Paris"}


def test_responses_items_round_trip(tiny, engine):
    engine.reply = "It is sunny in Paris."
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_7", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_7", "output": "sunny"}]
    resp = oai(tiny).responses.create(model=MODEL, input=items, instructions="Be brief.", store=True)
    assert resp.output_text == "It is sunny in Paris."
    prompt = engine.prompts[-1]
    assert prompt.startswith("<|im_start|>system\nBe brief.") and "<tool_response>\nsunny\n</tool_response>" in prompt


def test_anthropic_tool_use_and_thinking(tiny, engine):
    from anthropic.types import Message

    engine.reply = f"{THOUGHT}\n</think>\n\nChecking.\n\n{CALL}"
    client = ant(tiny)
    kwargs = dict(model=MODEL, max_tokens=200, messages=QUESTION, tools=ANTHROPIC_TOOLS,
                  thinking={"type": "enabled", "budget_tokens": 1024})
    msg = client.messages.create(**kwargs)
    strict(Message, msg)
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].thinking == THOUGHT and msg.content[1].text == "Checking."
    tool = msg.content[2]
    assert tool.name == "get_weather" and tool.input == {"city": "Paris"} and tool.id.startswith("toolu_")
    assert msg.stop_reason == "tool_use" and msg.usage.output_tokens > 0

    raw = list(client.messages.create(**kwargs, stream=True))
    deltas = [e.delta.type for e in raw if e.type == "content_block_delta"]
    assert raw[0].type == "message_start" and raw[-1].type == "message_stop"
    assert {"thinking_delta", "text_delta", "input_json_delta"} <= set(deltas)
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"city": "Paris"} and final.stop_reason == "tool_use"


def test_anthropic_tool_result_reaches_the_template(tiny, engine):
    engine.reply = "Sunny."
    messages = [*QUESTION, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]
    msg = ant(tiny).messages.create(model=MODEL, max_tokens=50, messages=messages, tools=ANTHROPIC_TOOLS,
                                    system="Be brief.")
    assert msg.content[0].text == "Sunny." and msg.stop_reason == "end_turn"
    prompt = engine.prompts[-1]
    assert "<parameter=city>\nParis\n</parameter>" in prompt and "<tool_response>\nsunny\n</tool_response>" in prompt
    count = ant(tiny).messages.count_tokens(model=MODEL, messages=messages, tools=ANTHROPIC_TOOLS, system="Be brief.")
    assert count.input_tokens == len(qwen_tokenizer().encode(prompt))


def test_engine_failure_is_an_envelope_not_a_traceback(tiny, engine, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("boom")
        yield  # noqa: RET503 - a generator that fails when run

    monkeypatch.setattr(engine, "stream", broken)
    r = httpx.post(tiny.url + "/v1/chat/completions", json={"model": MODEL, "messages": QUESTION}, timeout=10)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "boom" in r.json()["error"]["message"] and "Traceback" not in r.text
    with httpx.stream("POST", tiny.url + "/v1/messages", timeout=10,
                      json={"model": MODEL, "max_tokens": 5, "messages": QUESTION, "stream": True}) as s:
        text = "".join(s.iter_text())
    assert "event: error" in text and '"api_error"' in text and "Traceback" not in text
    monkeypatch.undo()
    assert oai(tiny).chat.completions.create(model=MODEL, messages=QUESTION).choices[0].message.content == "Hello."


def _stream_until(url: str, body: dict, n_events: int, opened: threading.Event, stop: threading.Event, out: list):
    with httpx.Client(timeout=30) as client, client.stream("POST", url, json=body) as r:
        out.append(r.status_code)
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data:")
            if seen >= n_events:
                opened.set()
                stop.wait(30)
                return


def test_queue_full_is_429_and_a_long_wait_503(engine):
    engine.reply, engine.delay = "word " * 400, 0.02
    with InProcessServer(engine, model_id=MODEL, max_pending=1, pending_timeout_s=1.5) as server:
        server.wait_ready()
        url = server.url + "/v1/chat/completions"
        opened, release, first = threading.Event(), threading.Event(), []
        body = {"model": MODEL, "messages": QUESTION, "stream": True, "max_tokens": 400}
        runner = threading.Thread(target=_stream_until, args=(url, body, 3, opened, release, first))
        runner.start()
        assert opened.wait(20)
        waiting = []
        second = threading.Thread(target=lambda: waiting.append(
            httpx.post(url, json={"model": MODEL, "messages": QUESTION}, timeout=30)))
        second.start()
        deadline = time.monotonic() + 5
        while server.state.gate.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(anthropic.RateLimitError) as full:
            ant(server).messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
        assert full.value.status_code == 429 and full.value.response.headers["retry-after"].isdigit()
        assert full.value.body["error"]["type"] == "rate_limit_error"
        second.join(10)
        timed_out = waiting[0]
        assert timed_out.status_code == 503 and timed_out.headers["retry-after"].isdigit()
        assert timed_out.json()["error"]["code"] == "queue_timeout"
        release.set()  # the first client hangs up mid-stream
        runner.join(10)
        t0 = time.monotonic()
        engine.reply, engine.delay = "Hello.", 0.0
        after = oai(server).chat.completions.create(model=MODEL, messages=QUESTION)
        assert after.choices[0].message.content == "Hello." and time.monotonic() - t0 < 2.0
        assert any("cancelled" in line for line in server.log_stream.lines), server.log_stream.lines


def test_disconnect_frees_the_engine_within_a_token(engine):
    engine.reply, engine.delay = "word " * 400, 0.05
    with InProcessServer(engine, model_id=MODEL) as server:
        server.wait_ready()
        opened, release, status = threading.Event(), threading.Event(), []
        body = {"model": MODEL, "max_tokens": 400, "messages": QUESTION, "stream": True}
        runner = threading.Thread(target=_stream_until, args=(server.url + "/v1/messages", body, 4, opened, release,
                                                              status))
        runner.start()
        assert opened.wait(20) and engine.busy.locked()
        t0 = time.monotonic()
        release.set()
        runner.join(10)
        while (engine.busy.locked() or server.state.gate.busy) and time.monotonic() - t0 < 5:
            time.sleep(0.005)
        freed = time.monotonic() - t0
        assert freed < 0.5, f"the engine ran on for {freed:.2f} s after the client left (a token is 0.05 s)"
        assert status == [200]


def test_health_says_loading_until_the_model_is_ready(engine):
    with InProcessServer(engine, model_id=MODEL, load_delay=1.0) as server:
        r = httpx.get(server.url + "/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        r = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": QUESTION})
        assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "loading"
        server.wait_ready()
        assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": MODEL}


def test_cors_only_when_asked(engine):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    with InProcessServer(engine, model_id=MODEL, api_key="k", cors=("http://app.example",)) as server:
        server.wait_ready()
        r = httpx.options(server.url + "/v1/chat/completions", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://app.example", "x-api-key": "k"})
        assert r.headers["access-control-allow-origin"] == "http://app.example"
    with InProcessServer(engine, model_id=MODEL) as server:
        server.wait_ready()
        r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://app.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_concurrent_requests_take_turns(tiny, engine):
    engine.reply, engine.delay = "one two three four", 0.01
    results, errors = [], []

    def ask(i):
        try:
            results.append(oai(tiny).chat.completions.create(model=MODEL, messages=QUESTION).choices[0].message.content)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and results == ["one two three four"] * 4
