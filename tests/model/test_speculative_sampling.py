"""Sampled speculative decoding draws from the target's distribution: a chi-square test of the first three
generated tokens over many seeds against the exact distribution computed from the target's probabilities,
on a 16-token vocabulary; deliberately wrong acceptance rules fail the same test."""
import copy
import dataclasses
import math
from collections import Counter

import numpy as np
import pytest

import engine.speculative as spec
from engine.api import Engine
from engine.models.qwen3_5 import Model, random_weights
from engine.sampling import PURPOSE_ACCEPT, PURPOSE_CORRECTION, Sampler, counter_uniform
from tests.model.test_mtp import _args

VOCAB = 16
PROMPT = [3, 1, 4]
SETTINGS = dict(temperature=0.7, top_p=0.9, presence_penalty=0.4)
DRAWS = 6000
ALPHA = 1e-3 / 3  # a false alarm rate of 1e-3 for the three p-values of one test (Bonferroni)


def _chi2_sf(x: float, dof: int) -> float:
    """P(chi2_dof >= x): the regularized upper incomplete gamma Q(dof/2, x/2)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    lead = math.exp(-z + a * math.log(z) - math.lgamma(a))
    if z < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        n = a
        while term > total * 1e-15:
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - lead * total)
    b, c, d = z + 1 - a, 1e300, 1 / (z + 1 - a)  # continued fraction for Q (Lentz)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = 1 / (an * d + b)
        c = b + an / c
        delta = c * d
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return lead * h


def _chi2_p(counts: Counter, probs: dict, n: int) -> float:
    """p-value of observed `counts` against `probs` (outcome -> probability; an outcome outside it has
    probability 0, and seeing one gives 0); outcomes expected fewer than 5 times are pooled into one cell."""
    assert sum(counts.values()) == n
    if any(k not in probs for k in counts):
        return 0.0
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for key, p in probs.items():
        if p * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(p * n)
        else:
            rest_o += counts.get(key, 0)
            rest_e += p * n
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return _chi2_sf(stat, len(obs) - 1)


@pytest.fixture(scope="module")
def target():
    """The tiny model and its exact next-token distributions after PROMPT, PROMPT+[a], PROMPT+[a, b] under
    SETTINGS (the presence penalty counting the generated tokens)."""
    args = dataclasses.replace(_args(False), vocab_size=VOCAB)
    model = Model(args).load(random_weights(args, seed=3))
    eng = Engine(model, {}, device="cpu")

    def dist(generated):
        s = Sampler(**SETTINGS)
        s.counts.update(generated)
        ids, probs = s.distribution(eng.logits(PROMPT + list(generated))[-1])
        out = np.zeros(VOCAB)
        out[ids] = probs
        return out

    p1 = dist([])
    p2 = {a: dist([a]) for a in range(VOCAB)}
    p3 = {(a, b): dist([a, b]) for a in range(VOCAB) for b in range(VOCAB)}
    return model, p1, p2, p3


def _draft(p2, p3):
    """Proposes, after the generated tokens g, the token of rank (0, 1, 0, 15)[sum(g) % 4] under the target's
    own distribution: mostly its favourite or runner-up, sometimes its least likely (one top_p has cut);
    contexts past the tables get id 0."""

    def rank_pick(p, g):
        return int(np.argsort(-p, kind="stable")[(0, 1, 0, VOCAB - 1)[sum(g) % 4]])

    def draft(tokens, k):
        g = list(tokens[len(PROMPT) :])
        out = []
        for _ in range(k):
            table = p2 if len(g) == 1 else p3 if len(g) == 2 else None
            key = g[0] if len(g) == 1 else tuple(g)
            d = rank_pick(table[key], g) if table is not None else 0
            out.append(d)
            g.append(d)
        return out

    return draft


def _sample_triples(model, p2, p3, k, draws=DRAWS):
    """Counts of the first three tokens for seeds 0..draws-1. Each draw starts from a copy of the prompt's
    cache, so the prompt is computed once (the engine's prefix reuse then hands back its logits)."""
    eng = Engine(model, {}, device="cpu")
    eng.prefill(PROMPT)
    prompt_cache, prompt_last = copy.deepcopy(eng.cache, {id(np): np}), eng._last
    draft = _draft(p2, p3)
    stats = spec.SpecStats(k)
    seen = Counter()
    for seed in range(draws):
        eng.cache, eng._tokens, eng._last = copy.deepcopy(prompt_cache, {id(np): np}), list(PROMPT), prompt_last
        toks = spec.speculative_generate_step(eng, PROMPT, Sampler(seed=seed, **SETTINGS), k=k, max_tokens=3,
                                              draft=draft, stats=stats)
        seen[tuple(toks)] += 1
    return seen, stats


def _tests(seen, p1, p2, p3, n):
    """p-values: the second token's marginal, the third's, and the (first, second, third) joint."""
    m2, m3, joint = Counter(), Counter(), Counter()
    for (a, b, c), cnt in seen.items():
        m2[b] += cnt
        m3[c] += cnt
        joint[(a, b, c)] += cnt
    e2 = {b: float(sum(p1[a] * p2[a][b] for a in range(VOCAB))) for b in range(VOCAB)}
    e3 = {c: float(sum(p1[a] * p2[a][b] * p3[(a, b)][c] for a in range(VOCAB) for b in range(VOCAB)))
          for c in range(VOCAB)}
    ej = {(a, b, c): float(p1[a] * p2[a][b] * p3[(a, b)][c])
          for a in range(VOCAB) for b in range(VOCAB) for c in range(VOCAB) if p1[a] * p2[a][b] * p3[(a, b)][c] > 0}
    return _chi2_p(m2, e2, n), _chi2_p(m3, e3, n), _chi2_p(joint, ej, n)


@pytest.mark.parametrize("k", [1, 2], ids=["k1-bonus", "k2"])
def test_sampled_tokens_follow_the_target_distribution(target, k):
    model, p1, p2, p3 = target
    seen, stats = _sample_triples(model, p2, p3, k)
    pvals = _tests(seen, p1, p2, p3, DRAWS)
    assert min(pvals) > ALPHA, pvals
    # both outcomes of every verify column were exercised (all accepted with k = 1: the bonus token)
    assert 0.1 * stats.rounds < stats.accepted_at[0] < 0.9 * stats.rounds
    assert k == 1 or 0.02 * stats.rounds < stats.accepted_at[1] < 0.9 * stats.accepted_at[0]


def _draw(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(i, ids.size - 1)])


def _always_accept(sampler, logits, draft, position):
    return int(draft), True


def _resample_from_p(sampler, logits, draft, position):
    """Rejection draws from p itself instead of p without the draft."""
    ids, probs = sampler.distribution(logits)
    hit = np.flatnonzero(ids == draft)
    if counter_uniform(sampler.seed, position, PURPOSE_ACCEPT) < (float(probs[hit[0]]) if hit.size else 0.0):
        return int(draft), True
    return _draw(ids, probs, counter_uniform(sampler.seed, position, PURPOSE_CORRECTION)), False


def _shared_uniform(sampler, logits, draft, position):
    """The correction reuses the acceptance's uniform (conditioned on u >= p(d)) instead of its own."""
    ids, probs = sampler.distribution(logits)
    hit = np.flatnonzero(ids == draft)
    u = counter_uniform(sampler.seed, position, PURPOSE_ACCEPT)
    if u < (float(probs[hit[0]]) if hit.size else 0.0):
        return int(draft), True
    if hit.size:
        ids, probs = np.delete(ids, hit[0]), np.delete(probs, hit[0])
        probs = probs / probs.sum()
    return _draw(ids, probs, u), False


@pytest.mark.parametrize("rule,draws", [(_always_accept, 400), (_resample_from_p, 800), (_shared_uniform, 1500)],
                         ids=["always-accept", "resample-from-p", "shared-uniform"])
def test_wrong_acceptance_rules_fail_the_same_test(target, rule, draws, monkeypatch):
    model, p1, p2, p3 = target
    monkeypatch.setattr(spec, "verify_column", rule)
    seen, _ = _sample_triples(model, p2, p3, 1, draws)
    assert min(_tests(seen, p1, p2, p3, draws)) < ALPHA

