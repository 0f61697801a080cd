"""Chat templates: a model's Jinja template rendered in a sandbox, the way `transformers` renders it.

Same environment as `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls, a `tojson` that
keeps non-ASCII, `raise_exception`, `strftime_now`), so the prompt a model sees here equals the prompt
it was trained with. Templates come from the artifact and are untrusted: rendering is sandboxed.
"""
from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import lru_cache

from engine.errors import NinferError

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (HF assistant masks): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    class _Namespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore names (no reaching into CPython internals)."""

        def __init__(*args, **kwargs):  # noqa: N805 - same signature trick as jinja's Namespace
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                _Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def _prepare(messages: list[dict]) -> list[dict]:
    """Expose reasoning under `reasoning_content` (what Qwen templates read) and `thinking`; turn OpenAI-style
    JSON-string tool arguments into the mapping templates iterate over."""
    out = []
    for m in messages:
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        for call in m.get("tool_calls") or ():
            fn = call.get("function", call)
            if isinstance(fn.get("arguments"), str):
                try:
                    parsed = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    fn["arguments"] = parsed
        out.append(m)
    return out


class ChatTemplate:
    """A compiled chat template; `render(messages, tools=..., **kwargs)` gives the prompt text."""

    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None):
        self.source = source
        self.special = {k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v}
        try:
            self._template = _compile(source)
        except Exception as exc:  # noqa: BLE001 - a template syntax error of any kind
            raise NinferError(f"the model's chat template does not compile: {exc}",
                              "pass a working template with --chat-template FILE") from exc

    @classmethod
    def from_artifact(cls, artifact, tokenizer=None) -> "ChatTemplate | None":
        """The artifact's `chat_template.jinja` resource (or the tokenizer's), None when it has none."""
        source = None
        try:
            source = artifact.resource("chat_template.jinja").decode("utf-8")
        except Exception:  # noqa: BLE001 - absent resource
            source = getattr(tokenizer, "chat_template", None)
        if not source:
            return None
        return cls(source, bos_token=getattr(tokenizer, "bos_token", None),
                   eos_token=getattr(tokenizer, "eos_token", None))

    def accepts(self, name: str) -> bool:
        """Whether the template source mentions a variable (e.g. `reasoning_effort`, `enable_thinking`)."""
        return name in self.source

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = True,
               **kwargs) -> str:
        """The prompt text for `messages` (and `tools` JSON schemas); extra kwargs reach the template."""
        import jinja2

        messages = _prepare(copy.deepcopy(list(messages)))
        context = {**self.special, **{k: v for k, v in kwargs.items() if v is not None}}
        try:
            return self._template.render(messages=messages, tools=copy.deepcopy(tools), documents=None,
                                         add_generation_prompt=add_generation_prompt, **context)
        except jinja2.exceptions.TemplateError as exc:
            raise NinferError(f"the chat template refused this conversation: {exc}",
                              "check the roles and options (e.g. --reasoning-effort) you passed") from exc


def simple_prompt(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """ChatML fallback for models shipped without a template."""
    text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")
