"""Token sampling (spec/runtime.md §3.7): greedy, temperature, top-k, top-p, min-p, penalties.

Randomness is counter-based: the uniform number that draws the token at a sequence position is a pure
function of (seed, position, purpose), so the same seed gives the same tokens whatever ran before, and a
GPU sampler can reproduce it exactly. Ids at or above the token domain (Qwen's reserved head rows) are
never produced.
"""
from __future__ import annotations

import secrets
from collections import Counter

import numpy as np

PURPOSE_PREFILL, PURPOSE_DECODE, PURPOSE_ACCEPT, PURPOSE_CORRECTION, PURPOSE_BONUS = range(5)
_M64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def counter_uniform(seed: int, position: int, purpose: int = PURPOSE_DECODE) -> float:
    """Uniform in [0, 1) from (seed, position, purpose): splitmix64 chained over the three, top 53 bits."""
    z = _splitmix64(_splitmix64(_splitmix64(seed & _M64) ^ (position & _M64)) ^ (purpose & _M64))
    return (z >> 11) * (1.0 / (1 << 53))


class SparseLogits:
    """The logits of a few ids (ascending), every other id taken as -inf: what a GPU engine sends back
    instead of the whole row when it kept only the ids within `Sampler.margin()` of the maximum (the
    rest would have probability below e^-30 of the top token's, or no chance at all under greedy)."""

    __slots__ = ("ids", "values", "size")

    def __init__(self, ids, values, size: int):
        self.ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        self.values = np.asarray(values, dtype=np.float64).reshape(-1)
        self.size = int(size)
        if self.ids.size == 0 or self.ids.size != self.values.size:
            raise ValueError("SparseLogits needs at least one id and one value per id")


def mask_logits(logits, allowed: np.ndarray):
    """`logits` with every id that `allowed` (bool [n]) does not hold taken out: a dense row comes back
    as a float32 copy with those ids at -inf (ids past n too), SparseLogits as the allowed ids only."""
    if isinstance(logits, SparseLogits):
        ids = logits.ids
        keep = np.zeros(ids.size, bool)
        inside = ids < allowed.size
        keep[inside] = allowed[ids[inside]]
        if not keep.any():
            raise ValueError("the sparse logits hold no id the constraint allows (constrained steps need full logits)")
        return SparseLogits(ids[keep], logits.values[keep], logits.size)
    x = np.asarray(logits).reshape(-1)
    n = min(x.size, allowed.size)
    out = np.full(x.size, -np.inf, np.float32)
    np.copyto(out[:n], x[:n], where=allowed[:n])
    return out


def greedy(logits, domain: int | None = None) -> int:
    """argmax over ids < domain; the lowest id wins ties."""
    if isinstance(logits, SparseLogits):
        keep = logits.ids < domain if domain else slice(None)
        ids, vals = logits.ids[keep], logits.values[keep]
        return int(ids[np.argmax(vals)])  # ids ascend, so the first maximum is the lowest id
    x = np.asarray(logits).reshape(-1)
    return int(np.argmax(x[:domain] if domain else x))


def apply_penalties(logits, counts: Counter | dict, presence: float, frequency: float) -> np.ndarray:
    """logit - presence * (count > 0) - frequency * count, over the ids in `counts`; returns a float64 copy."""
    x = np.array(logits, dtype=np.float64).reshape(-1)
    if counts and (presence or frequency):
        ids = np.fromiter((i for i in counts if 0 <= i < x.size), dtype=np.int64)
        c = np.fromiter((counts[i] for i in ids), dtype=np.float64, count=ids.size)
        x[ids] -= presence * (c > 0) + frequency * c
    return x


def _head(x: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest of x (with every tie at the boundary) in the order (-x, position):
    a prefix of the full order, found by partition instead of a sort of all of x."""
    kth = np.partition(-x, k - 1)[k - 1]
    pool = np.flatnonzero(-x <= kth)  # ascending positions
    return pool[np.argsort(-x[pool], kind="stable")]


def _top_p_head(x: np.ndarray, temperature: float, top_p: float, min_p: float) -> tuple[np.ndarray, float]:
    """The prefix of x's order (-x, position) that top_p and min_p can keep, and the weight of every id
    min_p keeps (top_p's denominator). Candidates grow 8x from 256 until their weight reaches top_p of
    that total or they hold every id min_p keeps."""
    w_all = np.exp((x - x.max()) / temperature)
    total = float(w_all[w_all >= min_p].sum()) if min_p > 0.0 else float(w_all.sum())
    k = 256
    while k < x.size:
        pool = _head(x, k)
        w = w_all[pool]
        if min_p > 0.0 and w[-1] < min_p:  # past the last id min_p keeps
            return pool, total
        if top_p < 1.0 and w[w >= min_p].sum() >= top_p * total:
            return pool, total
        k *= 8
    return np.argsort(-x, kind="stable"), total


# How many temperatures below the top logit an id can be and still carry weight (e^-30 of the top's);
# the sampler drops the rest before sorting, and a GPU engine reads back only those (`Sampler.margin`).
MARGIN_TEMPERATURES = 30.0


def candidates(
    logits,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    counts=None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    domain: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The filtered distribution a sampling step draws from: (ids, probs), ids sorted by score (desc, lower id first).

    Order of operations (runtime.md §3.7): penalties -> sort -> top_k -> weights exp((x - max) / T) ->
    min_p drops weights below min_p * max -> top_p keeps the shortest prefix whose normalized mass
    reaches top_p -> renormalize. top_k <= 0 keeps all; temperature must be > 0.
    """
    if isinstance(logits, SparseLogits):  # the same steps over the ids the engine kept
        ids = logits.ids
        x = logits.values.copy()
        if counts and (presence_penalty or frequency_penalty):
            c = np.fromiter((counts.get(int(i), 0) for i in ids), dtype=np.float64, count=ids.size)
            x -= presence_penalty * (c > 0) + frequency_penalty * c
        if domain:
            keep = ids < domain
            ids, x = ids[keep], x[keep]
    else:
        x = apply_penalties(logits, counts or {}, presence_penalty, frequency_penalty)
        if domain:
            x = x[:domain]
        # only ids within MARGIN_TEMPERATURES of the top carry weight above e^-30 of the top's: sort those
        # (a 248,320-entry row sorted whole took ~30 ms a token on the host)
        ids = np.flatnonzero(x >= x.max() - MARGIN_TEMPERATURES * float(temperature))
        x = x[ids]
    n = x.size
    total = None  # the weight of every id min_p keeps, when the pool below is only a prefix of them
    if 0 < top_k < n:
        pool = _head(x, top_k)[:top_k]
    elif top_p < 1.0 or min_p > 0.0:
        pool, total = _top_p_head(x, float(temperature), top_p, min_p)
    else:
        pool = np.argsort(-x, kind="stable")  # by score, lower id first among equals
    w = np.exp((x[pool] - x[pool[0]]) / float(temperature))
    keep = w.size
    if min_p > 0.0:
        keep = int(np.count_nonzero(w >= min_p * w[0]))  # w is non-increasing, so this is a prefix
    if top_p < 1.0:
        cum = np.cumsum(w[:keep]) / (w[:keep].sum() if total is None else total)
        keep = min(keep, int(np.searchsorted(cum, top_p, side="left")) + 1)
    keep = max(keep, 1)
    w = w[:keep]
    chosen = ids[pool[:keep]]
    return chosen, w / w.sum()


class Sampler:
    """Stateful sampler of one sequence: remembers generated-token counts for the penalties.

    `sampler(logits, position)` returns the next id; call `accept(token)` for every token that becomes
    part of the generation (the generate loop does). temperature <= 0 is greedy without penalties.
    `top_k_cap` reproduces the upstream GPU sampler (top_k clamped to <= 20, 0 meaning 20) when set.
    `constraint` (an `engine.constraints.ConstraintMatcher`) masks every draw, greedy or sampled, and is
    told every accepted token.
    """

    def __init__(
        self,
        temperature: float = 0.7,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        domain: int | None = None,
        top_k_cap: int | None = None,
        constraint=None,
    ):
        self.temperature, self.top_p, self.min_p = float(temperature), float(top_p), float(min_p)
        self.top_k = int(top_k or 0)
        if top_k_cap:
            self.top_k = top_k_cap if self.top_k <= 0 else min(self.top_k, top_k_cap)
        self.presence, self.frequency = float(presence_penalty), float(frequency_penalty)
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        self.domain = domain
        self.counts: Counter = Counter()
        self.constraint = constraint

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0.0

    def __call__(self, logits, position: int, purpose: int = PURPOSE_DECODE) -> int:
        if self.constraint is not None:
            logits = mask_logits(logits, self.constraint.mask())
        if self.is_greedy:
            return greedy(logits, self.domain)
        ids, probs = self.distribution(logits)
        u = counter_uniform(self.seed, position, purpose)
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(ids[min(i, ids.size - 1)])

    def distribution(self, logits) -> tuple[np.ndarray, np.ndarray]:
        """(ids, probs) this sampler would draw from for `logits`, given the counts so far."""
        return candidates(
            logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            counts=self.counts, presence_penalty=self.presence, frequency_penalty=self.frequency, domain=self.domain,
        )

    def margin(self) -> float:
        """How far below the top logit an id can be and still matter to this sampler: 0 for greedy, else
        30 temperatures (a weight under e^-30 of the top's) plus the largest penalty an id can take (a
        penalized top can fall by that much). A GPU engine sends back only the ids within it."""
        if self.is_greedy:
            return 0.0
        margin = MARGIN_TEMPERATURES * self.temperature
        if self.counts and self.presence:
            margin += self.presence
        if self.counts and self.frequency:  # the only case that scans the counts (once a token)
            margin += self.frequency * max(self.counts.values())
        return margin

    def accept(self, token: int) -> None:
        """Count a generated token (presence/frequency penalties read these counts) and hand it to the
        constraint, if any."""
        self.counts[int(token)] += 1
        if self.constraint is not None:
            self.constraint.accept(token)

    def reset(self) -> None:
        self.counts.clear()


def make_sampler(config=None, *, domain: int | None = None, **overrides) -> Sampler:
    """A Sampler from a GenerationConfig-like object (fields temperature, top_k, top_p, min_p,
    presence_penalty, frequency_penalty, seed) and/or keyword overrides."""
    names = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty", "seed", "top_k_cap")
    kw = {n: getattr(config, n) for n in names if config is not None and hasattr(config, n)}
    kw.update(overrides)
    return Sampler(domain=domain, **kw)
