"""The device sampler (cuda/sample.cu: sample_max_mb + sample_step_mb) against engine.sampling.Sampler:
the same token for the same (seed, position) over many rows, seeds, positions and parameter sets, and the
engine's sampled graph against host sampling of the same logits.

    PYTHONPATH=. python3 -m pytest -q tests/gpu/test_device_sampling.py -p no:cacheprovider
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

# (the engine's modules imported up front: on the H200 image, files first read late in a session have read
# back as NUL bytes: "source code string cannot contain null bytes", CuPy kernels failing to compile)
from engine import gpu_engine  # noqa: F401,E402
from engine.gpu import weights as gpu_weights  # noqa: F401,E402
from engine.device_sampling import SAMPLE_CAND, SAMPLE_PARAMS, SAMPLE_Q, pack_params
from engine.sampling import Sampler

pytestmark = pytest.mark.gpu


def _emulation():
    """dev/emu_device_sampling.py (the rows and settings the emulation is checked on), loaded by path."""
    path = Path(__file__).resolve().parents[2] / "dev" / "emu_device_sampling.py"
    spec = importlib.util.spec_from_file_location("emu_device_sampling", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


emu = _emulation()

V = 248_320
NB = 64
SETTINGS = [st for st in emu.SETTINGS if st.get("temperature", 1.0) > 0]  # (greedy: test_greedy_cases)


@pytest.fixture(scope="module")
def cp():
    import cupy

    cupy.ones(1)  # CuPy's own fill kernel compiled up front (see the imports above)
    return cupy


def _row(rng, kind, v=V):
    return emu.make_row(rng, kind, v)


class Device:
    """sample_max_mb + sample_step_mb over M rows with their own buffers (as the executor lays them out)."""

    def __init__(self, cp, M, hist_len=8):
        self.cp, self.M, self.hist_len = cp, M, hist_len
        self.params = cp.zeros((M, SAMPLE_PARAMS), cp.uint64)
        self.pv, self.pi = cp.zeros((M, NB), cp.float32), cp.zeros((M, NB), cp.int32)
        self.hc, self.hw = cp.zeros((M, NB, SAMPLE_Q), cp.int32), cp.zeros((M, NB, SAMPLE_Q), cp.float64)
        self.cand, self.cand_n = cp.zeros((M, SAMPLE_CAND), cp.uint64), cp.zeros(M, cp.uint32)
        self.ticket = cp.zeros(M, cp.uint32)
        self.tokens, self.pos, self.step = cp.zeros(M, cp.int32), cp.zeros(M, cp.int32), cp.zeros(M, cp.int32)
        self.hist = cp.zeros((M, hist_len), cp.int32)

    def sample(self, logits, D, params, positions):
        """Tokens drawn for rows of `logits` at `positions` (the kernel draws at pos + 1)."""
        from engine.gpu.sampling import sample_max, sample_step

        cp = self.cp
        lg = cp.asarray(np.ascontiguousarray(logits, np.float32))
        self.params.set(np.asarray(params, np.uint64))
        self.pos.set(np.asarray(positions, np.int32) - 1)
        sample_max(logits=lg, ld=lg.shape[1], domain=D, best_v=self.pv, best_i=self.pi, rows=self.M, blocks=NB)()
        sample_step(logits=lg, ld=lg.shape[1], domain=D, params=self.params, best_v=self.pv, best_i=self.pi,
                    hist_c=self.hc, hist_w=self.hw, cand=self.cand, cand_n=self.cand_n, cand_cap=SAMPLE_CAND,
                    tickets=self.ticket, tokens=self.tokens, pos=self.pos, history=self.hist, step=self.step,
                    hist_len=self.hist_len, rows=self.M, blocks=NB)()
        cp.cuda.Device().synchronize()
        toks = self.tokens.get()
        assert not self.ticket.get().any() and not self.cand_n.get().any()  # ready for the next launch
        assert np.array_equal(self.pos.get(), np.asarray(positions))
        return toks.tolist()


@pytest.mark.parametrize("kind", ["peaked", "llm", "ties", "flat"])
def test_device_sampler_equals_host_sampler(cp, kind):
    rng = np.random.default_rng({"peaked": 1, "llm": 2, "ties": 3, "flat": 4}[kind])
    M = 4
    dev = Device(cp, M)
    x = np.stack([_row(rng, kind) for _ in range(M)])
    D = V - 243  # Qwen's token domain: ids above are never drawn
    bad = []
    for st in SETTINGS:
        for trial in range(3 if kind != "flat" else 1):
            samplers = [Sampler(seed=int(rng.integers(0, 2**63)), domain=D, **st) for _ in range(M)]
            positions = rng.integers(1, 1 << 20, M)
            got = dev.sample(x, D, np.stack([pack_params(s) for s in samplers]), positions)
            want = [s(x[m], int(positions[m])) for m, s in enumerate(samplers)]
            if got != want:
                bad.append((st, trial, got, want))
    assert not bad, bad[:3]


def test_many_seeds_small_vocab(cp):
    """Many seeds and positions on short rows (every bucket path, cheap)."""
    rng = np.random.default_rng(7)
    M, v = 8, 5000
    dev = Device(cp, M)
    bad = 0
    for trial in range(40):
        x = np.stack([_row(rng, ["peaked", "llm", "ties"][m % 3], v) for m in range(M)])
        st = SETTINGS[trial % len(SETTINGS)]
        samplers = [Sampler(seed=int(rng.integers(0, 2**63)), domain=v, **st) for _ in range(M)]
        positions = rng.integers(1, 1 << 30, M)
        got = dev.sample(x, v, np.stack([pack_params(s) for s in samplers]), positions)
        bad += sum(g != s(x[m], int(positions[m])) for m, (g, s) in enumerate(zip(got, samplers)))
    assert bad == 0


def test_greedy_cases(cp):
    """temperature 0 is greedy (lowest id among equal maxima), as are top_k=1 and min_p > 1."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, V)).astype(np.float32)
    x[1, 1000] = x[1, 5] = 50.0
    x[2, V - 10] = 99.0  # above the domain: never drawn
    D = V - 100
    dev = Device(cp, 3)
    want = [int(np.argmax(r[:D])) for r in x]
    assert want[1] == 5
    for st in (dict(temperature=0.0), dict(temperature=-1.0), dict(temperature=0.8, top_k=1),
               dict(temperature=1.0, min_p=2.0)):
        params = np.stack([pack_params(Sampler(seed=s, domain=D, **st)) for s in range(3)])
        assert dev.sample(x, D, params, [5, 6, 7]) == want, st


def test_history_and_step_advance_over_launches(cp):
    rng = np.random.default_rng(5)
    x = _row(rng, "llm")[None]
    dev = Device(cp, 1, hist_len=4)
    s = Sampler(seed=3, temperature=0.9, top_p=0.9)
    out = [dev.sample(x, V, pack_params(s)[None], [p])[0] for p in range(10, 16)]
    assert out == [s(x[0], p) for p in range(10, 16)]
    assert dev.step.get()[0] == 6 and dev.hist.get()[0].tolist() == [out[4], out[5], out[2], out[3]]


def _engines(n=2):
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.gpu_engine import build_engine
    from engine.models.qwen3_5 import random_weights
    from engine.synthetic import TINY_CUDA as CFG

    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, gpu_weights.as_stored(random_weights(args, seed=3), "groupwise-int"))
    return [build_engine(args, w, CFG, max_context=256, prefill_cols=1) for _ in range(n)]


def test_engine_decode_sampled_equals_host_sampling():
    """decode_sampled's burst draws what the host sampler draws from the same engine's logits."""
    a, b = _engines()
    for st in (dict(temperature=0.8, top_p=0.9), dict(temperature=1.2, top_k=30, min_p=0.01), dict(temperature=0)):
        a.reset(), b.reset()
        s = Sampler(seed=42, domain=a.domain, **st)
        first = s(a.prefill([3, 1, 4, 1, 5]), 5)
        b.prefill([3, 1, 4, 1, 5])
        got = a.decode_sampled(first, 24, s)
        want, tok = [], first
        for _ in range(24):
            tok = s(b.decode_step(tok), b.position)
            want.append(tok)
        assert got == want, st
        assert a.position == b.position == 29


class HostOnly:
    """An engine with its device paths hidden: the generate loop samples on the host from full logits."""

    def __init__(self, e):
        self.e = e

    def prefill(self, ids):
        return self.e.prefill(ids)

    def decode_step(self, t):
        return self.e.decode_step(t)

    @property
    def position(self):
        return self.e.position


def test_generate_step_device_path_equals_host_path():
    from engine.generate import generate_step

    a, b = _engines()
    s1 = Sampler(seed=9, temperature=0.7, top_p=0.95, domain=a.domain)
    s2 = Sampler(seed=9, temperature=0.7, top_p=0.95, domain=a.domain)

    dev = list(generate_step(a, [2, 7, 1], s1, max_tokens=20))
    host = list(generate_step(HostOnly(b), [2, 7, 1], s2, max_tokens=20))
    assert dev == host
