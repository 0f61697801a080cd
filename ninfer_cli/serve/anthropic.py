"""Anthropic Messages: the request schema, content blocks as template messages, and the answer as a
`message` or its event sequence (message_start, content_block_start/delta/stop, message_delta,
message_stop)."""
from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from ninfer_cli.serve.errors import ApiError
from ninfer_cli.serve.generation import Job
from ninfer_cli.serve.schema import In, choose_tools, sampling_of, sse, stop_list


class Tool(In):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict


class ToolChoice(In):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class Thinking(In):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class Message(In):
    role: Literal["user", "assistant"]
    content: str | list[dict]


class CountRequest(In):
    model: str
    messages: list[Message]
    system: str | list[dict] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesRequest(CountRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    output_config: dict | None = None


def _blocks_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    pieces = []
    for i, block in enumerate(content or ()):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else None
            raise ApiError(400, f"{where}.{i}: {kind!r} blocks are not supported here (text only)", param=f"{where}.{i}")
        pieces.append(block["text"])
    return "\n".join(pieces)


def _user(content: list[dict], where: str) -> list[dict]:
    """A user turn's blocks: tool results become tool messages (answering the calls before them), then text."""
    tools, texts = [], []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            result = _blocks_text(block.get("content") or "", f"{where}.{i}.content")
            if block.get("is_error"):
                result = f"Error: {result}"
            tools.append({"role": "tool", "content": result, "tool_call_id": block.get("tool_use_id")})
        else:
            raise ApiError(400, f"{where}.{i}: {kind!r} blocks are not supported by this server (text and "
                                f"tool_result only)", param=f"{where}.{i}")
    return tools + ([{"role": "user", "content": "\n".join(texts)}] if texts or not tools else [])


def _assistant(content: list[dict], where: str) -> dict:
    turn: dict = {"role": "assistant", "content": ""}
    texts, thoughts, calls = [], [], []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking":
            thoughts.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use" and isinstance(block.get("name"), str):
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
        else:
            raise ApiError(400, f"{where}.{i}: {kind!r} blocks are not supported by this server", param=f"{where}.{i}")
    turn["content"] = "\n".join(texts)
    if thoughts:
        turn["reasoning_content"] = "\n".join(thoughts)
    if calls:
        turn["tool_calls"] = calls
    return turn


def anthropic_messages(system, messages: list[Message]) -> list[dict]:
    """System prompt and messages as the template's dicts."""
    if not messages:
        raise ApiError(400, "messages: the list is empty; send at least one message", param="messages")
    out = []
    if system:
        out.append({"role": "system", "content": _blocks_text(system, "system")})
    for i, m in enumerate(messages):
        where = f"messages.{i}.content"
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "user":
            out.extend(_user(m.content, where))
        else:
            out.append(_assistant(m.content, where))
    return out


def _tools(req: CountRequest) -> list[dict] | None:
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.input_schema}} for t in req.tools or ()]
    choice = req.tool_choice
    kind = {"any": "required", "tool": "named"}.get(choice.type, choice.type) if choice else None
    if kind == "named" and not choice.name:
        raise ApiError(400, "tool_choice.name: a tool choice of type tool needs a name", param="tool_choice.name")
    return choose_tools(tools or None, kind, choice.name if choice else None, "tool_choice")


def _reasoning(req: CountRequest) -> tuple[bool | None, int | None]:
    if req.thinking is None:
        return None, None
    if req.thinking.type == "disabled":
        return False, None
    return True, req.thinking.budget_tokens if req.thinking.type == "enabled" else None


def count_job(req: CountRequest) -> Job:
    """A count_tokens request as a Job (never run, only rendered)."""
    think, budget = _reasoning(req)
    return Job(messages=anthropic_messages(req.system, req.messages), tools=_tools(req), think=think,
               thinking_budget=budget)


def messages_job(req: MessagesRequest) -> Job:
    """A Messages request as a Job."""
    job = count_job(req)
    job.sampling = sampling_of(req)
    job.max_tokens = req.max_tokens
    job.stop = stop_list(req.stop_sequences, "stop_sequences")
    return job


# ---- answers


def tool_use_id(call: dict) -> str:
    return "toolu_" + call["id"].removeprefix("call_")


def arguments_json(arguments: str) -> dict:
    """Tool-call arguments (a JSON string) as an object, {} when they are not one."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def stop_reason(final, stop_sequence: str | None) -> str:
    if final.tool_calls:
        return "tool_use"
    if final.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence else "end_turn"


def _usage(stats) -> dict:
    return {"input_tokens": stats.prompt_tokens, "output_tokens": stats.generation_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _tool_block(call: dict) -> dict:
    return {"type": "tool_use", "id": tool_use_id(call), "name": call["function"]["name"],
            "input": arguments_json(call["function"]["arguments"])}


def message_json(mid: str, model: str, final, stop_sequence: str | None) -> dict:
    """The whole answer as one `message`."""
    content = [{"type": "thinking", "thinking": final.answer_reasoning, "signature": ""}] if final.answer_reasoning else []
    if final.answer or not final.tool_calls:
        content.append({"type": "text", "text": final.answer})
    content += [_tool_block(c) for c in final.tool_calls]
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(final, stop_sequence), "stop_sequence": stop_sequence,
            "usage": _usage(final.stats)}


async def message_events(deltas, mid: str, model: str, prompt_tokens: int, stop_sequence):
    """The answer as Messages events: thinking, text and tool_use blocks, then message_delta and message_stop.
    `stop_sequence()` names the stop string that ended the answer, once it has ended."""
    start = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
             "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}
    yield sse({"type": "message_start", "message": start}, "message_start")
    index, open_kind = 0, None

    def block_start(block: dict) -> str:
        return sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")

    def block_delta(delta: dict) -> str:
        return sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")

    def block_stop() -> str:
        return sse({"type": "content_block_stop", "index": index}, "content_block_stop")

    final, said_text = None, False
    async for d in deltas:
        if d.done:
            final = d
            break
        for kind, piece in (("thinking", d.reasoning), ("text", d.content)):
            if not piece:
                continue
            if open_kind != kind:
                if open_kind is not None:
                    yield block_stop()
                    index += 1
                open_kind = kind
                yield block_start({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                                  else {"type": "text", "text": ""})
            said_text = said_text or kind == "text"
            yield block_delta({"type": "thinking_delta", "thinking": piece} if kind == "thinking"
                              else {"type": "text_delta", "text": piece})
    if open_kind is not None:
        yield block_stop()
        index += 1
    if not said_text and not final.tool_calls:
        yield block_start({"type": "text", "text": ""})
        yield block_stop()
        index += 1
    for call in final.tool_calls:
        block = _tool_block(call)
        yield block_start({**block, "input": {}})
        yield block_delta({"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)})
        yield block_stop()
        index += 1
    matched = stop_sequence()
    yield sse({"type": "message_delta", "delta": {"stop_reason": stop_reason(final, matched), "stop_sequence": matched},
               "usage": {"output_tokens": final.stats.generation_tokens}}, "message_delta")
    yield sse({"type": "message_stop"}, "message_stop")
