"""Output constraints (runtime spec §3.10): any JSON object, a JSON Schema, a regex, a Lark (or GBNF)
grammar or a fixed choice, enforced token by token through llguidance.

`Constraint` says what the answer must match: tokenizer-free, hashable, cheap to build and to `check()`
before any model is loaded. `new_matcher(constraint, tokenizer, vocab_size, stop_ids)` gives the
per-sequence `ConstraintMatcher`: the sampler asks it for the allowed ids before every draw (`mask()`)
and tells it every token that joins the answer (`accept()`); a stop id is allowed only where the grammar
accepts, and `done` says when the grammar is complete. With `overlap`, the next mask is computed on a
worker thread after `accept()` (llguidance releases the GIL) while the model runs its step.

A constraint with `after` (a thinking model's `</think>`) leaves the text before that marker free, with
only the stop ids barred, and then admits newlines before the grammar (the template's layout after the
marker). JSON is written on one line with ", " and ": " between items (`JSON_LAYOUT`; a schema's own
`x-guidance` options override it) so a small model cannot wander into endless whitespace.
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Sequence

import numpy as np

from engine.errors import NinferError

KINDS = ("json", "json_schema", "regex", "grammar", "choice", "llguidance")
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_LAYOUT_RULE = "start: LAYOUT? @body\nLAYOUT: /\\n+/\n"  # newlines between the marker and the answer

_NEXT = {
    "invalid_json_schema": "fix the schema (it must be a JSON object in JSON Schema form)",
    "unsupported_json_schema": "drop those keywords from the schema, or ask without strict enforcement",
    "unsatisfiable_json_schema": "no value can match this schema: loosen its bounds",
    "invalid_regex": "fix the regular expression (Rust regex syntax: no look-around or backreferences)",
    "invalid_grammar": "fix the grammar (Lark syntax as llguidance reads it, or GBNF with a root rule)",
    "invalid_choice": "give a non-empty list of distinct strings",
    "invalid_tool_choice": "name one of the tools offered",
    "constraint_dead_end": "the model reached a state the constraint cannot continue from; report the schema",
    "constraint_needs_tokenizer": "structured output needs the model's tokenizer (re-convert the model)",
}


class ConstraintError(NinferError):
    """A constraint that cannot be enforced. `code` names the kind of problem (invalid_json_schema,
    unsupported_json_schema, unsatisfiable_json_schema, invalid_regex, invalid_grammar, invalid_choice,
    constraint_dead_end); `param` is the request field it came from, when a server knows it."""

    def __init__(self, code: str, message: str, next_action: str | None = None, param: str | None = None):
        super().__init__(message, next_action if next_action is not None else _NEXT.get(code))
        self.code = code
        self.param = param


@dataclass(frozen=True)
class Constraint:
    """What the answer must match. `kind` is one of KINDS; `source` is the schema as JSON text, the
    regex, the grammar text, or the choices as a JSON list; `after` leaves the text up to that marker
    free; `lenient` (json_schema) ignores keywords llguidance cannot enforce instead of refusing them.
    Kind "llguidance" holds a whole llguidance grammar (`tool_calls` builds one).
    Build one with the class methods; `check()` raises ConstraintError for one that cannot be enforced."""

    kind: str
    source: str = ""
    after: str | None = None
    lenient: bool = False

    @classmethod
    def json_object(cls) -> "Constraint":
        """Any JSON object."""
        return cls("json")

    @classmethod
    def json_schema(cls, schema, *, lenient: bool = False) -> "Constraint":
        """A JSON Schema, as a dict or as JSON text."""
        if isinstance(schema, (str, bytes)):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ConstraintError("invalid_json_schema", f"the JSON schema is not valid JSON: {exc}") from None
        if schema is False:
            raise ConstraintError("unsatisfiable_json_schema", "the JSON schema `false` matches nothing")
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise ConstraintError("invalid_json_schema", f"a JSON schema is an object, not {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, ensure_ascii=False), lenient=lenient)

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        """The whole answer matches `pattern` (Rust regex syntax)."""
        if not isinstance(pattern, str) or not pattern:
            raise ConstraintError("invalid_regex", "the regular expression is empty")
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str) -> "Constraint":
        """A Lark grammar as llguidance reads it (`start` rule), or a GBNF one (`root ::= ...`)."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError("invalid_grammar", "the grammar is empty")
        return cls("grammar", text)

    @classmethod
    def choice(cls, options: Sequence[str]) -> "Constraint":
        """The answer is exactly one of `options`."""
        opts = list(options) if not isinstance(options, str) else [options]
        if not opts or not all(isinstance(o, str) and o for o in opts):
            raise ConstraintError("invalid_choice", "choices must be non-empty strings")
        if len(set(opts)) != len(opts):
            raise ConstraintError("invalid_choice", "the choices repeat an option")
        return cls("choice", json.dumps(opts, ensure_ascii=False))

    @classmethod
    def tool_calls(cls, tools: Sequence[dict], *, parallel: bool = True, lenient: bool = False) -> "Constraint":
        """One tool call (or several, when `parallel`) in Qwen's XML form (engine.text.tools), each to one
        of `tools` ({"name", "parameters": JSON Schema}) with every argument valid for its schema: the
        declared properties in order (required ones always), each value as JSON. The calls parse with
        `engine.text.tools.parse_tool_calls`."""
        if not tools:
            raise ConstraintError("invalid_tool_choice", "a tool call was required but no tools were given",
                                  "offer the tools in `tools`, or drop tool_choice")
        return cls("llguidance", _tool_call_grammar(tools, parallel, lenient))

    def starting_after(self, marker: str | None) -> "Constraint":
        """The same constraint, applied only to the text after `marker` (None: from the first token)."""
        return replace(self, after=marker or None)

    def describe(self) -> str:
        """A short name for messages: "JSON object", "JSON schema", "regex", "grammar", "choice of 3"."""
        if self.kind == "choice":
            return f"choice of {len(json.loads(self.source))}"
        return {"json": "JSON object", "json_schema": "JSON schema", "llguidance": "tool call"}.get(self.kind, self.kind)


def check(constraint: Constraint) -> list[str]:
    """Raise ConstraintError when `constraint` cannot be enforced; return llguidance's warnings (e.g. the
    keywords a lenient schema ignores)."""
    return _compiled(constraint)[1]


@lru_cache(maxsize=128)
def _compiled(constraint: Constraint) -> tuple[str, list[str]]:
    """(llguidance grammar text, warnings), checked."""
    import llguidance as llg

    grammar = _grammar_text(constraint, llg)
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise _rejected(constraint, messages[0] if messages else "rejected")
    return grammar, list(messages)


def _grammar_text(c: Constraint, llg) -> str:
    if c.kind not in KINDS:
        raise ValueError(f"unknown constraint kind {c.kind!r} (one of {', '.join(KINDS)})")
    if c.kind in ("json", "json_schema"):
        schema = json.loads(c.source) if c.kind == "json_schema" else {"type": "object"}
        layout = {**JSON_LAYOUT, "lenient": True} if c.lenient else JSON_LAYOUT
        text = llg.LLMatcher.grammar_from_json_schema(schema, defaults=layout)
    elif c.kind == "regex":
        text = llg.LLMatcher.grammar_from_regex(c.source)
    elif c.kind == "grammar":
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            lark = any_to_lark(c.source)
        except Exception as exc:  # noqa: BLE001 - the converter raises several types for bad GBNF
            raise ConstraintError("invalid_grammar", f"the GBNF grammar does not convert: {exc}") from None
        text = llg.LLMatcher.grammar_from_lark(lark)
    elif c.kind == "choice":
        lark = "start: " + " | ".join(json.dumps(o) for o in json.loads(c.source))
        text = llg.LLMatcher.grammar_from_lark(lark)
    else:
        text = c.source
    if c.after is None:
        return text
    top = json.loads(text) if text.lstrip().startswith("{") else {"grammars": [{"lark_grammar": text}]}
    first, *rest = top["grammars"]  # the first grammar is the start; nothing refers to it by name
    top["grammars"] = [{"lark_grammar": _LAYOUT_RULE}, {**first, "name": "body"}, *rest]
    return json.dumps(top)


def _tool_call_grammar(tools: Sequence[dict], parallel: bool, lenient: bool) -> str:
    """A llguidance grammar (JSON text): a Lark start grammar for the XML around the calls, and one JSON
    Schema grammar an argument value, referred to as @t<i>_<j>."""
    import llguidance as llg

    lit = json.dumps  # a JSON string is a Lark string literal
    layout = {**JSON_LAYOUT, "lenient": True} if lenient else JSON_LAYOUT
    rules, schemas, calls = [], [], []
    for i, tool in enumerate(tools):
        name, params = tool.get("name"), tool.get("parameters") or {}
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ConstraintError("invalid_tool_choice", f"tool name {name!r} is not [A-Za-z0-9_-]+", "rename the tool")
        if not isinstance(params, dict) or not isinstance(params.get("properties") or {}, dict):
            raise ConstraintError("invalid_json_schema", f"tool {name}: parameters must be an object schema")
        required = set(params.get("required") or ())
        args = []
        for j, (arg, schema) in enumerate((params.get("properties") or {}).items()):
            ref = f"t{i}_{j}"
            (g,) = json.loads(llg.LLMatcher.grammar_from_json_schema(schema, defaults=layout))["grammars"]
            schemas.append({**g, "name": ref})
            rules.append(f"{ref}_p: {lit(f'<parameter={arg}>' + chr(10))} @{ref} {lit(chr(10) + '</parameter>' + chr(10))}")
            args.append(f"{ref}_p" + ("" if arg in required else "?"))
        head, tail = lit(f"<tool_call>\n<function={name}>\n"), lit("</function>\n</tool_call>")
        rules.append(f"t{i}: {head} {' '.join(args)} {tail}")
        calls.append(f"t{i}")
    start = f"start: call ({lit(chr(10))} call)*" if parallel else "start: call"
    lark = "\n".join([start, "call: " + " | ".join(calls), *rules]) + "\n"
    return json.dumps({"grammars": [{"lark_grammar": lark}, *schemas]})


def _one_line(message: str, kind: str) -> str:
    """llguidance's message on one line: its first line plus the `error:` detail of a regex parse error
    (the source excerpts are dropped); for a regex, the position in the Lark wrapper is dropped too."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()] or ["rejected"]
    detail = next((ln[len("error:"):].strip() for ln in lines[1:] if ln.startswith("error:")), "")
    first = lines[0] + (" " + detail if detail else "")
    if kind in ("regex", "choice"):
        return re.sub(r"^at \d+\(\d+\): ", "", first).replace(" (in regex)", "")
    return re.sub(r"^at (\d+)\((\d+)\): ", r"line \1, column \2: ", first)


def _rejected(c: Constraint, message: str) -> ConstraintError:
    first = _one_line(message, c.kind)
    if c.kind in ("json", "json_schema", "llguidance"):
        if first.startswith(("Unimplemented keys", "Unknown format")):
            return ConstraintError("unsupported_json_schema", f"the JSON schema uses what ninfer cannot enforce: {first}")
        if first.startswith("Unsatisfiable"):
            return ConstraintError("unsatisfiable_json_schema", f"the JSON schema cannot be satisfied: {first}")
        return ConstraintError("invalid_json_schema", f"invalid JSON schema: {first}")
    code = {"regex": "invalid_regex", "grammar": "invalid_grammar", "choice": "invalid_choice"}[c.kind]
    what = {"regex": "regular expression", "grammar": "grammar", "choice": "choice"}[c.kind]
    return ConstraintError(code, f"invalid {what}: {first}")


# ---- tokenizer bridge ----------------------------------------------------------------------------

_LLTOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class _TokenTable:
    """What llguidance's TokenizerWrapper reads: every id's bytes, the special ids, an encoder. Added tokens
    that are not special (Qwen's `<tool_call>`, `</think>`) stay text, so a grammar's "<tool_call>" literal
    can be that one token (llguidance's own HF bridge would treat every added token as special)."""

    def __init__(self, tokenizer, vocab_size: int):
        n = tokenizer.vocab_size  # the rows past it (Qwen's padded head) spell nothing and are never allowed
        self.tokens = [tokenizer.token_bytes(i) for i in range(n)] + [b""] * max(0, vocab_size - n)
        self.special_token_ids = sorted(tokenizer.special_ids)
        eos = tuple(getattr(tokenizer, "eos_token_ids", ()))
        self.eos_token_id = eos[0] if eos else None
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None)
        self._encode = tokenizer.encode

    def __call__(self, text):
        if not isinstance(text, str):
            raise TypeError("text only")  # the wrapper then always hands us str
        return self._encode(text)


def llg_tokenizer(tokenizer, vocab_size: int):
    """llguidance's view of an `engine.text.tokenizer.Tokenizer` over `vocab_size` logits (built once a
    tokenizer and size: 0.4 s for SmolLM2's 49,152 ids, 2.6 s for Qwen3.6's 248,320)."""
    import llguidance as llg

    with _LOCK:
        per = _LLTOKENIZERS.setdefault(tokenizer, {})
        if vocab_size not in per:
            eos = list(getattr(tokenizer, "eos_token_ids", ())) or None
            wrapper = llg.TokenizerWrapper(_TokenTable(tokenizer, int(vocab_size)))
            per[vocab_size] = llg.LLTokenizer(wrapper, eos_token=eos)
        return per[vocab_size]


# ---- per-sequence matcher ------------------------------------------------------------------------

_WORKER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ninfer-mask")


def new_matcher(constraint: Constraint, tokenizer, vocab_size: int, stop_ids: Sequence[int] = (), *,
                overlap: bool = True) -> "ConstraintMatcher":
    """A fresh matcher of `constraint` for one sequence over logits of `vocab_size` ids. `stop_ids` end
    the answer: allowed only where the grammar accepts (and never in the free text before `after`).
    `overlap=False` computes each mask when it is asked for instead of on the worker thread."""
    if tokenizer is None or not hasattr(tokenizer, "token_bytes"):
        raise ConstraintError("constraint_needs_tokenizer", "this model has no tokenizer to build a mask over")
    grammar, _ = _compiled(constraint)
    return ConstraintMatcher(constraint, grammar, llg_tokenizer(tokenizer, vocab_size), tokenizer, int(vocab_size),
                             stop_ids, overlap=overlap)


class ConstraintMatcher:
    """The grammar state of one sequence. `mask()` -> bool [vocab] of the ids allowed next; `accept(id)`
    after every token the sequence takes; `done` once the grammar is complete (only a stop id may
    follow); `bitmask()` the same mask as int32 words (bit i of word i // 32) for a device sampler."""

    def __init__(self, constraint: Constraint, grammar: str, lltok, tokenizer, vocab_size: int,
                 stop_ids: Sequence[int] = (), *, overlap: bool = True):
        import llguidance as llg

        self.constraint = constraint
        self.vocab_size = vocab_size
        self.stop_ids = np.array(sorted({int(t) for t in stop_ids if 0 <= int(t) < vocab_size}), np.int64)
        self.stop_id = int(self.stop_ids[0]) if self.stop_ids.size else None
        self._m = llg.LLMatcher(lltok, grammar, log_level=0)
        if self._m.is_error():
            raise _rejected(constraint, self._m.get_error())
        self._token_bytes = tokenizer.token_bytes
        self._marker = constraint.after.encode("utf-8") if constraint.after else None
        self._tail = b""
        # (a tokenizer without an end-of-sequence id gets one more id from llguidance: its mask is that wide)
        self._words = np.zeros((max(vocab_size, lltok.vocab_size) + 31) // 32, np.int32)
        self._allowed: np.ndarray | None = None
        self._pending: Future | None = None
        self._overlap = overlap
        self.stopped = False  # a stop id was accepted
        self._complete = False  # the grammar can take nothing more (read before the worker starts)
        self._accepting = False
        if self._marker is None:
            self._start()

    @property
    def free(self) -> bool:
        """Whether the text is still before the `after` marker (unconstrained but for the stop ids)."""
        return self._marker is not None

    @property
    def done(self) -> bool:
        """The grammar is complete: nothing but a stop id can follow."""
        return not self.free and (self.stopped or self._complete)

    @property
    def accepting(self) -> bool:
        """The answer so far satisfies the constraint (a stop id is allowed now)."""
        if self.free:
            return False
        self.mask()  # the worker reads the state with the mask; the matcher is not touched meanwhile
        return self._accepting

    def mask(self) -> np.ndarray:
        """bool [vocab_size]: the ids allowed next."""
        if self.free:
            if self._allowed is None:
                self._allowed = np.ones(self.vocab_size, bool)
                self._allowed[self.stop_ids] = False
            return self._allowed
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        elif self._allowed is None:
            self._compute()
        return self._allowed

    def bitmask(self) -> np.ndarray:
        """int32 [(vocab_size + 31) // 32]: `mask()` packed, bit (i % 32) of word i // 32 for id i."""
        words = np.zeros((self.vocab_size + 31) // 32 * 4, np.uint8)
        packed = np.packbits(self.mask(), bitorder="little")
        words[: packed.size] = packed
        return words.view(np.int32)

    def allows(self, token: int) -> bool:
        """Whether `token` may come next."""
        return bool(self.mask()[int(token)])

    def accept(self, token: int) -> None:
        """Take `token` as the sequence's next id; starts computing the following mask."""
        token = int(token)
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        if token in self.stop_ids:
            self.stopped = True
            return
        if self.free:
            self._tail = (self._tail + self._token_bytes(token))[-(len(self._marker) + 16):]
            if self._marker in self._tail:
                self._marker, self._allowed = None, None
                self._start()
            return
        if not self._m.consume_token(token):
            raise ConstraintError("constraint_dead_end",
                                  f"token {token} does not fit the {self.constraint.describe()} here")
        self._allowed = None
        self._complete = self._m.is_stopped()
        if not self._complete:
            self._start()

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` (drafts) the constraint allows in a row from here, without taking them."""
        tokens = [int(t) for t in tokens]
        if self.free:  # up to a stop id, or through the token that completes the marker (the rule changes there)
            tail = self._tail
            for i, t in enumerate(tokens):
                if t in self.stop_ids:
                    return i
                tail = (tail + self._token_bytes(t))[-(len(self._marker) + 16):]
                if self._marker in tail:
                    return i + 1
            return len(tokens)
        self.mask()  # let a pending mask finish before the matcher is read
        return int(self._m.validate_tokens(tokens))

    def draft_masks(self, drafts: Sequence[int]) -> list[np.ndarray]:
        """For speculative verification: the masks of the columns after each draft the constraint allows,
        [mask now, after d_1, ..., after d_A] (A = `valid_prefix(drafts)`); the state is left as it was.
        A verifier accepts at most the A allowed drafts and draws each column's token under its mask."""
        allowed = self.valid_prefix(drafts)
        masks = [self.mask().copy()]
        if self.free or not allowed:
            return masks + [masks[0]] * allowed
        saved = (self._allowed, self._accepting, self._complete)
        for tok in drafts[:allowed]:
            self._m.consume_token(int(tok))
            self._compute()
            masks.append(self._allowed)
        self._m.rollback(allowed)
        self._allowed, self._accepting, self._complete = saved
        return masks

    def _start(self) -> None:
        self._allowed = None
        if self._overlap:
            self._pending = _WORKER.submit(self._compute)

    def _compute(self) -> None:
        self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if self._m.is_error():
            raise ConstraintError("constraint_dead_end", f"the {self.constraint.describe()} failed: "
                                  f"{_one_line(self._m.get_error(), self.constraint.kind)}")
        allowed = np.unpackbits(self._words.view(np.uint8), count=self.vocab_size, bitorder="little").view(bool)
        self._accepting = self._m.is_accepting()
        allowed[self.stop_ids] = self._accepting
        if not allowed.any():
            raise ConstraintError("constraint_dead_end", f"no token can continue the {self.constraint.describe()}")
        self._allowed = allowed


def accepts(constraint: Constraint, tokenizer, text: str, vocab_size: int | None = None) -> bool:
    """Whether `text` (re-tokenized from scratch) is a complete answer under `constraint`."""
    import llguidance as llg

    grammar, _ = _compiled(replace(constraint, after=None))
    m = llg.LLMatcher(llg_tokenizer(tokenizer, vocab_size or tokenizer.vocab_size), grammar, log_level=0)
    return m.consume_tokens(tokenizer.encode(text)) and m.is_accepting()
