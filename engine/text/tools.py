"""Tool calls in Qwen's XML form, parsed out of a finished answer (runtime spec §3.9).

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    value
    </parameter>
    </function>
    </tool_call>

Content before the first `<tool_call>` stays content. Each block holds exactly one function with a name
of `[A-Za-z0-9_-]+`; a parameter value is JSON when it parses, else the trimmed text. Any malformed
block returns the whole text as content and no calls, so nothing the model wrote is lost. ninfer never
executes tools.
"""
from __future__ import annotations

import json
import re
import secrets

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FUNCTION = re.compile(r"\A\s*<function=([A-Za-z0-9_-]+)>(.*)</function>\s*\Z", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def new_call_id() -> str:
    """`call_` + 16 hex digits."""
    return "call_" + secrets.token_hex(8)


def _value(raw: str):
    text = raw.strip()
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return text


def _parse_block(body: str) -> dict | None:
    m = _FUNCTION.match(body)
    if m is None:
        return None
    name, inner = m.group(1), m.group(2)
    args: dict = {}
    pos = 0
    for p in _PARAM.finditer(inner):
        if inner[pos:p.start()].strip():
            return None  # stray text between parameters
        args[p.group(1).strip()] = _value(p.group(2))
        pos = p.end()
    if inner[pos:].strip():
        return None
    return {"id": new_call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def parse_tool_calls(text: str) -> tuple[str, list[dict]]:
    """Split `text` into (content, tool calls in OpenAI form); malformed calls -> (text, [])."""
    first = text.find(OPEN)
    if first < 0:
        return text, []
    calls, pos = [], first
    for m in _BLOCK.finditer(text, first):
        if text[pos:m.start()].strip():
            return text, []
        call = _parse_block(m.group(1))
        if call is None:
            return text, []
        calls.append(call)
        pos = m.end()
    if not calls or text[pos:].strip():
        return text, []
    return text[:first].rstrip(), calls


def has_tool_call_start(text: str) -> bool:
    """Whether streaming output has entered a tool call (its text should then be held back)."""
    return OPEN in text
