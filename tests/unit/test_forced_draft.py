"""engine.speculative.forced_draft: the per-position acceptance it forces, over many simulated rounds."""
import pytest

from engine.speculative import SpecStats, forced_draft

START = 7  # prompt length: oracle[j] sits at sequence position START + j


def _rounds(accept, k, n_tokens, seed=0):
    """Greedy accept against the oracle as speculative_generate_step does it: the longest right prefix of the
    drafts, then the target's own token. Returns (SpecStats, the generated tokens)."""
    oracle = [(17 * j + 3) % 997 for j in range(n_tokens + k + 1)]
    draft = forced_draft(oracle, START, accept, seed)
    tokens = [1] * START + oracle[:1]
    stats = SpecStats(k)
    while len(tokens) - START < n_tokens:
        drafts = draft(tokens, k)
        j = len(tokens) - START
        stats.rounds += 1
        stats.drafted += k
        m = 0
        while m < k and drafts[m] == oracle[j + m]:
            stats.accepted_at[m] += 1
            m += 1
        stats.accepted += m
        tokens += oracle[j : j + m + 1]
    return stats, tokens[START:], oracle


@pytest.mark.parametrize("accept", [(0.88, 0.77, 0.67), (0.5, 0.5, 0.1), (0.95,), (0.6, 0.3, 0.2, 0.1, 0.05)])
def test_the_acceptance_per_position_matches_the_request(accept):
    k = len(accept)
    stats, _, _ = _rounds(accept, k, 40_000)
    for got, want in zip(stats.acceptance_at(), accept):
        assert got == pytest.approx(want, abs=0.015)
    assert stats.tokens_per_round == pytest.approx(1 + sum(accept), abs=0.03)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_few_rounds_stand_near_the_rates(seed):
    """The rounds' uniforms are a low-discrepancy sequence: over the ~37 rounds of 128 tokens each position's share
    is within 2 rounds of its rate (independent coins stray by ~2 rounds one time in three at 0.88)."""
    accept = (0.88, 0.77, 0.67)
    for n_tokens in (128, 512):
        stats, _, _ = _rounds(accept, 3, n_tokens, seed=seed)
        for got, want in zip(stats.accepted_at, accept):
            assert abs(got - want * stats.rounds) <= 2.0, (n_tokens, stats.accepted_at, stats.rounds)


def test_the_drafts_stay_on_the_oracle_and_diverge_only_where_forced():
    stats, got, oracle = _rounds((1.0, 1.0, 1.0), 3, 200)
    assert got[: len(got)] == oracle[: len(got)]
    assert stats.accepted == stats.drafted  # every draft stands
    stats, _, _ = _rounds((0.0, 0.0, 0.0), 3, 200)
    assert stats.accepted == 0 and stats.rounds == 199


def test_a_seed_reproduces_and_another_differs():
    a, _, _ = _rounds((0.7, 0.5, 0.3), 3, 2000, seed=1)
    b, _, _ = _rounds((0.7, 0.5, 0.3), 3, 2000, seed=1)
    c, _, _ = _rounds((0.7, 0.5, 0.3), 3, 2000, seed=2)
    assert a.accepted_at == b.accepted_at and a.accepted_at != c.accepted_at


def test_corrupted_ids_differ_from_the_oracle_and_stay_in_range():
    draft = forced_draft([0, 5, 0, 9], 2, (0.0, 0.0, 0.0))
    out = draft([4, 4, 0], 3)
    assert out == [4, 1, 8] and all(d >= 0 for d in out)


@pytest.mark.parametrize("accept", [(), (0.5, 0.7), (1.2,), (-0.1,)])
def test_bad_probabilities_are_refused(accept):
    with pytest.raises(ValueError, match="non-increasing probabilities"):
        forced_draft([1, 2], 0, accept)


def test_more_drafts_than_probabilities_is_an_error():
    with pytest.raises(ValueError, match="2 acceptance probabilities"):
        forced_draft([1, 2, 3], 0, (0.9, 0.8))([5], 3)


def test_spec_stats_add():
    a = SpecStats(3, drafted=6, accepted=4, rounds=2, accepted_at=[2, 1, 1], plain_steps=1)
    b = SpecStats(3, drafted=3, accepted=1, rounds=1, accepted_at=[1, 0, 0])
    s = a + b
    assert (s.drafted, s.accepted, s.rounds, s.accepted_at, s.plain_steps) == (9, 5, 3, [3, 1, 1], 1)
    assert s.acceptance_at() == [1.0, 1 / 3, 1 / 3]
