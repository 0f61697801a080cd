"""OpenAI Responses: the request schema, its input items as template messages, and the answer as a
`response` object or its event sequence (`response.created` ... `response.completed`).

Nothing is stored: `store` is accepted and ignored, and `previous_response_id` is refused.
"""
from __future__ import annotations

import itertools
from typing import Literal

from pydantic import Field

from ninfer_cli.serve.errors import ApiError
from ninfer_cli.serve.generation import Job
from ninfer_cli.serve.openai import Sampling, text_of
from ninfer_cli.serve.schema import In, choose_tools, effort_name, new_id, sampling_of, sse

_TEXT_PARTS = ("input_text", "output_text", "text")


class FunctionTool(In):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class NamedFunction(In):
    type: Literal["function"]
    name: str


class ReasoningConfig(In):
    effort: str | None = None
    summary: str | None = None


class TextConfig(In):
    format: dict | None = None


class ResponsesRequest(Sampling):
    model: str
    input: str | list[dict]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict | None = None
    thinking_budget: int | None = Field(None, ge=0)


def input_messages(items: str | list[dict], instructions: str | None) -> list[dict]:
    """Input items (messages, function calls and their outputs, reasoning) as template messages."""
    out = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    if not items:
        raise ApiError(400, "input: the list is empty; send at least one item", param="input")
    reasoning = None
    for i, item in enumerate(items):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where}: an input item must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise ApiError(400, f"{where}.role: unknown role {role!r}; use system, developer, user or assistant",
                               param=f"{where}.role")
            text = text_of(item.get("content"), f"{where}.content", _TEXT_PARTS)
            if role == "assistant":
                out.append(_assistant(text, reasoning))
                reasoning = None
            else:
                out.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(item.get("arguments", ""), str):
                raise ApiError(400, f"{where}: a function_call needs a name and string arguments", param=where)
            call = {"id": item.get("call_id") or item.get("id"), "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant" or reasoning is not None:
                last = _assistant("", reasoning)
                out.append(last)
                reasoning = None
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else text_of(output, f"{where}.output", _TEXT_PARTS)
            out.append({"role": "tool", "content": text, "tool_call_id": item.get("call_id")})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = "\n".join(p.get("text", "") for p in parts if isinstance(p, dict))
        else:
            raise ApiError(400, f"{where}.type: input items of type {kind!r} are not supported by this server",
                           param=f"{where}.type")
    return out


def _assistant(text: str, reasoning: str | None) -> dict:
    turn = {"role": "assistant", "content": text}
    if reasoning:
        turn["reasoning_content"] = reasoning
    return turn


def responses_job(req: ResponsesRequest) -> Job:
    """A Responses request as a Job."""
    if req.previous_response_id:
        raise ApiError(400, "previous_response_id: this server stores no responses; send the whole conversation "
                            "in input", param="previous_response_id")
    if req.n not in (None, 1):
        raise ApiError(400, "n: this server generates one answer per request", param="n")
    choice, named = req.tool_choice, None
    if isinstance(choice, NamedFunction):
        choice, named = "named", choice.name
    tools = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type", "strict"})}
             for t in req.tools] if req.tools else None
    effort = req.reasoning.effort if req.reasoning else None
    return Job(messages=input_messages(req.input, req.instructions),
               tools=choose_tools(tools, choice, named, "tool_choice"), sampling=sampling_of(req),
               max_tokens=req.max_output_tokens, effort=effort_name(effort, "reasoning.effort"),
               thinking_budget=req.thinking_budget)


# ---- answers


class _Ids:
    """The ids of one answer's output items, fixed up front so events and the final object agree."""

    def __init__(self):
        self.reasoning, self.message = new_id("rs_"), new_id("msg_")

    @staticmethod
    def call(call: dict) -> str:
        return "fc_" + call["id"].removeprefix("call_")


def _usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": stats.generation_tokens,
            "output_tokens_details": {"reasoning_tokens": stats.reasoning_tokens},
            "total_tokens": stats.prompt_tokens + stats.generation_tokens}


def _reasoning_item(ids: _Ids, text: str, status: str = "completed") -> dict:
    return {"id": ids.reasoning, "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text or status == "completed" else [],
            "status": status}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(ids: _Ids, text: str | None, status: str = "completed") -> dict:
    return {"id": ids.message, "type": "message", "role": "assistant", "status": status,
            "content": [] if text is None else [_text_part(text)]}


def _call_item(call: dict, arguments: str | None = None) -> dict:
    fn = call["function"]
    return {"id": _Ids.call(call), "type": "function_call", "call_id": call["id"], "name": fn["name"],
            "arguments": fn["arguments"] if arguments is None else arguments,
            "status": "completed" if arguments is None else "in_progress"}


def _status(final) -> str:
    return "incomplete" if final.finish_reason == "length" else "completed"


def output_items(final, ids: _Ids) -> list[dict]:
    """The finished answer's output: reasoning, the message (unless the answer is only tool calls), calls."""
    items = [_reasoning_item(ids, final.answer_reasoning)] if final.answer_reasoning else []
    if final.answer or not final.tool_calls:
        items.append(_message_item(ids, final.answer, _status(final)))
    return items + [_call_item(c) for c in final.tool_calls]


def response_object(rid: str, model: str, created: int, req: ResponsesRequest, *, status: str,
                    output: list[dict], final=None) -> dict:
    """A `response` object (in progress while streaming, then finished)."""
    choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedFunction) else req.tool_choice or "auto"
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "error": None, "incomplete_details": incomplete, "instructions": req.instructions,
            "metadata": req.metadata or {}, "parallel_tool_calls": True, "tool_choice": choice,
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()], "temperature": req.temperature,
            "top_p": req.top_p, "max_output_tokens": req.max_output_tokens, "store": False,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "text": {"format": {"type": "text"}},
            "usage": _usage(final.stats) if final is not None else None}


def response_json(rid: str, model: str, created: int, req: ResponsesRequest, final) -> dict:
    """The whole answer as one `response`."""
    return response_object(rid, model, created, req, status=_status(final), output=output_items(final, _Ids()),
                           final=final)


async def response_events(deltas, rid: str, model: str, created: int, req: ResponsesRequest):
    """The answer as the Responses event sequence: created, in_progress, each output item added, its
    deltas and done events, then completed (or incomplete at the token limit). The final object lists
    the items exactly as they were streamed."""
    seq = itertools.count()
    ids = _Ids()
    done_items: list[dict] = []
    open_kind, text = None, ""

    def ev(kind: str, **fields) -> str:
        return sse({"type": kind, "sequence_number": next(seq), **fields}, event=kind)

    def opening(kind: str):
        nonlocal open_kind
        open_kind, at = kind, len(done_items)
        if kind == "reasoning":
            yield ev("response.output_item.added", item=_reasoning_item(ids, "", "in_progress"), output_index=at)
            yield ev("response.content_part.added", item_id=ids.reasoning, output_index=at, content_index=0,
                     part={"type": "reasoning_text", "text": ""})
        else:
            yield ev("response.output_item.added", item=_message_item(ids, None, "in_progress"), output_index=at)
            yield ev("response.content_part.added", item_id=ids.message, output_index=at, content_index=0,
                     part=_text_part(""))

    def closing(status: str):
        nonlocal open_kind, text
        at = dict(output_index=len(done_items), content_index=0)
        if open_kind == "reasoning":
            yield ev("response.reasoning_text.done", item_id=ids.reasoning, text=text, **at)
            yield ev("response.content_part.done", item_id=ids.reasoning, part={"type": "reasoning_text", "text": text},
                     **at)
            item = _reasoning_item(ids, text)
        else:
            yield ev("response.output_text.done", item_id=ids.message, text=text, logprobs=[], **at)
            yield ev("response.content_part.done", item_id=ids.message, part=_text_part(text), **at)
            item = _message_item(ids, text, status)
        yield ev("response.output_item.done", item=item, output_index=len(done_items))
        done_items.append(item)
        open_kind, text = None, ""

    start = response_object(rid, model, created, req, status="in_progress", output=[])
    yield ev("response.created", response=start)
    yield ev("response.in_progress", response=start)
    final = None
    async for d in deltas:
        if d.done:
            final = d
            break
        for kind, piece in (("reasoning", d.reasoning), ("message", d.content)):
            if not piece:
                continue
            if open_kind != kind:
                if open_kind is not None:
                    for e in closing("completed"):
                        yield e
                for e in opening(kind):
                    yield e
            text += piece
            event = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
            extra = {} if kind == "reasoning" else {"logprobs": []}
            yield ev(event, item_id=ids.reasoning if kind == "reasoning" else ids.message,
                     output_index=len(done_items), content_index=0, delta=piece, **extra)
    status = _status(final)
    if open_kind is not None:
        for e in closing(status):
            yield e
    if not final.tool_calls and not any(i["type"] == "message" for i in done_items):
        for e in [*opening("message"), *closing(status)]:  # nothing was said: the empty message still belongs
            yield e
    for call in final.tool_calls:
        at, item_id, args = len(done_items), _Ids.call(call), call["function"]["arguments"]
        yield ev("response.output_item.added", item=_call_item(call, ""), output_index=at)
        yield ev("response.function_call_arguments.delta", item_id=item_id, output_index=at, delta=args)
        yield ev("response.function_call_arguments.done", item_id=item_id, output_index=at, arguments=args,
                 name=call["function"]["name"])
        done_items.append(_call_item(call))
        yield ev("response.output_item.done", item=done_items[-1], output_index=at)
    done = response_object(rid, model, created, req, status=status, output=done_items, final=final)
    yield ev("response.completed" if status == "completed" else "response.incomplete", response=done)
