"""Tokenizer construction, byte-safe detokenizer, reasoning split, tool-call parsing (no model needed)."""
import json

import pytest

from engine.errors import NinferError
from engine.text.detokenize import Detokenizer
from engine.text.reasoning import (
    THINKING_BUDGET_CLOSE,
    ReasoningSplitter,
    normalize_effort,
    starts_in_thinking,
)
from engine.text.tokenizer import Tokenizer, build_bpe_json, bytes_to_unicode, tiktoken_to_tokenizer_json
from engine.text.tools import parse_tool_calls


@pytest.fixture(scope="module")
def byte_tok():
    """A byte-level BPE with the 256 byte tokens, two merges and ChatML specials."""
    spell = bytes_to_unicode()
    vocab = {spell[b]: b for b in range(256)}
    merges = [("h", "i"), ("Ġ", "hi")]
    vocab["hi"], vocab["Ġhi"] = 256, 257
    specials = [(258, "<|im_start|>", True), (259, "<|im_end|>", True), (260, "<think>", False),
                (261, "</think>", False)]
    js = build_bpe_json(vocab, merges, specials, "default")
    return Tokenizer.from_json(js, {"eos_token": "<|im_end|>"})


def test_bpe_merges_and_specials(byte_tok):
    assert byte_tok.encode("hi hi") == [256, 257]
    assert byte_tok.encode("<|im_start|>hi<|im_end|>") == [258, 256, 259]
    assert byte_tok.eos_token_ids == (259,)
    assert byte_tok.decode(byte_tok.encode("héllo 🙂 日本")) == "héllo 🙂 日本"


def test_detokenizer_holds_partial_utf8(byte_tok):
    text = "a🙂b日本"
    ids = byte_tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))  # one id per byte: the emoji spans four ids
    d = Detokenizer(byte_tok)
    pieces = [d.add(i) for i in ids]
    assert "".join(pieces) + d.flush() == text
    assert "\ufffd" not in "".join(pieces)
    assert pieces[1:4] == ["", "", ""] and pieces[4] == "🙂"


def test_detokenizer_flushes_broken_bytes(byte_tok):
    d = Detokenizer(byte_tok)
    assert d.add(0xF0) == ""  # lead byte of a 4-byte character, never completed
    assert d.flush() == "\ufffd"


def test_detokenizer_emits_special_text(byte_tok):
    d = byte_tok.detokenizer()
    assert d.add(260) + d.add(256) + d.add(261) == "<think>hi</think>"


def test_tiktoken_conversion_matches_bpe_semantics():
    ranks = {bytes([b]): b for b in range(256)}
    for word in (b"ab", b"abc", b"bc", b"abcd", b" a"):
        ranks[word] = len(ranks)
    js = tiktoken_to_tokenizer_json(ranks, {"<|endoftext|>": len(ranks)})
    tok = Tokenizer.from_json(js)
    # " abc": tiktoken merges the lowest-ranked pair first: ab (256) -> [" ", "ab", "c"] -> abc -> [" ", "abc"]
    assert tok.encode("abcd abc") == [ranks[b"abcd"], ranks[b" "], ranks[b"abc"]]
    assert tok.encode("bc<|endoftext|>") == [ranks[b"bc"], len(ranks)]


@pytest.mark.parametrize("raw, norm", [("none", "off"), ("Off", "off"), ("minimal", "low"), ("xhigh", "high"),
                                       ("max", "high"), ("medium", "medium"), (None, None)])
def test_normalize_effort(raw, norm):
    assert normalize_effort(raw) == norm


def test_normalize_effort_rejects_unknown():
    with pytest.raises(NinferError):
        normalize_effort("extreme")


def _split(chunks, thinking):
    sp = ReasoningSplitter(thinking)
    r = c = ""
    for ch in chunks:
        a, b = sp.feed(ch)
        r, c = r + a, c + b
    a, b = sp.flush()
    return r + a, c + b


@pytest.mark.parametrize("chunks", [["Let me see.</think>\n\nParis."], ["Let me see.</th", "ink>\n\nParis."],
                                    ["Let me", " see.<", "/", "think", ">", "\n", "\nParis", "."]])
def test_splitter_cuts_at_close_tag_across_chunks(chunks):
    assert _split(chunks, True) == ("Let me see.", "Paris.")


def test_splitter_opens_on_leading_think_tag():
    assert _split(["<thi", "nk>\nhmm</think>\n\nok"], False) == ("hmm", "ok")
    assert _split(["Say <think> literally"], False) == ("", "Say <think> literally")


def test_splitter_unclosed_reasoning_stays_reasoning():
    assert _split(["still thinking </thi"], True) == ("still thinking </thi", "")


def test_budget_close_text_closes_the_block():
    assert _split(["a", THINKING_BUDGET_CLOSE, "answer"], True)[1] == "answer"


def test_starts_in_thinking():
    assert starts_in_thinking("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert not starts_in_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_in_thinking("<|im_start|>assistant\n")


CALL = ("I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def test_parse_tool_call():
    content, calls = parse_tool_calls(CALL)
    assert content == "I'll check."
    assert len(calls) == 1 and calls[0]["type"] == "function"
    assert calls[0]["id"].startswith("call_") and len(calls[0]["id"]) == 5 + 16
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 3}


def test_parse_two_calls_and_json_values():
    block = "<tool_call>\n<function=f>\n<parameter=x>\n{\"a\": [1, 2]}\n</parameter>\n</function>\n</tool_call>"
    content, calls = parse_tool_calls(block + "\n" + block.replace("=f>", "=g-2>"))
    assert content == "" and [c["function"]["name"] for c in calls] == ["f", "g-2"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"x": {"a": [1, 2]}}


@pytest.mark.parametrize("bad", [
    "<tool_call>\n<function=bad name>\n</function>\n</tool_call>",
    "<tool_call>\n<function=f>\n</function>\n<function=g>\n</function>\n</tool_call>",
    "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n",
    "<tool_call>\n<function=f>\n</function>\n</tool_call> trailing words",
    "<tool_call>\nstray<function=f>\n</function>\n</tool_call>",
])
def test_malformed_tool_call_is_content(bad):
    assert parse_tool_calls(bad) == (bad, [])


def test_no_tool_call():
    assert parse_tool_calls("plain answer") == ("plain answer", [])
