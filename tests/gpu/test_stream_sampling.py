"""The top-k device sampler (cuda/sample_topk.cu) against engine.sampling.Sampler, penalties included, and the
engine's stream (a step ahead of the reader) against the host loop on the same engine's logits."""
import numpy as np
import pytest

from engine import gpu_engine  # noqa: F401  (imported up front, as test_device_sampling does)
from engine.device_sampling import SAMPLE_PARAMS, TOPK_MAX, pack_params
from engine.gpu.sampling import TOPK_TILE
from engine.sampling import Sampler
from test_device_sampling import HostOnly, _engines, emu  # noqa: E402  (tests/gpu is on sys.path under pytest)

pytestmark = pytest.mark.gpu

V = 248_320
SETTINGS = [dict(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5),
            dict(temperature=0.6, top_k=20, top_p=0.95),
            dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, frequency_penalty=0.3),
            dict(temperature=1.0, top_k=TOPK_MAX, presence_penalty=0.5, frequency_penalty=0.5),
            dict(temperature=0.3, top_k=1), dict(temperature=1.0, top_k=5, min_p=1.5),
            dict(temperature=1.0, top_k=8, top_p=0.0)]


@pytest.fixture(scope="module")
def cp():
    import cupy

    cupy.ones(1)
    return cupy


class TopK:
    """sample_topk_mb over M rows with its own buffers (as the Sampler lays them out)."""

    def __init__(self, cp, M, v=V):
        self.cp, self.M, self.V = cp, M, v
        self.nb = -(-v // TOPK_TILE)
        self.params = cp.zeros((M, SAMPLE_PARAMS), cp.uint64)
        self.counts = cp.zeros((M, v), cp.int32)
        self.key, self.id = cp.zeros((M, self.nb, TOPK_MAX), cp.uint64), cp.zeros((M, self.nb, TOPK_MAX), cp.int32)
        self.ticket = cp.zeros(M, cp.uint32)
        self.tokens, self.pos, self.step = cp.zeros(M, cp.int32), cp.zeros(M, cp.int32), cp.zeros(M, cp.int32)
        self.hist = cp.zeros((M, 8), cp.int32)
        self.words = -(-v // 32)
        self.allow, self.allow_on = cp.zeros((M, self.words), cp.uint32), cp.zeros(M, cp.int32)

    def sample(self, logits, D, samplers, positions, masks=None):
        from engine.gpu.sampling import sample_topk

        cp = self.cp
        lg = cp.asarray(np.ascontiguousarray(logits, np.float32))
        self.params.set(np.stack([pack_params(s) for s in samplers]))
        host = np.zeros((self.M, self.V), np.int32)
        for m, s in enumerate(samplers):
            for t, c in s.counts.items():
                host[m, t] = c
        self.counts.set(host)
        self.pos.set(np.asarray(positions, np.int32) - 1)
        if masks is not None:  # bool [M, V]: the ids each row may draw
            packed = np.zeros((self.M, self.words * 4), np.uint8)
            bits = np.packbits(masks, axis=1, bitorder="little")
            packed[:, :bits.shape[1]] = bits
            self.allow.set(packed.view(np.uint32))
        self.allow_on.fill(int(masks is not None))
        sample_topk(logits=lg, ld=lg.shape[1], domain=D, params=self.params, counts=self.counts, vocab=self.V,
                    cand_key=self.key, cand_id=self.id, tickets=self.ticket, tokens=self.tokens, pos=self.pos,
                    history=self.hist, step=self.step, hist_len=8, allow=self.allow, allow_on=self.allow_on,
                    allow_words=self.words, rows=self.M)()
        cp.cuda.Device().synchronize()
        assert not self.ticket.get().any()
        toks = self.tokens.get().tolist()
        after = self.counts.get()
        for m, t in enumerate(toks):
            assert after[m, t] == host[m, t] + 1  # the drawn token is counted
        return toks


@pytest.mark.parametrize("kind", ["peaked", "llm", "ties", "flat"])
def test_topk_sampler_equals_host_sampler(cp, kind):
    rng = np.random.default_rng({"peaked": 1, "llm": 2, "ties": 3, "flat": 4}[kind])
    M = 4
    dev = TopK(cp, M)
    x = np.stack([emu.make_row(rng, kind, V) for _ in range(M)])
    D = V - 243
    bad = []
    for st in SETTINGS:
        for trial in range(3):
            samplers = [Sampler(seed=int(rng.integers(0, 2**63)), domain=D, **st) for _ in range(M)]
            for s in samplers:
                for t in rng.integers(0, D, int(rng.integers(0, 40))):
                    s.accept(int(t))
            positions = rng.integers(1, 1 << 20, M)
            got = dev.sample(x, D, samplers, positions)
            want = [s(x[m], int(positions[m])) for m, s in enumerate(samplers)]
            if got != want:
                bad.append((st, trial, got, want))
    assert not bad, bad[:3]


def test_topk_sampler_under_a_mask_equals_the_host_sampler(cp):
    """A grammar mask (random bits, a few ids or most): the device draws what the host draws from the masked row."""
    from engine.sampling import mask_logits

    rng = np.random.default_rng(12)
    M, D = 4, V - 243
    dev = TopK(cp, M)
    bad = []
    for trial in range(6):
        x = np.stack([emu.make_row(rng, ["peaked", "llm", "ties"][trial % 3], V) for _ in range(M)])
        masks = rng.random((M, V)) < (0.0005 if trial % 2 else 0.5)
        masks[:, 7] = True  # at least one id allowed
        for st in SETTINGS[:3] + [dict(temperature=1.0, top_k=1)]:
            samplers = [Sampler(seed=int(rng.integers(0, 2**63)), domain=D, **st) for _ in range(M)]
            positions = rng.integers(1, 1 << 20, M)
            got = dev.sample(x, D, samplers, positions, masks)
            want = [s(mask_logits(x[m], masks[m]), int(positions[m])) for m, s in enumerate(samplers)]
            if got != want:
                bad.append((st, trial, got, want))
    assert not bad, bad[:3]


def test_constrained_stream_equals_the_host_path():
    """A regex constraint on the GPU engine (the mask applied on the device, greedy and sampled) gives the tokens
    the full-logits host path gives, and only text the regex accepts."""
    import re

    from engine.constraints import Constraint
    from engine.generate import GenerationConfig
    from engine.synthetic import tokenizer

    a, b = _engines()
    for e in (a, b):
        e.tokenizer = tokenizer(int(e.args.vocab_size))
    b.decode_masked = None  # (an instance attribute hides the device path: the host draws from full logits)
    for st in (dict(temperature=0.0), dict(temperature=0.8, top_k=40, presence_penalty=0.5)):
        cfg = GenerationConfig(max_tokens=24, seed=3, constraint=Constraint.regex("(t[0-9])+"), **st)
        dev = [r.token for r in a.stream([2, 7, 1], cfg)]
        host = [r.token for r in b.stream([2, 7, 1], cfg)]
        assert dev == host, st
        text = "".join(a.tokenizer.decode([t]) for t in dev if t is not None)
        assert re.fullmatch("(t[0-9])+", text), text


@pytest.mark.parametrize("st", [dict(temperature=0.0), dict(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5),
                                dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, top_k=40, frequency_penalty=0.7)])
def test_stream_equals_host_loop(st):
    """generate_step over decode_stream draws, token for token, what the host loop draws from the same logits."""
    from engine.generate import generate_step

    a, b = _engines()

    dev = list(generate_step(a, [2, 7, 1], Sampler(seed=9, domain=a.domain, **st), max_tokens=40))
    host = list(generate_step(HostOnly(b), [2, 7, 1], Sampler(seed=9, domain=b.domain, **st), max_tokens=40))
    assert dev == host and a.position == b.position == 3 + 39


def test_stream_left_early_keeps_the_sequence_consistent():
    """Stopped after 5 of 30 tokens, the stream has fed one token more than it returned; the next prefill continues
    from exactly the tokens the cache consumed (the same logits as a fresh engine fed them)."""
    a, b = _engines()
    first = int(np.argmax(a.prefill([4, 8, 15])))
    it = a.decode_stream(first, 30, pack_params(temperature=0.0))
    got = [next(it) for _ in range(5)]
    it.close()
    assert a.position == 3 + 6
    tail = a.prefill([16, 23])
    fed = [4, 8, 15, first] + got + [16, 23]
    assert a.position == len(fed) and a._tokens == fed
    want = b.prefill(fed)
    assert float(np.linalg.norm(tail - want) / np.linalg.norm(want)) < 1e-5
