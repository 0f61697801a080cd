"""Sampling from the ids a GPU engine sends back (SparseLogits) equals sampling from the whole row."""
from collections import Counter

import numpy as np
import pytest

from engine.generate import generate_step
from engine.sampling import Sampler, SparseLogits, candidates, greedy

RNG = np.random.default_rng(3)


def _sparse(x, margin):
    ids = np.flatnonzero(x >= x.max() - margin)
    return SparseLogits(ids, x[ids], x.size)


@pytest.mark.parametrize("settings", [
    dict(temperature=0.7, top_k=20, top_p=0.8),
    dict(temperature=0.6, top_k=0, top_p=0.95),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=1.3, top_k=5, presence_penalty=1.5, frequency_penalty=0.5),
])
def test_sparse_candidates_equal_dense(settings):
    for trial in range(20):
        x = (RNG.standard_normal(5000) * 3).astype(np.float32)
        x[RNG.integers(0, 5000, 3)] += 12  # a few strong candidates, as in a real step
        s = Sampler(seed=trial, domain=4990, **{k: v for k, v in settings.items()})
        s.counts = Counter({int(i): int(c) for i, c in zip(RNG.integers(0, 5000, 30), RNG.integers(1, 4, 30))})
        dense = s.distribution(x)
        sparse = s.distribution(_sparse(x, s.margin()))
        assert np.array_equal(dense[0], sparse[0])
        np.testing.assert_allclose(dense[1], sparse[1], rtol=1e-9, atol=1e-12)
        assert s(x, 17) == s(_sparse(x, s.margin()), 17)


def test_sparse_greedy_takes_the_lowest_top_id_inside_the_domain():
    x = np.array([1.0, 5.0, 2.0, 5.0, 9.0], dtype=np.float32)
    assert greedy(_sparse(x, 0.0)) == 4
    assert greedy(_sparse(x, 10.0), domain=4) == 1 == greedy(x, domain=4)
    assert Sampler(temperature=0).margin() == 0.0


def test_generate_step_uses_the_engine_sparse_step():
    class Fake:
        position = 0

        def __init__(self):
            self.sparse_calls = []

        def prefill(self, ids):
            self.position = len(ids)
            return np.array([0.0, 3.0, 1.0])

        def decode_step(self, tok):
            raise AssertionError("the sparse step should have been used")

        def decode_step_sparse(self, tok, margin):
            self.sparse_calls.append(margin)
            self.position += 1
            return SparseLogits([2], [4.0], 3)

    eng = Fake()
    out = list(generate_step(eng, [1, 2], Sampler(temperature=0), max_tokens=3))
    assert out == [1, 2, 2] and eng.sparse_calls == [0.0, 0.0]


def test_sparse_logits_rejects_empty():
    with pytest.raises(ValueError):
        SparseLogits([], [], 10)
    assert candidates(SparseLogits([7], [0.0], 10), temperature=1.0)[0].tolist() == [7]
