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
                                         purpose=1)
    assert ds.unpack_params(ds.pack_params(seed=-1, top_k=-3))["seed"] == (1 << 64) - 1
    assert ds.unpack_params(ds.pack_params(seed=-1, top_k=-3))["top_k"] == -3


def test_which_samplers_the_device_takes():
    assert ds.device_params(Sampler(temperature=0.7, top_p=0.9)) is not None
    assert ds.device_params(Sampler(temperature=0.7, presence_penalty=1.0)) is None
    assert ds.device_params(Sampler(temperature=0.7, frequency_penalty=0.5)) is None
    assert ds.device_params(Sampler(temperature=0.0, presence_penalty=1.0)) is not None  # greedy ignores them
    s = Sampler(temperature=0.7)
    s.logit_bias = {3: 5.0}
    assert ds.device_params(s) is None


class _Fake:
    """prefill gives fixed logits; decode_sampled hands out 100, 101, ...; decode_step counts calls."""

    def __init__(self):
        self.position, self.calls, self.steps = 0, [], 0

    def prefill(self, ids):
        self.position = len(ids)
        return np.array([0.0, 3.0, 1.0, 0.5])

    def decode_step(self, tok):
        self.steps += 1
        self.position += 1
        return np.array([0.0, 1.0, 4.0, 0.5])

    def decode_sampled(self, tok, n, params):
        self.calls.append((tok, n, ds.unpack_params(params)["temperature"]))
        self.position += n
        return [100 + len(self.calls) - 1 + i for i in range(n)]


def test_generate_step_draws_on_the_device_when_it_can():
    eng = _Fake()
    s = Sampler(temperature=0.5, seed=1)
    out = list(generate_step(eng, [1, 2], s, max_tokens=4))
    first = Sampler(temperature=0.5, seed=1)(np.array([0.0, 3.0, 1.0, 0.5]), 2)  # from the prompt's logits
    assert out == [first, 100, 101, 102] and eng.steps == 0
    assert [c[:2] for c in eng.calls] == [(first, 1), (100, 1), (101, 1)] and eng.calls[0][2] == 0.5
    assert s.counts[100] == 1  # the host sampler still sees every token


def test_generate_step_keeps_penalties_on_the_host():
    eng = _Fake()
    out = list(generate_step(eng, [1, 2], Sampler(temperature=0.5, presence_penalty=0.5, seed=1), max_tokens=3))
    assert eng.calls == [] and eng.steps == 2 and len(out) == 3


def _engine(monkeypatch, on=True):
    from engine import gpu_engine
    from engine.gpu import weights as gpu_weights
    from engine.config import ModelArgs
    from engine.models.qwen3_5 import random_weights
    from engine.synthetic import TINY_CUDA as CFG

    monkeypatch.setattr(gpu_engine, "DEVICE_SAMPLING", on)
    args = ModelArgs.from_config(CFG)
    w = gpu_weights.from_logical(args, gpu_weights.as_stored(random_weights(args, seed=1), "groupwise-int"))
    return gpu_engine.build_engine(args, w, CFG, max_context=256, prefill_cols=8, prefill_gemm=0)


def test_engine_captures_the_sampled_graph(cp, monkeypatch):
    eng = _engine(monkeypatch)
    ex = eng.model.executor
    assert ex.ops[-1] is ex._argmax_op  # the greedy graph as it was
    names = [getattr(op, "name", "") for op in ex.ops_sampled]
    assert names[-2:] == ["sample_max_mb", "sample_step_mb"] and "argmax_step_mb" not in names
    assert len(ex.ops_sampled) == len(ex.ops) + 1 and ex.graph_sampled is not None
    eng.prefill([1, 2, 3])
    s = Sampler(temperature=0.8, top_p=0.9, seed=4)
    out = eng.decode_sampled(5, 3, s)
    assert len(out) == 3 and eng.position == 6
    assert ds.unpack_params(ex.sp_params.get()[0]) == ds.unpack_params(ds.pack_params(s))
    with pytest.raises(ValueError):
        eng.decode_sampled(5, 1, Sampler(temperature=0.8, frequency_penalty=1.0))
    recs = list(eng.stream([1, 2, 3], __import__("engine").GenerationConfig(max_tokens=4, seed=2)))
    assert recs[-1].finish_reason == "length" and recs[-1].generation_tokens == 4


def test_engine_without_device_sampling(cp, monkeypatch):
    eng = _engine(monkeypatch, on=False)
    assert eng.decode_sampled is None and getattr(eng.model.executor, "graph_sampled", None) is None


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
