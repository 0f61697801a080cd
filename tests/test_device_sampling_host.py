"""Host side of the device sampler: the parameter row, which samplers it stands in for, the generate
loop's choice, the executor's second graph (on the CuPy stand-in), and the NumPy emulation of the kernel's
algorithm (dev/emu_device_sampling.py) against engine.sampling."""
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

from test_cuda_executor_smoke import cp  # noqa: F401  (the CuPy stand-in fixture)

from engine import device_sampling as ds
from engine.generate import generate_step
from engine.sampling import Sampler

ROOT = Path(__file__).resolve().parents[1]


def test_constants_match_the_kernel():
    src = (ROOT / "cuda" / "sampler.cu").read_text()
    d = dict(re.findall(r"#define (SAMPLE_\w+) (\S+)", src))
    assert int(d["SAMPLE_R"]) == ds.SAMPLE_R and int(d["SAMPLE_PARAMS"]) == ds.SAMPLE_PARAMS
    assert d["SAMPLE_Q"] == "(30" and "#define SAMPLE_Q (30 * SAMPLE_R + 1)" in src
    assert "#define SAMPLE_QTOP (4 * SAMPLE_R)" in src and ds.SAMPLE_QTOP == 4 * ds.SAMPLE_R
    assert ds.SAMPLE_Q == 30 * ds.SAMPLE_R + 1


def test_pack_round_trip():
    s = Sampler(temperature=0.65, top_k=50, top_p=0.93, min_p=0.025, seed=(1 << 63) + 5, top_k_cap=20)
    row = ds.pack_params(s)
    assert row.dtype == np.uint64 and row.shape == (ds.SAMPLE_PARAMS,)
    assert ds.unpack_params(row) == dict(temperature=0.65, top_p=0.93, min_p=0.025, top_k=20, seed=(1 << 63) + 5,
                                         purpose=1, presence=0.0, frequency=0.0)
    pen = ds.unpack_params(ds.pack_params(Sampler(temperature=0.7, top_k=20, presence_penalty=1.5,
                                                  frequency_penalty=0.25)))
    assert (pen["presence"], pen["frequency"]) == (1.5, 0.25)
    assert ds.unpack_params(ds.pack_params(seed=-1, top_k=-3))["seed"] == (1 << 64) - 1
    assert ds.unpack_params(ds.pack_params(seed=-1, top_k=-3))["top_k"] == -3


def test_which_samplers_the_device_takes():
    assert ds.device_params(Sampler(temperature=0.7, top_p=0.9)) is not None
    assert ds.device_params(Sampler(temperature=0.7, presence_penalty=1.0)) is None  # penalties need top_k
    assert ds.device_params(Sampler(temperature=0.7, frequency_penalty=0.5)) is None
    assert ds.device_params(Sampler(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5)) is not None
    assert ds.device_params(Sampler(temperature=0.7, top_k=ds.TOPK_MAX + 1, presence_penalty=1.5)) is None
    assert ds.device_params(Sampler(temperature=0.0, presence_penalty=1.0)) is not None  # greedy ignores them
    s = Sampler(temperature=0.7)
    s.logit_bias = {3: 5.0}
    assert ds.device_params(s) is None


class _Fake:
    """prefill gives fixed logits; decode_stream hands out 100, 101, ... (counting what it launched, one step
    ahead of the reader as the CUDA engine does); decode_step counts calls."""

    def __init__(self):
        self.position, self.calls, self.steps, self.launched, self.closed = 0, [], 0, 0, 0

    def prefill(self, ids):
        self.position = len(ids)
        return np.array([0.0, 3.0, 1.0, 0.5])

    def decode_step(self, tok):
        self.steps += 1
        self.position += 1
        return np.array([0.0, 1.0, 4.0, 0.5])

    def decode_stream(self, tok, n, params, counts=None):
        self.calls.append((tok, n, ds.unpack_params(params)["temperature"]))
        try:
            self.launched = min(n, 1)
            for i in range(n):
                self.launched = min(n, i + 2)
                yield 100 + i
        finally:
            self.closed += 1


def test_generate_step_draws_on_the_device_when_it_can():
    eng = _Fake()
    s = Sampler(temperature=0.5, seed=1)
    out = list(generate_step(eng, [1, 2], s, max_tokens=4))
    first = Sampler(temperature=0.5, seed=1)(np.array([0.0, 3.0, 1.0, 0.5]), 2)  # from the prompt's logits
    assert out == [first, 100, 101, 102] and eng.steps == 0
    assert eng.calls == [(first, 3, 0.5)] and eng.launched == 3  # nothing launched past max_tokens
    assert s.counts[100] == 1  # the host sampler still sees every token


def test_generate_step_closes_the_device_stream_when_stopped():
    eng = _Fake()
    steps = generate_step(eng, [1, 2], Sampler(temperature=0.5, seed=1), max_tokens=50)
    got = [next(steps) for _ in range(4)]
    steps.close()  # the consumer stops (a stop token, a stop string)
    assert got[1:] == [100, 101, 102] and eng.closed == 1 and eng.launched == 4  # one step past the last read


def test_generate_step_takes_penalties_to_the_device_with_top_k():
    eng = _Fake()
    s = Sampler(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5, seed=1)
    out = list(generate_step(eng, [1, 2], s, max_tokens=3))
    assert eng.steps == 0 and len(eng.calls) == 1 and len(out) == 3


def test_generate_step_keeps_penalties_on_the_host():
    eng = _Fake()
    out = list(generate_step(eng, [1, 2], Sampler(temperature=0.5, presence_penalty=0.5, seed=1), max_tokens=3))
    assert eng.calls == [] and eng.steps == 2 and len(out) == 3


def _engine(monkeypatch):
    from engine import gpu_engine
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import random_weights
    from engine.synthetic import TINY_CUDA as CFG

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, gpu_weights.as_stored(random_weights(args, seed=1), "groupwise-int"))
    return gpu_engine.build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0)


def test_engine_captures_the_sampled_graphs(cp, monkeypatch):
    eng = _engine(monkeypatch)
    ex = eng.model.executor
    assert ex.ops[-1] is ex._argmax_op  # the greedy graph as it was
    names = [getattr(op, "name", "") for op in ex.ops_sampled]
    assert names[-2:] == ["sample_max_mb", "sample_step_mb"] and "argmax_step_mb" not in names
    assert len(ex.ops_sampled) == len(ex.ops) + 1 and ex.graph_sampled is not None
    assert [getattr(op, "name", "") for op in ex.ops_topk][-1] == "sample_topk_mb" and ex.graph_topk is not None
    eng.prefill([1, 2, 3])
    s = Sampler(temperature=0.8, top_p=0.9, seed=4)
    out = eng.decode_sampled(5, 3, s)
    assert len(out) == 3 and eng.position == 6
    assert ds.unpack_params(ex.sampler.sp_params.get()[0]) == ds.unpack_params(ds.pack_params(s))
    with pytest.raises(ValueError):
        eng.decode_sampled(5, 1, Sampler(temperature=0.8, frequency_penalty=1.0))
    assert ex.sampled_graph(ds.pack_params(temperature=0.0)) is ex.graph
    assert ex.sampled_graph(ds.pack_params(temperature=0.7, top_k=20)) is ex.graph_topk
    assert ex.sampled_graph(ds.pack_params(temperature=0.7, top_k=0, top_p=0.9)) is ex.graph_sampled
    recs = list(eng.stream([1, 2, 3], __import__("engine").GenerationConfig(max_tokens=4, seed=2)))
    assert recs[-1].finish_reason == "length" and recs[-1].generation_tokens == 4


def test_penalty_counts_reach_the_device(cp, monkeypatch):
    eng = _engine(monkeypatch)
    ex = eng.model.executor
    eng.prefill([1, 2, 3])
    s = Sampler(temperature=0.7, top_k=20, presence_penalty=1.5, seed=4)
    s.accept(7), s.accept(7), s.accept(9)
    list(eng.decode_stream(5, 2, s))
    row = ex.sampler.sp_counts.get()[0]
    assert row[7] == 2 and row[9] == 1 and row.sum() == 3


def test_stream_accounting_when_left_early(cp, monkeypatch):
    """A stream stopped after k of n tokens has launched k + 1 steps: the position and the consumed ids say so,
    and the next call (prefill, a new stream) starts from there."""
    eng = _engine(monkeypatch)
    eng.prefill([1, 2, 3])
    it = eng.decode_stream(5, 10, ds.pack_params(temperature=0.0))
    got = [next(it) for _ in range(3)]
    assert eng.position == 3 + 4  # three read, the fourth already launched
    it.close()
    assert eng.position == 7 and eng._tokens[:4] == [1, 2, 3, 5] and eng._tokens[4:6] == got[:2]
    assert len(eng._tokens) == 7
    full = list(eng.decode_stream(9, 5, ds.pack_params(temperature=0.0)))
    assert len(full) == 5 and eng.position == 12 and len(eng._tokens) == 12
    left = eng.decode_stream(9, 5, ds.pack_params(temperature=0.0))
    next(left)
    eng.prefill([4])  # another call settles an open stream first
    assert eng.position == 12 + 2 + 1 and len(eng._tokens) == eng.position


def test_emulated_kernel_equals_host_sampler():
    spec = importlib.util.spec_from_file_location("emu_device_sampling", ROOT / "dev" / "emu_device_sampling.py")
    emu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(emu)
    # a small cap and candidate list: the bisection and row-rescan paths run too
    bad, total, paths = emu.compare(rows=15, V=3000, cap=16, cap_g=64, verbose=False)
    assert bad == 0 and total == 15 * len(emu.SETTINGS)
    assert {"sorted-cand", "sorted-row", "bisect"} <= set(paths)
    bad, total, _ = emu.compare(rows=5, V=248_320, cap=emu.SAMPLE_CAP, seed=1, verbose=False)
    assert bad == 0


def test_topk_constants_match_the_kernel():
    from engine.gpu import sampling as so

    src = (ROOT / "cuda" / "sample_topk.cu").read_text()
    d = dict(re.findall(r"#define (TOPK_\w+) (\S+)", src))
    assert int(d["TOPK_MAX"]) == ds.TOPK_MAX == so.TOPK_MAX and int(d["TOPK_TILE"]) == so.TOPK_TILE


def _topk_kernel(x, D, row, counts, pos):
    """cuda/sample_topk.cu's algorithm in NumPy, step for step: blocks of TOPK_TILE ids, each warp's best 64 of its
    256 in the order (x desc, id asc), the block's best K of those, the best K of the blocks' lists, then the
    thread-0 walk over at most K entries."""
    from engine.gpu.sampling import TOPK_TILE
    from engine.sampling import counter_uniform

    p = ds.unpack_params(row)
    T, top_p, min_p = p["temperature"], p["top_p"], p["min_p"]
    K = min(ds.TOPK_MAX, max(1, p["top_k"]))
    pen = p["presence"] != 0.0 or p["frequency"] != 0.0

    v = x[:D].astype(np.float64)
    if pen:
        c = counts[:D].astype(np.float64)
        hit = c > 0
        v[hit] = v[hit] - (p["presence"] * 1.0 + p["frequency"] * c[hit])

    def best(entries):
        return sorted(entries, key=lambda e: (-e[0], e[1]))

    def top(ids, n):
        return [(float(v[i]), int(i)) for i in ids[np.lexsort((ids, -v[ids]))[:n]]]

    lists = []
    for i0 in range(0, D, TOPK_TILE):
        warps = [top(np.arange(w0, min(D, w0 + 256)), 64) for w0 in range(i0, min(D, i0 + TOPK_TILE), 256)]
        lists += best([e for w in warps for e in w])[:K]
    assert len(lists) <= 32 * K
    run = best(lists)[:K]
    x0 = run[0][0]
    L = [e for e in run if e[0] >= x0 - 30.0 * T][:K]
    w = [np.exp((v - x0) / T) for v, _ in L]
    keep = len(L)
    if min_p > 0.0:
        keep = next((j for j in range(len(L)) if not w[j] >= min_p * w[0]), len(L))
    if top_p < 1.0:
        s = sum(w[:keep])
        cum, below = 0.0, 0
        for j in range(keep):
            cum += w[j]
            below += cum / s < top_p
        keep = min(keep, below + 1)
    keep = max(keep, 1)
    s = sum(w[:keep])
    u = counter_uniform(p["seed"], pos, p["purpose"])
    cum, pick = 0.0, 0
    for j in range(keep):
        cum += w[j] / s
        if cum <= u:
            pick = j + 1
    return L[min(pick, keep - 1)][1]


@pytest.mark.parametrize("kind", ["peaked", "llm", "ties", "flat"])
def test_topk_kernel_algorithm_equals_host_sampler(kind):
    """The top-k kernel's algorithm (emulated) draws the host sampler's token, penalties included, on rows of
    several tiles (the fold across tiles runs) and every top-k setting the recommended profiles use."""
    spec = importlib.util.spec_from_file_location("emu_device_sampling", ROOT / "dev" / "emu_device_sampling.py")
    emu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(emu)
    rng = np.random.default_rng({"peaked": 1, "llm": 2, "ties": 3, "flat": 4}[kind])
    V = 9000
    settings = [dict(temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5),
                dict(temperature=0.6, top_k=20, top_p=0.95),
                dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, frequency_penalty=0.3),
                dict(temperature=1.0, top_k=64, presence_penalty=0.5, frequency_penalty=0.5),
                dict(temperature=0.3, top_k=1),
                dict(temperature=1.0, top_k=5, min_p=1.5),
                dict(temperature=1.0, top_k=8, top_p=0.0)]
    bad = []
    for trial in range(6):
        x = emu.make_row(rng, kind, V)
        D = V - int(rng.integers(0, 40))
        for st in settings:
            s = Sampler(seed=int(rng.integers(0, 2**63)), domain=D, **st)
            for t in rng.integers(0, D, int(rng.integers(0, 30))):
                s.accept(int(t))
            counts = np.zeros(V, np.int64)
            for t, c in s.counts.items():
                counts[t] = c
            pos = int(rng.integers(1, 1 << 20))
            got = _topk_kernel(x, D, ds.pack_params(s), counts, pos)
            want = s(x, pos)
            if got != want:
                bad.append((st, trial, got, want))
    assert not bad, bad[:3]


def test_topk_kernel_algorithm_folds_many_tiles():
    """A full Qwen row (122 tiles: the blocks' lists folded over several tiles) on flat and tied logits."""
    rng = np.random.default_rng(9)
    V, D = 248_320, 248_320 - 243
    for x in (np.zeros(V, np.float32), rng.integers(-3, 2, V).astype(np.float32),
              (rng.standard_normal(V) * 2.5).astype(np.float32)):
        for st in (dict(temperature=0.7, top_k=64, presence_penalty=1.5), dict(temperature=0.7, top_k=20, top_p=0.8)):
            s = Sampler(seed=int(rng.integers(0, 2**63)), domain=D, **st)
            for t in rng.integers(0, 100, 10):
                s.accept(int(t))
            counts = np.zeros(V, np.int64)
            for t, c in s.counts.items():
                counts[t] = c
            for pos in (5, 77, 1 << 19):
                assert _topk_kernel(x, D, ds.pack_params(s), counts, pos) == s(x, pos), st


class _MaskedFake(_Fake):
    """decode_masked hands out 200, 201, ... while next_mask() gives a mask (counting the masks asked for)."""

    def decode_masked(self, tok, n, params, next_mask, counts=None):
        self.calls.append((tok, n, ds.unpack_params(params)["top_k"]))
        for i in range(n):
            if next_mask() is None:
                return
            self.masks = getattr(self, "masks", 0) + 1
            yield 200 + i


class _Matcher:
    """A constraint stand-in: allows everything, complete after `length` tokens, stop id 7."""

    def __init__(self, length):
        self.length, self.taken, self.stopped, self.stop_id = length, [], False, 7

    @property
    def done(self):
        return self.stopped or len(self.taken) >= self.length

    def mask(self):
        return np.ones(4, bool)

    def bitmask(self):
        return np.array([15], np.int32)

    def accept(self, tok):
        if tok == self.stop_id:
            self.stopped = True
        else:
            self.taken.append(tok)


@pytest.mark.parametrize("st", [dict(temperature=0.0), dict(temperature=0.7, top_k=20, presence_penalty=1.5)])
def test_generate_step_draws_under_a_grammar_on_the_device(st):
    """Under a constraint a GPU engine draws on the device with the host's mask each step (greedy as top-1), and
    a complete grammar ends with its stop id without another step."""
    eng = _MaskedFake()
    s = Sampler(seed=1, **st)
    s.constraint = _Matcher(4)
    out = list(generate_step(eng, [1, 2], s, max_tokens=50))
    assert out[1:] == [200, 201, 202, 7] and eng.masks == 3 and eng.steps == 0
    assert eng.calls[0][2] == (1 if st["temperature"] == 0 else 20)


def test_generate_step_keeps_a_grammar_without_top_k_on_the_host():
    eng = _MaskedFake()
    s = Sampler(seed=1, temperature=0.7, top_p=0.9)
    s.constraint = _Matcher(3)
    out = list(generate_step(eng, [1, 2], s, max_tokens=50))
    assert eng.calls == [] and eng.steps == 2 and out[-1] == 7


def test_masked_stream_accounting(cp, monkeypatch):
    eng = _engine(monkeypatch)
    ex = eng.model.executor
    eng.prefill([1, 2, 3])
    masks = iter([np.array([1], np.int32)] * 3 + [None])
    got = list(eng.decode_masked(5, 10, ds.masked_params(Sampler(temperature=0.0)), lambda: next(masks)))
    assert len(got) == 3 and eng.position == 6 and len(eng._tokens) == 6
    assert ex.sampler._allow_on is False  # the mask is off again for the next stream
    assert ds.unpack_params(ds.masked_params(Sampler(temperature=0.0)))["top_k"] == 1
    assert ds.masked_params(Sampler(temperature=0.7, top_p=0.9)) is None
