"""What the OpenAI and Anthropic translations share: the request base model, server-sent events, ids,
reasoning-effort names and the tool choice, all in one spelling."""
from __future__ import annotations

import json
import secrets

from pydantic import BaseModel, ConfigDict

from ninfer_cli.serve.errors import ApiError


class In(BaseModel):
    """A request body (or part of one): unknown fields are ignored, as the real APIs' clients send many."""

    model_config = ConfigDict(extra="ignore")


def sse(data: dict, event: str | None = None) -> str:
    """One server-sent event (`event:` line only where the API names its events)."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def new_id(prefix: str) -> str:
    """`prefix` + 24 hex digits (chatcmpl-..., resp_..., msg_...)."""
    return prefix + secrets.token_hex(12)


def effort_name(value: str | None, param: str) -> str | None:
    """A request's reasoning effort as ninfer's off|low|medium|high (400 naming `param` when unknown)."""
    if value is None:
        return None
    from engine.errors import NinferError
    from engine.text.reasoning import normalize_effort

    try:
        return normalize_effort(value)
    except NinferError:
        raise ApiError(400, f"{param}: unknown reasoning effort {value!r}; use none, minimal, low, medium, high "
                            f"or xhigh", param=param) from None


def choose_tools(tools: list[dict] | None, choice: str | None, named: str | None, param: str) -> list[dict] | None:
    """The tools a template is shown for a tool choice: none hides them, a named function shows only that one;
    auto and required show all (the model is asked, not forced: see docs/serving.md)."""
    if choice in ("required", "named") and not tools:
        raise ApiError(400, f"{param}: {choice if choice != 'named' else 'a named tool'} needs tools in the request",
                       param=param)
    if not tools or choice == "none":
        return None
    if choice == "named":
        picked = [t for t in tools if t["function"]["name"] == named]
        if not picked:
            raise ApiError(400, f"{param}: no tool named {named!r} in tools", param=param)
        return picked
    return tools


def stop_list(stop: str | list[str] | None, param: str = "stop") -> tuple[str, ...]:
    """Stop strings as a tuple (at most 16; empty strings dropped)."""
    items = [stop] if isinstance(stop, str) else list(stop or ())
    if len(items) > 16:
        raise ApiError(400, f"{param}: at most 16 stop strings", param=param)
    return tuple(s for s in items if s)


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed")


def sampling_of(req) -> dict:
    """The GenerationConfig sampling fields a request set."""
    return {k: getattr(req, k) for k in SAMPLING_FIELDS if getattr(req, k, None) is not None}


def constraint_for(request_format, tools=None, tool_choice=None, api: str = "openai", *, parallel_tool_calls=None,
                   structured_outputs=None):
    """The output constraint a request asks for (`response_format`, Responses `text.format`, Anthropic
    `output_config.format`, or a tool choice that forces a call; `ninfer_cli.serve_formats`), None for free text;
    a format the grammar library cannot enforce is a 400 naming the field."""
    from engine.constraints import ConstraintError  # noqa: PLC0415
    from ninfer_cli.serve_formats import constraint_for as mapped  # noqa: PLC0415

    try:
        return mapped(_plain(request_format), _plain(tools), _plain(tool_choice), api,
                      parallel_tool_calls=parallel_tool_calls, structured_outputs=_plain(structured_outputs))
    except ConstraintError as exc:
        message = f"{exc.message} ({exc.next_action})" if exc.next_action else exc.message
        raise ApiError(400, f"{exc.param}: {message}" if exc.param else message, param=exc.param,
                       code=exc.code) from None


def _plain(value):
    """Request fields as the plain dicts and lists they arrived as (pydantic models dumped)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
