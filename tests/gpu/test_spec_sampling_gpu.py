"""Sampled MTP speculation on the CUDA engine: each verified column draws the target's token on the device with the
coin plain decode takes at that position, so a seed gives plain sampling's tokens (the top-k and the histogram
samplers, the top-k one with presence and frequency penalties, drafts accepted everywhere or rejected at each
position), and the tokens follow the target's distribution:
a chi-square test of the first five tokens over thousands of seeds against the exact probabilities from the target's
own logits (top-k 4, or min-p 0.5: a vocabulary of at most a few ids at every step)."""
from collections import Counter

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from test_spec_gpu import PROMPT, _oracle, _plain, _spec, eng  # noqa: E402,F401  (tests/gpu is on sys.path)

# the top-k sampler, and the histogram one over a nucleus of some 20-35 ids (a wide one, top-p 0.9 at these logits'
# scale, keeps ~500: a rounding flips a draw there every ~15 tokens)
SETTINGS = {"topk": dict(temperature=0.9, top_k=8), "histogram": dict(temperature=0.5, top_p=0.5),
            "topk-penalties": dict(temperature=0.9, top_k=8, presence_penalty=1.5, frequency_penalty=0.5)}


def _sampler(seed, **settings):
    from engine.sampling import Sampler

    return Sampler(seed=seed, **settings)


@pytest.mark.parametrize("kind", sorted(SETTINGS))
@pytest.mark.parametrize("drafts", ["mtp", "oracle", "reject-at-2"])
def test_a_seed_gives_plain_samplings_tokens(eng, kind, drafts):
    """The tokens agree with plain sampling's up to where a draw on a boundary went the other way (the verification's
    logits are a rounding away from decode's): a wrong coin would part them at the first verified column."""
    settings, n, agree, rounds, accepted = SETTINGS[kind], 24, [], 0, 0
    seeds = range(24)
    for seed in seeds:
        plain = _plain(eng, PROMPT, n, _sampler(seed, **settings))
        draft = None if drafts == "mtp" else _oracle(PROMPT, plain, corrupt_at=2 if drafts == "reject-at-2" else None)
        out, stats = _spec(eng, PROMPT, n, draft=draft, sampler=_sampler(seed, **settings))
        assert len(out) == n
        agree.append(next((i for i, (a, b) in enumerate(zip(out, plain)) if a != b), n))
        rounds, accepted = rounds + stats.rounds, accepted + stats.accepted
    assert min(agree) >= 2 and sum(a == n for a in agree) >= len(seeds) // 2, agree  # (the prompt's, the plain step's)
    assert sum(a >= 8 for a in agree) >= 0.75 * len(seeds), agree
    if drafts == "oracle":
        assert accepted >= 0.6 * 3 * rounds
    elif drafts == "reject-at-2":
        assert 0.6 * rounds <= accepted <= rounds


def _chi2_p(counts: Counter, probs: dict, n: int) -> float:
    from tests.model.test_speculative_sampling import _chi2_p as chi2_p

    return chi2_p(counts, probs, n)


@pytest.mark.parametrize("settings", [dict(temperature=1.0, top_k=4), dict(temperature=1.0, min_p=0.5),
                                      dict(temperature=1.0, top_k=4, presence_penalty=1.5)],
                         ids=["topk", "histogram", "topk-presence"])
def test_sampled_speculation_follows_the_target_distribution(eng, settings):
    """5 tokens a seed (the prompt's draw, the plain step's, then rounds of K = 3), drafts the target's favourite or
    runner-up by turns (so columns 1 and 2 and the bonus are reached), against the exact distribution of the tree of
    prefixes computed from the target's logits: the third, fourth and fifth tokens' marginals and the joint. Both
    samplers: top-k 4, and the histogram one with min-p 0.5 (one to six ids a step)."""
    from engine.sampling import Sampler

    tree = {}

    def dist(prefix):
        if prefix not in tree:
            eng.reset()
            s = Sampler(**settings)
            for t in prefix:  # (the penalties' counts: the tokens generated before this draw)
                s.accept(t)
            ids, probs = s.distribution(eng._resume(PROMPT + list(prefix)))
            tree[prefix] = dict(zip(ids.tolist(), probs.tolist()))
        return tree[prefix]

    def walk(prefix, p):  # the exact probability of every 5-token outcome
        if len(prefix) == 5:
            yield prefix, p
            return
        for t, q in dist(prefix).items():
            yield from walk(prefix + (t,), p * q)

    exact = dict(walk((), 1.0))

    def draft(tokens, k):  # (the tree only: a draw outside it, a rounding at the top-k edge, drafts id 0)
        g, out = tuple(tokens[len(PROMPT):]), []
        for _ in range(k):
            ranked = sorted(tree.get(g, {0: 1.0}).items(), key=lambda kv: -kv[1])
            out.append(ranked[min(sum(g) % 2, len(ranked) - 1)][0])
            g += (out[-1],)
        return out

    draws, seen, stats = 3000, Counter(), []
    for seed in range(draws):
        out, st = _spec(eng, PROMPT, 5, draft=draft, sampler=Sampler(seed=seed, **settings))
        seen[tuple(out)] += 1
        stats.append(st)
    outside = sum(c for key, c in seen.items() if key not in exact)
    assert outside <= draws // 500, outside  # (the verification's logits are a rounding away from decode's)
    for key in [key for key in seen if key not in exact]:
        del seen[key]
    draws -= outside
    rounds = sum(st.rounds for st in stats)
    at = np.sum([st.accepted_at for st in stats], axis=0)
    assert 0.2 * rounds < at[0] < 0.9 * rounds and at[1] > 0.02 * rounds, (rounds, at)  # (each column reached)
    pvals = []
    for at in (2, 3, 4):
        m, e = Counter(), Counter()
        for key, c in seen.items():
            m[key[at]] += c
        for key, p in exact.items():
            e[key[at]] += p
        pvals.append(_chi2_p(m, dict(e), draws))
    pvals.append(_chi2_p(seen, exact, draws))
    assert min(pvals) > 1e-3 / 4, pvals
