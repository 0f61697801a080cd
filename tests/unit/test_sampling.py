"""engine.sampling on hand-made distributions."""
import numpy as np
import pytest

from engine.sampling import (
    PURPOSE_DECODE,
    Sampler,
    apply_penalties,
    candidates,
    counter_uniform,
    greedy,
    make_sampler,
)

# probabilities 0.4, 0.3, 0.2, 0.1 at ids 2, 0, 3, 1 (temperature 1)
P = {2: 0.4, 0: 0.3, 3: 0.2, 1: 0.1}
LOGITS = np.log(np.array([P[i] for i in range(4)]))


def test_greedy_is_argmax_lowest_id_on_ties_and_respects_domain():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal(50).astype(np.float32)
        assert greedy(x) == int(np.argmax(x))
    assert greedy(np.array([1.0, 3.0, 3.0, 0.0])) == 1
    assert greedy(np.array([1.0, 2.0, 9.0]), domain=2) == 1
    s = Sampler(temperature=0.0, presence_penalty=5.0)
    s.accept(1)
    assert s(np.array([0.0, 1.0, 0.5]), position=0) == 1  # greedy ignores penalties


def test_full_distribution_sorted_by_probability():
    ids, p = candidates(LOGITS, temperature=1.0)
    assert ids.tolist() == [2, 0, 3, 1]
    np.testing.assert_allclose(p, [0.4, 0.3, 0.2, 0.1], rtol=1e-12)


def test_top_k_mask():
    ids, p = candidates(LOGITS, temperature=1.0, top_k=2)
    assert ids.tolist() == [2, 0]
    np.testing.assert_allclose(p, [4 / 7, 3 / 7], rtol=1e-12)


def test_top_k_ties_keep_lower_ids():
    ids, _ = candidates(np.array([1.0, 5.0, 5.0, 5.0, 0.0]), temperature=1.0, top_k=2)
    assert ids.tolist() == [1, 2]


@pytest.mark.parametrize("top_p,kept", [(0.4, [2]), (0.5, [2, 0]), (0.7, [2, 0]), (0.71, [2, 0, 3]), (0.95, [2, 0, 3, 1])])
def test_top_p_keeps_shortest_prefix_reaching_p(top_p, kept):
    ids, p = candidates(LOGITS, temperature=1.0, top_p=top_p)
    assert ids.tolist() == kept
    want = np.array([P[i] for i in kept])
    np.testing.assert_allclose(p, want / want.sum(), rtol=1e-9)


@pytest.mark.parametrize("min_p,kept", [(0.0, [2, 0, 3, 1]), (0.3, [2, 0, 3]), (0.5, [2, 0, 3]), (0.51, [2, 0]), (1.0, [2])])
def test_min_p_drops_below_fraction_of_max(min_p, kept):
    ids, _ = candidates(LOGITS, temperature=1.0, min_p=min_p)
    assert ids.tolist() == kept


def test_temperature_sharpens_and_flattens():
    _, hot = candidates(LOGITS, temperature=2.0)
    _, cold = candidates(LOGITS, temperature=0.5)
    w = np.array([0.4, 0.3, 0.2, 0.1])
    np.testing.assert_allclose(hot, np.sqrt(w) / np.sqrt(w).sum(), rtol=1e-9)
    np.testing.assert_allclose(cold, w**2 / (w**2).sum(), rtol=1e-9)


def test_penalties():
    x = np.zeros(4)
    out = apply_penalties(x, {1: 3, 2: 1}, presence=0.5, frequency=0.25)
    np.testing.assert_allclose(out, [0.0, -1.25, -0.75, 0.0])
    assert x.tolist() == [0.0] * 4  # input untouched


def test_domain_never_sampled():
    x = np.array([0.0, 0.0, 10.0, 50.0, 50.0])
    s = Sampler(temperature=1.0, seed=1, domain=3)
    assert {s(x, position=i) for i in range(200)} <= {0, 1, 2}
    assert greedy(x, domain=3) == 2


def test_counter_rng_is_a_pure_function():
    a = [counter_uniform(7, p) for p in range(1000)]
    assert a == [counter_uniform(7, p) for p in range(1000)]
    assert all(0.0 <= u < 1.0 for u in a)
    assert abs(np.mean(a) - 0.5) < 0.03
    assert counter_uniform(7, 3) != counter_uniform(8, 3) != counter_uniform(7, 3, purpose=PURPOSE_DECODE + 1)


def test_same_seed_same_tokens_and_frequencies_follow_probs():
    seqs = []
    for _ in range(2):
        s = Sampler(temperature=0.8, top_p=0.9, seed=42)
        seqs.append([s(LOGITS, position=i) for i in range(400)])
    assert seqs[0] == seqs[1]
    other = Sampler(temperature=0.8, top_p=0.9, seed=43)
    assert [other(LOGITS, position=i) for i in range(400)] != seqs[0]
    s = Sampler(temperature=1.0, seed=9)
    draws = np.bincount([s(LOGITS, position=i) for i in range(4000)], minlength=4) / 4000
    np.testing.assert_allclose(draws, [0.3, 0.1, 0.4, 0.2], atol=0.03)


def test_presence_penalty_steers_away_from_repeats():
    s = Sampler(temperature=1.0, seed=5, presence_penalty=100.0)
    x = np.array([3.0, 2.9, -5.0])
    seen = []
    for i in range(2):
        t = s(x, position=i)
        s.accept(t)
        seen.append(t)
    assert sorted(seen) == [0, 1]


def test_top_k_cap_reproduces_upstream_clamp():
    assert Sampler(top_k=0, top_k_cap=20).top_k == 20
    assert Sampler(top_k=50, top_k_cap=20).top_k == 20
    assert Sampler(top_k=5, top_k_cap=20).top_k == 5
    assert Sampler(top_k=0).top_k == 0


def test_make_sampler_from_config_object():
    class Cfg:
        temperature, top_k, top_p, min_p, presence_penalty, frequency_penalty, seed = 0.5, 3, 0.9, 0.1, 0.0, 0.0, 11

    s = make_sampler(Cfg(), domain=100)
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed, s.domain) == (0.5, 3, 0.9, 0.1, 11, 100)


@pytest.mark.parametrize("top_p,min_p", [(0.9, 0.0), (0.5, 0.0), (0.99, 0.05), (1.0, 0.05)])
def test_large_rows_sort_only_the_head_and_keep_what_a_full_sort_keeps(top_p, min_p):
    """On a vocabulary-sized row with many ties the sampler sorts only a head found by partition; the
    ids and probabilities equal the full sort's (order by score, lower id first) within the margin."""
    rng = np.random.default_rng(4)
    for trial in range(4):
        x = np.round(rng.standard_normal(248_320) * (1.0 + trial)).astype(np.float32)  # ties everywhere
        x[rng.integers(0, x.size, 8)] += 12.0
        ids, probs = candidates(x, temperature=0.8, top_p=top_p, min_p=min_p)
        order = np.lexsort((np.arange(x.size), -x.astype(np.float64)))
        w = np.exp((x[order].astype(np.float64) - x.max()) / 0.8)
        w = w[w >= np.exp(-30.0)]  # the margin: weights under e^-30 of the top's
        keep = int(np.count_nonzero(w >= min_p)) if min_p else w.size
        if top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(w[:keep]) / w[:keep].sum(), top_p)) + 1)
        assert np.array_equal(ids, order[:keep])
        np.testing.assert_allclose(probs, w[:keep] / w[:keep].sum(), rtol=1e-9)
