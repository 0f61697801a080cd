"""OpenAI Chat Completions and Completions: request schemas, their translation into a `Job`, and the
answer in OpenAI's shapes (one object, or `chat.completion.chunk` / `text_completion` events and `[DONE]`).
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from engine.text.tools import new_call_id
from ninfer_cli.serve.errors import ApiError
from ninfer_cli.serve.generation import Job
from ninfer_cli.serve.schema import In, choose_tools, effort_name, sampling_of, sse, stop_list


class Sampling(In):
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    seed: int | None = None
    n: int | None = None
    stream: bool = False


class StreamOptions(In):
    include_usage: bool = False


class FunctionCall(In):
    name: str
    arguments: str | dict = ""


class ToolCall(In):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(In):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(In):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None


class ChatTool(In):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(In):
    name: str


class NamedToolChoice(In):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Sampling):
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream_options: StreamOptions | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict | None = None
    thinking_budget: int | None = Field(None, ge=0)
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None
    structured_outputs: dict | None = None  # vLLM's extension: {json | regex | choice | grammar | json_object}
    logprobs: bool | None = None


class CompletionRequest(Sampling):
    model: str
    prompt: str | list[str]
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream_options: StreamOptions | None = None
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None


def _one_choice(req) -> None:
    if req.n not in (None, 1):
        raise ApiError(400, "n: this server generates one choice per request (n must be 1)", param="n")


def text_of(content, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """Message content (a string, or a list of text parts) as one string; other parts are a 400."""
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            what = f"{kind!r} parts are" if kind else "parts without a type are"
            raise ApiError(400, f"{where}.{i}: {what} not supported by this server (text only)",
                           param=f"{where}.{i}")
        pieces.append(part["text"])
    return "\n".join(pieces)


def chat_messages(messages: list[ChatMessage]) -> list[dict]:
    """OpenAI messages as the template's dicts (developer is a system turn)."""
    if not messages:
        raise ApiError(400, "messages: the list is empty; send at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages.{i}.content"
        text = text_of(m.content, where)
        if m.role in ("system", "developer"):
            out.append({"role": "system", "content": text})
        elif m.role == "user":
            if m.content is None:
                raise ApiError(400, f"{where}: a user message needs content", param=where)
            out.append({"role": "user", "content": text})
        elif m.role == "assistant":
            turn = {"role": "assistant", "content": text}
            if m.reasoning_content:
                turn["reasoning_content"] = m.reasoning_content
            if m.tool_calls:
                turn["tool_calls"] = [
                    {"id": c.id or new_call_id(), "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments
                                  if isinstance(c.function.arguments, str) else json.dumps(c.function.arguments)}}
                    for c in m.tool_calls]
            out.append(turn)
        else:
            out.append({"role": "tool", "content": text, "tool_call_id": m.tool_call_id})
    return out


def chat_job(req: ChatRequest) -> Job:
    """A Chat Completions request as a Job."""
    _one_choice(req)
    if req.logprobs:
        raise ApiError(400, "logprobs: not supported by this server", param="logprobs")
    kwargs = req.chat_template_kwargs or {}
    think = kwargs.get("enable_thinking")
    if think is not None and not isinstance(think, bool):
        raise ApiError(400, "chat_template_kwargs.enable_thinking: must be true or false",
                       param="chat_template_kwargs.enable_thinking")
    effort = req.reasoning_effort if req.reasoning_effort is not None else kwargs.get("reasoning_effort")
    choice, named = req.tool_choice, None
    if isinstance(choice, NamedToolChoice):
        choice, named = "named", choice.function.name
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    return Job(messages=chat_messages(req.messages), tools=choose_tools(tools, choice, named, "tool_choice"),
               sampling=sampling_of(req), max_tokens=req.max_completion_tokens or req.max_tokens,
               stop=stop_list(req.stop), think=think, effort=effort_name(effort, "reasoning_effort"),
               thinking_budget=req.thinking_budget)


def completion_job(req: CompletionRequest) -> Job:
    """A (legacy) Completions request as a Job: the prompt goes to the model as it is, no template."""
    _one_choice(req)
    prompt = req.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise ApiError(400, "prompt: this server takes one prompt per request", param="prompt")
        prompt = prompt[0]
    for name, bad in (("echo", req.echo), ("suffix", req.suffix), ("logprobs", req.logprobs),
                      ("best_of", req.best_of not in (None, 1))):
        if bad:
            raise ApiError(400, f"{name}: not supported by this server", param=name)
    return Job(prompt=prompt, sampling=sampling_of(req), max_tokens=req.max_tokens, stop=stop_list(req.stop))


# ---- answers


def finish_reason(final) -> str:
    if final.tool_calls:
        return "tool_calls"
    return "length" if final.finish_reason == "length" else "stop"


def usage(stats) -> dict:
    p, c = stats.prompt_tokens, stats.generation_tokens
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": stats.reasoning_tokens}}


def _include_usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def chat_completion(rid: str, model: str, created: int, req: ChatRequest, final) -> dict:
    """The whole answer as a `chat.completion`."""
    message = {"role": "assistant", "content": final.answer if final.answer or not final.tool_calls else None}
    if final.answer_reasoning:
        message["reasoning_content"] = final.answer_reasoning
    if final.tool_calls:
        message["tool_calls"] = final.tool_calls
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(final), "logprobs": None}],
            "usage": usage(final.stats)}


async def chat_events(deltas, rid: str, model: str, created: int, req: ChatRequest):
    """The answer as `chat.completion.chunk` events: role first, reasoning and content deltas, tool calls,
    the finish reason, usage when asked, then `[DONE]`."""
    include_usage = _include_usage(req)

    def chunk(delta: dict, finish: str | None = None) -> str:
        body = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        if include_usage:
            body["usage"] = None
        return sse(body)

    yield chunk({"role": "assistant", "content": ""})
    final = None
    async for d in deltas:
        if d.done:
            final = d
            break
        if d.reasoning:
            yield chunk({"reasoning_content": d.reasoning})
        if d.content:
            yield chunk({"content": d.content})
    if final.tool_calls:
        yield chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(final.tool_calls)]})
    yield chunk({}, finish_reason(final))
    if include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                   "usage": usage(final.stats)})
    yield "data: [DONE]\n\n"


def text_completion(rid: str, model: str, created: int, req: CompletionRequest, final) -> dict:
    """The whole answer as a `text_completion`."""
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": final.answer, "finish_reason": finish_reason(final), "logprobs": None}],
            "usage": usage(final.stats)}


async def completion_events(deltas, rid: str, model: str, created: int, req: CompletionRequest):
    """The answer as `text_completion` events, then `[DONE]`."""
    include_usage = _include_usage(req)

    def chunk(text: str, finish: str | None = None) -> str:
        body = {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}
        if include_usage:
            body["usage"] = None
        return sse(body)

    final = None
    async for d in deltas:
        if d.done:
            final = d
            break
        if d.content:
            yield chunk(d.content)
    yield chunk("", finish_reason(final))
    if include_usage:
        yield sse({"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [],
                   "usage": usage(final.stats)})
    yield "data: [DONE]\n\n"
