"""Benchmark core: flag parsing, matrix expansion, statistics, timed runs on a fake clock, bounds."""
from __future__ import annotations

import math

import numpy as np
import pytest

from engine import bench
from engine.bench import Costs, Instance, Stats, Test
from engine.errors import NinferError


# ---------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text, expected",
    [
        ("512", [512]),
        ("512,8192", [512, 8192]),
        (["64", "128,64"], [64, 128]),  # repeated flags merge, duplicates dropped
        ("128-512+128", [128, 256, 384, 512]),
        ("128-1024*2", [128, 256, 512, 1024]),
        ("0", [0]),
    ],
)
def test_parse_int_list(text, expected):
    assert bench.parse_int_list(text, "-p") == expected


@pytest.mark.parametrize("text", ["abc", "-5", "1.5", "512-128", "8-64*1", "0-64*2", "1,,x"])
def test_parse_int_list_rejects(text):
    with pytest.raises(NinferError) as e:
        bench.parse_int_list(text, "-p")
    assert "-p" in e.value.message


def test_parse_pairs():
    assert bench.parse_pairs("8192,128") == [(8192, 128)]
    assert bench.parse_pairs(["512,64;16,8", "1,1"]) == [(512, 64), (16, 8), (1, 1)]
    for bad in ("8192", "a,b", "0,128", "1,2,3"):
        with pytest.raises(NinferError):
            bench.parse_pairs(bad)


def test_expand_matrix_every_combination_in_llama_bench_order():
    tests = bench.expand_matrix([512, 8192], [128], [(64, 16)], [0, 4096])
    assert [t.name for t in tests] == [
        "pp512", "pp8192", "tg128", "pp64+tg16",
        "pp512 @ d4096", "pp8192 @ d4096", "tg128 @ d4096", "pp64+tg16 @ d4096",
    ]
    assert [t.kind for t in tests[:4]] == ["pp", "pp", "tg", "pg"]


def test_expand_matrix_zero_skips_and_dedupes():
    assert bench.expand_matrix([0], [0], [], [0]) == []
    assert [t.name for t in bench.expand_matrix([0, 16, 16], [8], [], [])] == ["pp16", "tg8"]


def test_expand_instances():
    inst = bench.expand_instances(["bf16", "int8"], [1, 4], [])
    assert inst == [Instance("bf16", 1), Instance("bf16", 4), Instance("int8", 1), Instance("int8", 4)]
    assert bench.expand_instances([], [], []) == [Instance()]


def test_bench_tokens_fixed_and_in_domain():
    a = bench.bench_tokens(500, 248077)
    assert a == bench.bench_tokens(500, 248077)
    assert a[:3] == bench.bench_tokens(3, 248077)  # a prefix does not depend on the length asked
    assert min(a) >= bench.FIRST_TOKEN and max(a) < 248077
    assert len(set(a)) > 450
    small = bench.bench_tokens(100, 50)
    assert max(small) < 50


# ---------------------------------------------------------------------------------- statistics
def test_stats_mean_and_sample_std():
    s = Stats.of([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert s.mean == 5.0
    assert s.std == pytest.approx(math.sqrt(32 / 7))  # n-1, as llama-bench
    assert s.samples == (2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0)
    assert s.fmt() == "5.00 ± 2.14"
    assert Stats.of([3.0]).std == 0.0
    assert math.isnan(Stats.of([]).mean) and Stats.of([]).fmt() == "-"


# ---------------------------------------------------------------------------------- timed runs
class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class FakeEngine:
    """Costs 1 ms per prefilled token and 2 ms per decode step on a fake clock; the first call is slow."""

    def __init__(self, clock, vocab=4096):
        self.clock, self.vocab = clock, vocab
        self.calls, self.position, self.first = [], 0, True

    def _spend(self, seconds):
        if self.first:  # a cold first run (compilation, graph capture) must not reach the samples
            seconds += 5.0
            self.first = False
        self.clock.t += seconds

    def reset(self):
        self.calls.append(("reset",))
        self.position = 0

    def prefill(self, ids):
        self.calls.append(("prefill", list(ids)))
        self._spend(1e-3 * len(ids))
        self.position += len(ids)
        logits = np.zeros(self.vocab, np.float32)
        logits[(sum(ids) + 7) % self.vocab] = 1.0
        return logits

    def decode_greedy(self, first, n):
        self.calls.append(("decode", first, n))
        self._spend(2e-3 * n)
        self.position += n
        return [(first + i + 1) % self.vocab for i in range(n)]

    def info(self):
        return {"backend": "fake", "weight_bytes": 2_000_000}


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(bench.time, "perf_counter", c)
    return c


def _run(engine, test, reps=3, warmup=1, costs=None, roof=None):
    tokens = bench.bench_tokens(test.context_needed, engine.vocab)
    return bench.run_test(engine, test, Instance(), repetitions=reps, warmup=warmup, tokens=tokens,
                          costs=costs or Costs(), roofline=roof)


def test_pp_times_prefill_only_and_drops_warmup(clock):
    eng = FakeEngine(clock)
    r = _run(eng, Test(16, 0))
    assert r.tps.samples == pytest.approx((1000.0,) * 3)  # 16 tokens / 16 ms; the slow first run is gone
    assert r.ttft_ms.mean == pytest.approx(16.0)
    assert r.decode_tps is None
    tokens = bench.bench_tokens(Test(16, 0).context_needed, eng.vocab)
    prefills = [c for c in eng.calls if c[0] == "prefill"]
    assert len(prefills) == 4 and all(c[1] == tokens[:16] for c in prefills)
    assert sum(c[0] == "reset" for c in eng.calls) == 4


def test_tg_times_exactly_n_decode_steps_after_an_untimed_seed(clock):
    eng = FakeEngine(clock)
    r = _run(eng, Test(0, 8, depth=32), reps=2, warmup=0)
    assert r.tps.samples == pytest.approx((500.0, 500.0))  # 8 steps x 2 ms; context+seed prefill untimed
    assert r.ttft_ms is None
    tokens = bench.bench_tokens(Test(0, 8, 32).context_needed, eng.vocab)
    assert eng.calls[1] == ("prefill", tokens[:33])  # 32 tokens of depth + the one-token seed, one call
    assert eng.calls[2][0] == "decode" and eng.calls[2][2] == 8


def test_pg_counts_prompt_and_generated_tokens(clock):
    eng = FakeEngine(clock)
    r = _run(eng, Test(16, 8, depth=4), reps=2)
    assert r.tps.mean == pytest.approx(24 / 0.032)  # (16 + 8) tokens in 16 ms + 16 ms
    assert r.prefill_tps.mean == pytest.approx(1000.0)
    assert r.decode_tps.mean == pytest.approx(500.0)
    assert r.ttft_ms.mean == pytest.approx(16.0)
    # depth is its own untimed prefill before the timed prompt; the first decoded token is the argmax
    seq = [c for c in eng.calls if c[0] != "reset"][-3:]
    assert [len(seq[0][1]), len(seq[1][1])] == [4, 16]
    assert seq[2][1] == (sum(seq[1][1]) + 7) % eng.vocab


def test_decode_bandwidth_and_percent_of_copy(clock):
    eng = FakeEngine(clock)
    costs = Costs(weight_bytes=3_000_000, weight_bytes_per_token=1_000_000, state_bytes=1000,
                  kv_bytes_per_token=10)
    r = _run(eng, Test(0, 8), costs=costs, roof={"copy_gbps": 1.0})
    # mean context over the 8 steps = 1 seed + (8 + 1) / 2 = 5.5 positions; state read and written
    per_token = 1_000_000 + 2 * 1000 + 10 * 5.5
    assert r.gbps == pytest.approx(per_token * 500 / 1e9)
    assert r.pct_copy == pytest.approx(100 * r.gbps / 1.0)
    assert r.tflops is None


def test_prefill_flops_and_percent_of_matmul(clock):
    eng = FakeEngine(clock)
    costs = Costs(weight_bytes_per_token=1, params_per_token=1_000_000, attn_flops_per_ctx=100)
    r = _run(eng, Test(16, 0, depth=10), costs=costs, roof={"matmul_tflops": 1e-3})
    flops = 2 * 1_000_000 * 16 + 100 * (16 * 10 + 16 * 17 / 2)
    assert r.tflops == pytest.approx(flops / 0.016 / 1e12)
    assert r.pct_matmul == pytest.approx(100 * r.tflops / 1e-3)
    assert r.gbps is None


def test_unknown_costs_leave_bounds_empty(clock):
    r = _run(FakeEngine(clock), Test(16, 8))
    assert r.gbps is r.pct_copy is r.tflops is r.pct_matmul is None


def test_lanes_need_lane_methods(clock):
    eng = FakeEngine(clock)
    with pytest.raises(NinferError, match="--lanes 2"):
        bench.run_test(eng, Test(16, 0), Instance(lanes=2), repetitions=1, warmup=0,
                       tokens=bench.bench_tokens(40, 100), costs=Costs())


def test_wrong_token_count_is_caught(clock):
    eng = FakeEngine(clock)
    eng.decode_greedy = lambda first, n: [first] * (n - 1)
    with pytest.raises(RuntimeError, match="decode_greedy returned 7"):
        _run(eng, Test(0, 8), reps=1, warmup=0)


def test_memory_probe_reports_this_process():
    probe = bench.memory_probe("cpu")
    probe.reset()
    assert probe.sample() > 10 * 2**20  # a Python process with NumPy holds more than 10 MiB


# ---------------------------------------------------------------------------------- cost model
def test_geometry_costs_match_performance_md():
    from engine.bench_models import TINY, geometry_costs
    from engine.config import ModelArgs
    from engine.synthetic import geometry_config

    dense, _ = geometry_costs(ModelArgs.from_config(geometry_config("qwen3.8-27b")), weight_bytes_per_param=1,
                              kv_bytes_per_elem=2)
    assert dense.params_per_token / 1e9 == pytest.approx(25.62, abs=0.01)  # performance.md §3a
    assert dense.kv_bytes_per_token == 65536  # model.md §1.11, bf16
    assert 151e6 < dense.state_bytes < 160e6  # 48 layers x 48 heads x 128 x 128 fp32 + conv history
    moe, resident = geometry_costs(ModelArgs.from_config(geometry_config("qwen3.6-35b-a3b")),
                                   weight_bytes_per_param=1, kv_bytes_per_elem=2)
    assert moe.params_per_token == pytest.approx(2_946_429_568, rel=1e-3)  # NInfer's A3B count
    assert resident / 1e9 == pytest.approx(34.7, abs=0.1) and moe.kv_bytes_per_token == 20480
    tiny, _ = geometry_costs(ModelArgs.from_config(TINY), weight_bytes_per_param=4, kv_bytes_per_elem=4)
    assert tiny.weight_bytes_per_token == 4 * tiny.params_per_token


def test_engine_settings_reach_the_factory_or_fail_clearly():
    from engine.bench_models import _call_with_options

    def factory(x, *, kv="bf16"):
        return (x, kv)

    assert _call_with_options(factory, "f", 1, kv="int8") == (1, "int8")
    assert _call_with_options(factory, "f", 1, lanes=1, spec="off") == (1, "bf16")
    assert _call_with_options(factory, "f", 1, spec="mtp:3") == (1, "bf16")  # a decode mode: built the same

    def sizes_spec(x, *, spec=None):
        return (x, spec)

    assert _call_with_options(sizes_spec, "f", 1, spec="mtp:3") == (1, "mtp:3")
    with pytest.raises(NinferError, match="does not support --lanes 4"):
        _call_with_options(factory, "f", 1, lanes=4)
