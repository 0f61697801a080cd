"""`ninfer serve` on the default model (SmolLM2, NumPy), a real process on a free loopback port, with the official
openai and anthropic clients: well-formed objects streaming and not, greedy answers equal to `ninfer run
--temperature 0`, API keys, bad requests in each API's envelope, a disconnect that frees the engine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from serve_helpers import ROOT, ServeProcess, default_model_home

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

KEY = "test-key-0123"
MODEL = "smollm2-135m"
PROMPT = "What is the capital of France?"
CTX = 1024


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return default_model_home(tmp_path_factory)


@pytest.fixture(scope="module")
def server(home, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-log") / "requests.jsonl"
    env = {**os.environ, "NINFER_HOME": home, "NINFER_API_KEY": KEY}
    env.pop("NINFER_DEBUG", None)
    proc = ServeProcess(["--port", "0", "--device", "cpu", "--ctx", str(CTX), "--request-log", str(log)], env).start()
    proc.log = log
    yield proc
    assert proc.stop() in (0, 130), "".join(proc.lines)  # 130: stopped by Ctrl-C (SIGINT), as a user would
    assert "Traceback" not in "".join(proc.lines)


@pytest.fixture(scope="module")
def greedy(home):
    """`ninfer run --temperature 0 --json` on the same prompt, in its own process."""
    env = {**os.environ, "NINFER_HOME": home}
    out = subprocess.run([sys.executable, "-m", "ninfer_cli.main", "run", "--temperature", "0", "-n", "24", "--json",
                          "--device", "cpu", PROMPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["text"]


def oai(server, key=KEY):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def ant(server, key=KEY):
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)


def strict(model_type, obj):
    return model_type.model_validate(obj.to_dict())


ASK = [{"role": "user", "content": PROMPT}]
GREEDY = {"temperature": 0}  # the anthropic SDK no longer has a temperature argument; the API still takes one


def test_models(server):
    from openai.types import Model

    models = oai(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    strict(Model, models.data[0])
    assert oai(server).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        oai(server).models.retrieve("no-such-model")
    assert [m.id for m in ant(server).models.list().data] == [MODEL]


def test_chat_greedy_equals_ninfer_run(server, greedy):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    assert "Paris" in greedy
    client = oai(server)
    resp = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=24)
    strict(ChatCompletion, resp)
    assert resp.choices[0].message.content == greedy and resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens > 5 and 0 < resp.usage.completion_tokens < 24
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_completion_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    for c in chunks:
        strict(ChatCompletionChunk, c)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == greedy
    assert len({c.id for c in chunks}) == 1 and chunks[-1].usage.completion_tokens == resp.usage.completion_tokens
    limited = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=3)
    assert limited.choices[0].finish_reason == "length" and limited.usage.completion_tokens == 3
    assert greedy.startswith(limited.choices[0].message.content)


def test_structured_outputs_reach_the_official_clients(server):
    """response_format json_schema (the client's own pydantic helper), json_object and Responses text.format give
    content that parses and validates; a schema the library rejects is a 400 naming the field."""
    import jsonschema
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=24)
        country: str = Field(max_length=24)
        population: int = Field(ge=0, le=10**8)

    client = oai(server)
    ask = [{"role": "user", "content": "Describe Paris as JSON."}]
    parsed = client.chat.completions.parse(model=MODEL, messages=ask, response_format=City, temperature=0,
                                           max_tokens=80)
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City) and city.name
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    for seed in (1, 2):
        resp = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Is Paris in France?"}], temperature=0.8, seed=seed,
            max_tokens=40, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        jsonschema.validate(json.loads(resp.choices[0].message.content), schema)
    obj = client.chat.completions.create(model=MODEL, messages=ask, temperature=0, max_tokens=60,
                                         response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    r = client.responses.create(model=MODEL, input="Is Paris in France?", temperature=0, max_output_tokens=40,
                                text={"format": {"type": "json_schema", "name": "a", "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=MODEL, messages=ask, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}})
    assert exc.value.status_code == 400 and exc.value.body["param"].startswith("response_format")


def test_completions_raw_prompt(server):
    from openai.types import Completion

    client = oai(server)
    resp = client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=6)
    strict(Completion, resp)
    text = resp.choices[0].text
    assert "Paris" in text and resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 6
    streamed = list(client.completions.create(model=MODEL, prompt="The capital of France is", temperature=0,
                                              max_tokens=6, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_responses(server, greedy):
    from openai.types.responses import Response

    client = oai(server)
    resp = client.responses.create(model=MODEL, input=PROMPT, temperature=0, max_output_tokens=24)
    strict(Response, resp)
    assert resp.output_text == greedy and resp.status == "completed" and resp.usage.output_tokens > 0
    events = list(client.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=24, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == greedy
    assert events[-1].response.output_text == greedy
    with client.responses.stream(model=MODEL, input=PROMPT, temperature=0, max_output_tokens=24) as stream:
        assert stream.get_final_response().output_text == greedy
    cut = list(client.responses.create(model=MODEL, input=PROMPT, temperature=0, max_output_tokens=3, stream=True))
    assert cut[-1].type == "response.incomplete" and cut[-1].response.status == "incomplete"
    assert cut[-1].response.incomplete_details.reason == "max_output_tokens"
    assert greedy.startswith(cut[-1].response.output_text)


def test_anthropic_messages(server, greedy):
    from anthropic.types import Message

    client = ant(server)
    msg = client.messages.create(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    strict(Message, msg)
    assert msg.content[0].text == greedy and msg.stop_reason == "end_turn" and msg.usage.output_tokens > 0
    with client.messages.stream(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == greedy and final.content[0].text == greedy and final.usage.output_tokens == msg.usage.output_tokens
    count = client.messages.count_tokens(model=MODEL, messages=ASK)
    assert count.input_tokens == msg.usage.input_tokens
    cut = client.messages.create(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY,
                                 stop_sequences=["France"])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "France"
    assert greedy.startswith(cut.content[0].text) and "France" not in cut.content[0].text
    short = client.messages.create(model=MODEL, max_tokens=2, messages=ASK, extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


def test_api_key(server):
    assert httpx.get(server.url + "/health").status_code == 200  # open without a key
    with pytest.raises(openai.AuthenticationError) as exc:
        oai(server, key="wrong-key").models.list()
    assert exc.value.status_code == 401 and exc.value.body["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError) as exc:
        ant(server, key="wrong-key").messages.create(model=MODEL, max_tokens=2, messages=ASK)
    assert exc.value.body["error"]["type"] == "authentication_error"
    url = server.url + "/v1/models"
    none = httpx.get(url)
    assert none.status_code == 401 and none.json()["error"]["type"] == "authentication_error"
    anthropic_none = httpx.post(server.url + "/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": ASK})
    assert anthropic_none.status_code == 401 and anthropic_none.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(url, headers={"x-api-key": KEY}).status_code == 200
    assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}x"}).status_code == 401
    assert httpx.get(url, headers={"x-api-key": KEY[:-1]}).status_code == 401


def _chat(**over):
    return {"model": MODEL, "messages": ASK, "max_tokens": 4, **over}


BAD = [  # (path, body, status, param or message fragment)
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
    ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
    ("/v1/chat/completions", _chat(messages=[]), 400, "messages"),
    ("/v1/chat/completions", _chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role"),
    ("/v1/chat/completions", _chat(messages="hello"), 400, "messages"),
    ("/v1/chat/completions", _chat(temperature="hot"), 400, "temperature"),
    ("/v1/chat/completions", _chat(max_tokens=0), 400, "max_tokens"),
    ("/v1/chat/completions", _chat(n=2), 400, "n"),
    ("/v1/chat/completions", _chat(model="gpt-9"), 404, "model"),
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": "word " * 1200}]), 400, "1024"),
    ("/v1/chat/completions", _chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no-such-type"}}}), 400, "response_format"),
    ("/v1/chat/completions", _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:,"}}]}]), 400, "messages.0.content.0"),
    ("/v1/chat/completions", _chat(reasoning_effort="ultra"), 400, "reasoning_effort"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/responses", {"model": MODEL, "input": [{"role": "robot", "content": "hi"}]}, 400, "input.0.role"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "previous_response_id": "resp_1"}, 400,
     "previous_response_id"),
    ("/v1/messages", {"model": MODEL, "messages": ASK}, 400, "max_tokens"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 0, "messages": ASK}, 400, "max_tokens"),
    ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, 400,
     "messages.0.role"),
    ("/v1/messages", {"model": "claude-9", "max_tokens": 5, "messages": ASK}, 404, "claude-9"),
    ("/v1/messages/count_tokens", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/nowhere", {}, 404, "no route"),
]


@pytest.mark.parametrize("path, body, status, where", BAD, ids=[f"{i}-{b[0].split('/')[-1]}" for i, b in
                                                                 enumerate(BAD)])
def test_bad_requests_get_the_apis_envelope(server, path, body, status, where):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers={"x-api-key": KEY, "content-type": "application/json"})
    assert r.status_code == status, r.text
    assert "Traceback" not in r.text
    err = r.json()
    if path.startswith("/v1/messages"):
        assert err["type"] == "error" and set(err["error"]) == {"type", "message"}
        assert err["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        message = err["error"]["message"]
    else:
        assert set(err["error"]) == {"message", "type", "param", "code"}
        assert err["error"]["type"] == "invalid_request_error"
        message = err["error"]["message"]
        assert err["error"]["param"] is None or where in message or where in (err["error"]["param"] or "")
    assert where in message and "\n" not in message


def test_body_over_the_limit_is_413(home, tmp_path):
    env = {**os.environ, "NINFER_HOME": home}
    env.pop("NINFER_API_KEY", None)
    small = ServeProcess(["--port", "0", "--device", "cpu", "--max-request-mib", "0.01"], env).start()
    try:
        r = httpx.post(small.url + "/v1/messages", json={"model": MODEL, "max_tokens": 5,
                                                         "messages": [{"role": "user", "content": "x" * 20000}]})
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
        ok = httpx.post(small.url + "/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": ASK})
        assert ok.status_code == 200  # no key needed on loopback without --api-key
    finally:
        assert small.stop() in (0, 130)


def test_disconnect_cancels_and_the_next_request_starts_at_once(server):
    opened = threading.Event()

    def long_stream():
        body = {"model": MODEL, "max_tokens": 300, "messages": [{"role": "user", "content": "Write a long story."}],
                "stream": True}
        with httpx.Client(timeout=60) as c, c.stream("POST", server.url + "/v1/chat/completions", json=body,
                                                      headers={"x-api-key": KEY}) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n >= 6:
                    opened.set()
                    return  # hang up mid-answer

    t = threading.Thread(target=long_stream)
    t.start()
    assert opened.wait(60)
    t.join(10)
    t0 = time.monotonic()
    resp = oai(server).chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=1)
    waited = time.monotonic() - t0
    assert resp.usage.completion_tokens == 1
    records = [json.loads(line) for line in server.log.read_text().splitlines()]
    done = [r for r in records if r["event"] == "request_done"]
    cancelled = [r for r in done if r.get("finish_reason") == "cancelled"]
    assert cancelled and cancelled[-1]["output_tokens"] < 60, cancelled
    queued_ms = done[-1]["timings_ms"]["queue"]
    print(f"\nafter the disconnect the next request waited {queued_ms:.0f} ms for the engine, answered in {waited:.2f} s")
    assert queued_ms < 1500, done[-1]
    assert any("cancelled" in line for line in server.lines)
