"""From the structured-output fields of an API request to an `engine.constraints.Constraint`.

One function, `constraint_for`, reads the request fields of the three APIs `ninfer serve` speaks; the
server puts the result in `GenerationConfig.constraint` and answers a `ConstraintError` with HTTP 400
(`error.code` = its `code`, `error.param` = its `param`). No web framework is imported here: requests
arrive as plain dicts.

    api="openai"     Chat Completions: response_format, tools [{type: function, function: {name,
                     parameters, strict}}], tool_choice none|auto|required|{type: function, function: {name}}
                     or {type: allowed_tools, allowed_tools: {mode, tools}}
    api="responses"  Responses: response_format is `text.format`; tools [{type: function, name, parameters,
                     strict}], tool_choice none|auto|required|{type: function, name}|{type: allowed_tools, ...}
    api="anthropic"  Messages: response_format is `output_format` (or `output_config.format`); tools [{name,
                     input_schema}], tool_choice {type: auto|any|tool|none, name, disable_parallel_tool_use}

A tool choice that forces a call (required / a named function / any / tool) wins over response_format:
the answer is then tool calls in the model's format, their arguments valid for the tools' schemas. A
schema keyword llguidance cannot enforce is an error unless the request says `strict: false`, which
makes it best effort (such keywords are ignored). `structured_outputs` is the vLLM-style extension
{json | regex | choice | grammar | json_object}.
"""
from __future__ import annotations

from engine.constraints import Constraint, ConstraintError, check

APIS = ("openai", "responses", "anthropic")


def constraint_for(response_format: dict | None = None, tools: list | None = None, tool_choice=None,
                   api: str = "openai", *, parallel_tool_calls: bool | None = None,
                   structured_outputs: dict | None = None) -> Constraint | None:
    """The checked Constraint a request asks for, or None for free text; ConstraintError (a 400) for a
    malformed field or a schema/grammar that cannot be enforced, with `param` naming the field."""
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, not {api!r}")
    forced = _forced_tools(tools or [], tool_choice, api)
    if forced is not None:
        chosen, parallel = forced
        if parallel_tool_calls is not None:
            parallel = parallel and bool(parallel_tool_calls)
        lenient = all(t["strict"] is False for t in chosen)
        return _checked(Constraint.tool_calls(chosen, parallel=parallel, lenient=lenient), "tools")
    if structured_outputs:
        return _checked(_structured(structured_outputs), "structured_outputs")
    if response_format:
        param = {"openai": "response_format", "responses": "text.format", "anthropic": "output_format"}[api]
        return _response_format(response_format, api, param)
    return None


def _checked(constraint: Constraint | None, param: str) -> Constraint | None:
    if constraint is None:
        return None
    try:
        check(constraint)
    except ConstraintError as exc:
        exc.param = exc.param or param
        raise
    return constraint


def _bad(message: str, param: str, code: str = "invalid_response_format") -> ConstraintError:
    return ConstraintError(code, message, "see the API reference for this field", param=param)


def _response_format(fmt: dict, api: str, param: str) -> Constraint | None:
    if not isinstance(fmt, dict):
        raise _bad(f"{param} must be an object", param)
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return _checked(Constraint.json_object(), param)
    if kind != "json_schema":
        raise _bad(f"{param}.type {kind!r} is not supported (text, json_object or json_schema)", param)
    body = fmt.get("json_schema") if api == "openai" else fmt
    where = f"{param}.json_schema" if api == "openai" else param
    if not isinstance(body, dict) or "schema" not in body:
        raise _bad(f"{where}.schema is missing", where + ".schema")
    try:
        constraint = Constraint.json_schema(body["schema"], lenient=body.get("strict") is False)
    except ConstraintError as exc:
        exc.param = where + ".schema"
        raise
    return _checked(constraint, where + ".schema")


def _structured(so: dict) -> Constraint:
    if not isinstance(so, dict):
        raise _bad("structured_outputs must be an object", "structured_outputs")
    keys = [k for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) not in (None, False)]
    if len(keys) != 1:
        raise _bad("structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
                   "structured_outputs")
    key = keys[0]
    value = so[key]
    if key == "json_object":
        return Constraint.json_object()
    if key == "json":
        return Constraint.json_schema(value)
    if key == "regex":
        return Constraint.regex(value)
    if key == "choice":
        return Constraint.choice(value)
    return Constraint.grammar(value)


# ---- tools -------------------------------------------------------------------------------------------

def _tool(entry, api: str, i: int) -> dict | None:
    """{"name", "parameters", "strict"} of one tool entry; None for a tool that is not a function."""
    param = f"tools[{i}]"
    if not isinstance(entry, dict):
        raise _bad(f"{param} must be an object", param, "invalid_tool_choice")
    if api == "anthropic":
        if "input_schema" not in entry and entry.get("type") not in (None, "custom"):
            return None  # a server tool (web search, ...): not ours to call
        return {"name": entry.get("name"), "parameters": entry.get("input_schema") or {}, "strict": entry.get("strict")}
    if entry.get("type", "function") != "function":
        return None
    fn = entry.get("function", {}) if api == "openai" else entry
    if not isinstance(fn, dict):
        raise _bad(f"{param}.function must be an object", param, "invalid_tool_choice")
    return {"name": fn.get("name"), "parameters": fn.get("parameters") or {}, "strict": fn.get("strict")}


def _forced_tools(tools: list, choice, api: str) -> tuple[list[dict], bool] | None:
    """(the tools a call must use, whether several calls may follow) when tool_choice forces a call."""
    if choice is None:
        return None
    named = [t for t in (_tool(e, api, i) for i, e in enumerate(tools)) if t is not None]
    if api == "anthropic":
        if not isinstance(choice, dict):
            raise _bad("tool_choice must be an object", "tool_choice", "invalid_tool_choice")
        kind, parallel = choice.get("type"), not choice.get("disable_parallel_tool_use", False)
        if kind in ("auto", "none"):
            return None
        if kind == "any":
            return _need(named), parallel
        if kind == "tool":
            return [_by_name(named, choice.get("name"))], False
        raise _bad(f"tool_choice.type {kind!r} is not auto, any, tool or none", "tool_choice", "invalid_tool_choice")
    if isinstance(choice, str):
        if choice in ("auto", "none"):
            return None
        if choice == "required":
            return _need(named), True
        raise _bad(f"tool_choice {choice!r} is not none, auto or required", "tool_choice", "invalid_tool_choice")
    if not isinstance(choice, dict):
        raise _bad("tool_choice must be a string or an object", "tool_choice", "invalid_tool_choice")
    if choice.get("type") == "allowed_tools":
        spec = choice.get("allowed_tools", {}) if api == "openai" else choice
        if spec.get("mode", "auto") != "required":
            return None
        names = [(t.get("function") or {}).get("name") if api == "openai" else t.get("name")
                 for t in spec.get("tools") or []]
        return _need([_by_name(named, n) for n in names]), True
    if choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name") if api == "openai" else choice.get("name")
        return [_by_name(named, name)], False
    raise _bad(f"tool_choice.type {choice.get('type')!r} is not supported", "tool_choice", "invalid_tool_choice")


def _need(tools: list[dict]) -> list[dict]:
    if not tools:
        raise _bad("tool_choice requires a call but no function tools were given", "tools", "invalid_tool_choice")
    return tools


def _by_name(tools: list[dict], name) -> dict:
    for t in tools:
        if t["name"] == name:
            return t
    known = ", ".join(str(t["name"]) for t in tools) or "none"
    raise _bad(f"tool_choice names {name!r}, which is not among the tools ({known})", "tool_choice",
               "invalid_tool_choice")
