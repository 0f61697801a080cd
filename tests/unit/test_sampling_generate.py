"""engine.generate over a fake protocol engine: token order, stops, stop strings held across tokens, cancel."""
import threading

import numpy as np
import pytest

from engine.generate import GenerationConfig, _StopStrings, generate_step, stream_generate
from engine.sampling import Sampler

VOCAB = 8


class Scripted:
    """Greedy picks `script[position - prompt_len]`; records what was fed back."""

    def __init__(self, script):
        self.script, self.fed, self.position, self.start = list(script), [], 0, 0

    def _logits(self):
        x = np.zeros(VOCAB, np.float32)
        i = self.position - self.start
        x[self.script[i] if i < len(self.script) else 0] = 5.0
        return x

    def prefill(self, ids):
        self.position = self.start = len(ids)
        return self._logits()

    def decode_step(self, tok):
        self.fed.append(tok)
        self.position += 1
        return self._logits()


class Letters:
    def add(self, t):
        return "abcdefgh"[t]

    def flush(self):
        return ""


def run(script, cfg, stops=(), cancel=None):
    eng = Scripted(script)
    recs = list(stream_generate(eng, [1, 2, 3], cfg, Sampler(temperature=0.0), detokenizer=Letters(),
                                stop_token_ids=stops, cancel=cancel))
    return eng, recs


def test_generate_step_is_lazy_and_counts_positions():
    eng = Scripted([4, 5, 6, 7])
    gen = generate_step(eng, [0, 1], Sampler(temperature=0.0), max_tokens=3)
    assert next(gen) == 4 and eng.fed == []  # nothing fed back until the next token is asked for
    assert list(gen) == [5, 6]
    assert eng.fed == [4, 5]  # the last token is never fed


def test_length_finish_and_text():
    eng, recs = run([1, 2, 3, 4, 5], GenerationConfig(max_tokens=3))
    assert [r.token for r in recs] == [1, 2, 3]
    assert "".join(r.text for r in recs) == "bcd"
    assert [r.finish_reason for r in recs] == [None, None, "length"]
    assert recs[-1].generation_tokens == 3 and recs[-1].prompt_tokens == 3


def test_stop_token_is_not_text():
    eng, recs = run([1, 2, 7, 3], GenerationConfig(max_tokens=10), stops=(7,))
    assert "".join(r.text for r in recs) == "bc"
    assert recs[-1].finish_reason == "stop" and recs[-1].token == 7 and recs[-1].generation_tokens == 2
    assert eng.fed == [1, 2]


@pytest.mark.parametrize("stop,want", [("de", "abc"), ("cdx", "abcdefg"), ("a", "")])
def test_stop_strings_across_tokens(stop, want):
    eng, recs = run([0, 1, 2, 3, 4, 5, 6], GenerationConfig(max_tokens=7, stop_strings=(stop,)))
    assert "".join(r.text for r in recs) == want
    assert recs[-1].finish_reason == ("length" if stop == "cdx" else "stop")


def test_held_text_is_released_when_the_prefix_breaks():
    cut = _StopStrings(["xyz"])
    assert cut.feed("abx") == ("ab", False)
    assert cut.feed("y") == ("", False)
    assert cut.feed("q") == ("xyq", False)
    assert cut.feed("xyzzy") == ("", True)


def test_cancel_ends_with_cancelled_and_feeds_nothing_more():
    cancel = threading.Event()
    eng = Scripted([1, 2, 3, 4, 5, 6])
    recs = []
    for r in stream_generate(eng, [0], GenerationConfig(max_tokens=6), Sampler(temperature=0.0),
                             detokenizer=Letters(), cancel=cancel):
        recs.append(r)
        if r.token == 2:
            cancel.set()
    assert [r.token for r in recs] == [1, 2, None]
    assert recs[-1].finish_reason == "cancelled" and eng.fed == [1]


def test_zero_max_tokens():
    eng, recs = run([1], GenerationConfig(max_tokens=0))
    assert len(recs) == 1 and recs[0].finish_reason == "length" and recs[0].token is None
