"""Speculative decoding with the MTP head on the NumPy engine (spec/runtime.md §3.5-3.6).

A round starts from the last sampled token t (not yet fed to the target) and K drafts d_1..d_K:
1. verify [t, d_1..d_K] through the target in one forward of K+1 columns at positions p..p+K; attention
   layers append their KV, GDN layers read the committed state and record what a fold needs
   (engine.models.replay_ssm);
2. accept column by column: d_i stands when it is the target's own pick at column i-1 (its argmax, or its draw
   with the decode coin of that position), which accepts a one-hot proposal with probability p_{i-1}(d_i) and
   otherwise emits a draw from p_{i-1} without d_i, renormalized; with every draft accepted, a bonus token comes
   from column K;
3. commit the columns whose tokens the consumer took: t and the accepted drafts, or fewer when a stop,
   max_tokens or a cancel lands inside the round (the cache then holds exactly the consumed tokens, as after
   plain decode); KV lengths move to p+m, one fold replays the m columns into the GDN state;
4. the MTP layer runs over the committed columns with the target's final hidden states (and the token that
   follows each), then drafts the next K tokens autoregressively by greedy argmax of its proposal head (the
   artifact's shortlist of the target's head rows, mapped to their ids) or, without one, the target's head.
Randomness is the sampler's counter RNG keyed by (seed, position, purpose), with the decode purpose: a sampled
speculative run emits the tokens plain sampling emits with the same seed, whatever the drafts are.
"""
from __future__ import annotations

import dataclasses
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from engine.errors import NinferError
from engine.generate import generate_step
from engine.models.replay_ssm import Verification
from engine.sampling import Sampler, counter_uniform

MAX_DRAFT = 5
DEFAULT_DRAFT = 3  # "MTP3", the published setting
Draft = Callable[[list, int], Sequence[int]]
PURPOSE_FORCED = 0x464F5243  # "FORC": forced_draft's coins, apart from the sampler's purposes
PLAIN_CONSTRAINT = "an output constraint decodes plainly"  # (SpecStats.plain_why of a constrained stream)


def parse_spec(value: str) -> tuple[str, int]:
    """'off' -> ('off', 0); 'mtp:K' -> ('mtp', K) with K in 1..5 ('mtp' alone is mtp:3)."""
    text = str(value).strip().lower()
    if text == "off":
        return "off", 0
    kind, sep, num = text.partition(":")
    if kind != "mtp":
        raise NinferError(f"unknown speculation {value!r}", "use --spec off or --spec mtp:K (K = 1..5)")
    if not sep:
        return "mtp", DEFAULT_DRAFT
    if not num.isdigit() or not 1 <= int(num) <= MAX_DRAFT:
        raise NinferError(f"--spec {value}: K is the number of draft tokens a round, 1..{MAX_DRAFT}",
                          "use for example --spec mtp:3")
    return "mtp", int(num)


@dataclass
class SpecStats:
    """Counters of speculative rounds (runtime.md §3.6 stats): K drafted and `accepted_at[i]` for each
    draft position accepted; `plain_steps` are one-token steps taken near the context edge."""

    k: int
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    accepted_at: list[int] = field(default_factory=list)
    plain_steps: int = 0
    plain_why: str = ""  # why the whole stream decoded plainly (a sampler the rounds cannot draw for), or ""

    def __post_init__(self):
        if not self.accepted_at:
            self.accepted_at = [0] * self.k

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    def __add__(self, other: "SpecStats") -> "SpecStats":
        """The counters of two runs together (a turn the thinking budget split into two streams)."""
        k = max(self.k, other.k)
        at = [a + b for a, b in zip(self.accepted_at + [0] * (k - self.k), other.accepted_at + [0] * (k - other.k))]
        return SpecStats(k, self.drafted + other.drafted, self.accepted + other.accepted, self.rounds + other.rounds,
                         at, self.plain_steps + other.plain_steps, self.plain_why or other.plain_why)

    def acceptance_at(self) -> list[float]:
        """The share of rounds whose draft position i was accepted, for i = 1..k (cumulative: a position
        stands only when every one before it does)."""
        return [a / self.rounds if self.rounds else 0.0 for a in self.accepted_at]

    def snapshot(self) -> "SpecStats":
        return dataclasses.replace(self, accepted_at=list(self.accepted_at))

    def as_dict(self) -> dict:
        return {"k": self.k, "drafted": self.drafted, "accepted": self.accepted, "rounds": self.rounds,
                "accepted_per_position": list(self.accepted_at), "plain_steps": self.plain_steps,
                "acceptance": self.acceptance, "tokens_per_round": self.tokens_per_round,
                **({"plain": self.plain_why} if self.plain_why else {})}


GOLDEN = (5.0 ** 0.5 - 1.0) / 2.0  # (forced_draft's low-discrepancy step)


def forced_draft(oracle: Sequence[int], start: int, accept: Sequence[float], seed: int = 0) -> Draft:
    """A Draft that proposes `oracle`'s tokens (oracle[j] is the token at sequence position start + j, the
    target's own greedy continuation), kept right with the cumulative per-position probabilities `accept`
    (accept[i-1]: the share of rounds whose position i stands, non-increasing) and corrupted otherwise.

    A round (a call) draws one uniform u and keeps its first d drafts right, d the positions i with u < accept[i-1];
    from the first corrupted one on, each id is replaced by another. So position i stands in a share accept[i-1] of the
    rounds, and only while every position before it does. The n-th round's u is frac(u0 + n * 0.618...) (u0 keyed by
    the seed): a low-discrepancy sequence, so over N rounds each share is within about 1/N of its rate, where
    independent coins stray by about 1/sqrt(N) (over the ~37 rounds of 128 tokens: several percent). A draft replays
    its rounds in order, so a run takes a new one; a seed reproduces the run. Past the oracle's end it proposes id 0.
    """
    probs = [float(a) for a in accept]
    if not probs or any(not 0.0 <= a <= 1.0 for a in probs) or any(b > a for a, b in zip(probs, probs[1:])):
        raise ValueError(f"accept must be non-increasing probabilities in [0, 1], not {list(accept)}")
    oracle = [int(t) for t in oracle]
    u0 = counter_uniform(seed, start, PURPOSE_FORCED)
    n = 0  # (rounds drawn)

    def draft(tokens: list, k: int) -> list[int]:
        nonlocal n
        if k > len(probs):
            raise ValueError(f"forced_draft has {len(probs)} acceptance probabilities, the round drafts {k}")
        u = (u0 + n * GOLDEN) % 1.0
        n += 1
        base = len(tokens)  # draft i sits at sequence position base - 1 + i
        out = []
        for i in range(k):
            j = base + i - start
            tok = oracle[j] if 0 <= j < len(oracle) else 0
            out.append(tok if u < probs[i] else (tok - 1 if tok > 0 else tok + 1))
        return out

    return draft


# --- accept -------------------------------------------------------------------------------------------


def verify_column(sampler: Sampler, logits, draft: int, position: int) -> tuple[int, bool]:
    """(token at `position`, whether it is `draft`): the target's own draw at `position` (its argmax when greedy),
    `draft` standing when the two agree.

    For a one-hot proposal this is the rejection rule of spec/runtime.md §3.6 in another order: the draft stands with
    probability p(d), and when it does not, the token is distributed as p without d, renormalized. Drawing with the
    decode coin of (seed, position) makes the speculative tokens the ones plain sampling draws with the same seed."""
    tok = sampler(logits, position)
    return tok, tok == draft


def bonus_token(sampler: Sampler, logits, position: int) -> int:
    """The token after a round whose drafts were all accepted, from the last verified column."""
    return sampler(logits, position)


# --- drafts -------------------------------------------------------------------------------------------


class MTPDrafter:
    """The MTP head's view of one engine sequence: its own one-layer KV cache at MTP positions 0..q-1 and
    the target's final hidden states of positions q..n-1 that have not been through the MTP layer yet
    (MTP position t reads (h_t, x_{t+1}), so a row waits for the token after it).

    Follows the engine's cache object: `follows(engine)` is False after a reset or plain-decoded tokens.
    """

    def __init__(self, engine):
        self.model, self.cache, self.domain = engine.model, engine.cache, engine.domain
        self.mtp_cache = self.model.make_mtp_cache()
        self.pending: list = []

    @property
    def position(self) -> int:
        return self.mtp_cache.position + sum(int(h.shape[0]) for h in self.pending)

    def follows(self, engine) -> bool:
        return engine.cache is self.cache and self.position == engine.position

    def __call__(self, tokens: list, k: int) -> list[int]:
        """k greedy drafts after `tokens`, the sequence's ids whose last one the target has not consumed."""
        q, n = self.mtp_cache.position, len(tokens) - 1
        xp = self.model.xp
        hidden = xp.concatenate(self.pending) if len(self.pending) > 1 else self.pending[0]
        _, h = self.model.mtp(hidden, tokens[q + 1 : n + 1], self.mtp_cache, logits=False)
        self.pending = []
        out = [self.model.propose(h[-1], self.domain)]
        h = h[-1:]
        for _ in range(k - 1):
            _, h = self.model.mtp(h, out[-1:], self.mtp_cache, logits=False)
            out.append(self.model.propose(h[-1], self.domain))
        self.mtp_cache.trim(n)  # the autoregressive rows sit at positions the next round rewrites
        return out


def _host(x) -> np.ndarray:
    return x.get() if hasattr(x, "get") else np.asarray(x)


@contextmanager
def _capturing(engine, drafter: MTPDrafter | None):
    """Hand the target's hidden states of whatever the engine feeds to `drafter`."""
    if drafter is None:
        yield
        return
    engine._hidden_sink = drafter.pending.append
    try:
        yield
    finally:
        engine._hidden_sink = None


def _prefill(engine, prompt: list[int], use_mtp: bool):
    """Last logits of `prompt` through the engine's prefix reuse, and the MTP drafter that follows it."""
    if not use_mtp:
        engine._mtp_drafter = None
        return engine._resume(prompt), None
    drafter = getattr(engine, "_mtp_drafter", None)
    if drafter is None or not drafter.follows(engine):
        if engine.position:  # the held prefix's hidden states are gone: compute it again
            engine.reset()
        drafter = MTPDrafter(engine)
    engine._mtp_drafter = None
    before = len(drafter.pending)
    with _capturing(engine, drafter):
        logits = engine._resume(prompt)
    if engine.cache is not drafter.cache:  # prefix reuse started over: the rows just captured are the prompt's
        rows = drafter.pending[before:]
        drafter = MTPDrafter(engine)
        drafter.pending = rows
    if not drafter.follows(engine):
        raise RuntimeError("the MTP drafter lost track of the sequence")
    engine._mtp_drafter = drafter
    return logits, drafter


def _verify(engine, ids: list[int]) -> Verification:
    try:
        return Verification(engine.model, ids, engine.cache)
    except BaseException:
        engine.reset()  # a forward cut short leaves its layers out of step with each other
        raise


def _commit(engine, ver: Verification, ids: list[int], logits: np.ndarray, m: int, drafter) -> None:
    if m and ver.commit(m):
        engine._tokens.extend(ids[:m])
        engine._last = np.asarray(logits[m - 1], dtype=np.float32)
        if drafter is not None:
            drafter.pending.append(ver.hidden[:m])


# --- the loop -----------------------------------------------------------------------------------------


def speculative_generate_step(
    engine,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    *,
    k: int,
    max_tokens: int = -1,
    cancel: threading.Event | None = None,
    draft: Draft | None = None,
    stats: SpecStats | None = None,
    mtp: bool | None = None,
) -> Iterator[int]:
    """Like engine.generate.generate_step (lazy; `cancel` checked after every token; `sampler.accept` for
    every yielded token), drafting k tokens a round and verifying them in one forward.

    `engine`: the NumPy Engine (engine.api.Engine over a Qwen3.5 model). `draft(tokens, k)` proposes k ids
    after `tokens` (the sequence so far, its last id not yet fed); None uses the model's MTP head. `mtp`
    (default: no draft given) runs the MTP head every round even when `draft` overrides its proposals, so its
    cost and state stay in the round (forced acceptance in benchmarks). `stats` collects the counters. Fewer
    than k+1 free positions before `engine.max_context` take plain steps.
    """
    if not 1 <= k <= MAX_DRAFT:
        raise ValueError(f"k must be 1..{MAX_DRAFT}, not {k}")
    if hasattr(engine, "speculator"):  # the CUDA engine: its rounds are graphs (engine/gpu_spec.py)
        from engine.gpu_spec import cuda_speculative_generate_step  # noqa: PLC0415

        yield from cuda_speculative_generate_step(engine, prompt_ids, sampler, k=k, max_tokens=max_tokens,
                                                  cancel=cancel, draft=draft, stats=stats, mtp=mtp)
        return
    if getattr(sampler, "constraint", None) is not None:  # per-column masks are not built: decode plainly
        if stats is not None:
            stats.plain_why = PLAIN_CONSTRAINT
        yield from generate_step(engine, prompt_ids, sampler, max_tokens=max_tokens, cancel=cancel)
        return

    def done() -> bool:
        return n == max_tokens or (cancel is not None and cancel.is_set())

    n = 0
    if done():
        return
    stats = stats if stats is not None else SpecStats(k)
    mtp = draft is None if mtp is None else mtp
    if (mtp or draft is None) and getattr(engine.model, "mtp_layer", None) is None:
        raise ValueError("this model has no MTP head: pass a draft")
    logits, drafter = _prefill(engine, [int(t) for t in prompt_ids], use_mtp=mtp)
    tok = sampler(logits, engine.position)
    sampler.accept(tok)
    yield tok
    n = 1
    while not done():
        p = engine.position
        if engine.max_context and engine.max_context - p < k + 1:
            with _capturing(engine, drafter):
                logits = engine.decode_step(tok)
            stats.plain_steps += 1
            tok = sampler(logits, engine.position)
            sampler.accept(tok)
            yield tok
            n += 1
            continue
        tokens = engine._tokens + [tok]
        try:
            drafts = drafter(tokens, k) if drafter is not None else None
        except BaseException:
            engine._mtp_drafter = None  # its cache may hold part of a pass
            raise
        drafts = [int(d) for d in (draft(tokens, k) if draft is not None else drafts)]
        if len(drafts) != k:
            raise ValueError(f"the draft gave {len(drafts)} ids, not {k}")
        ids = [tok] + drafts
        ver = _verify(engine, ids)
        rows = _host(ver.logits)
        stats.rounds += 1
        stats.drafted += k
        m = 0  # columns consumed: t and the drafts accepted before the token last yielded
        try:
            for i in range(1, k + 2):
                if i <= k:
                    tok, ok = verify_column(sampler, rows[i - 1], ids[i], p + i)
                else:
                    tok, ok = bonus_token(sampler, rows[k], p + i), False
                if ok:
                    stats.accepted += 1
                    stats.accepted_at[i - 1] += 1
                m = i
                sampler.accept(tok)
                yield tok
                n += 1
                if not ok or done():
                    break
        finally:
            _commit(engine, ver, ids, rows, m, drafter)


def check_spec(engine, spec: str | None) -> tuple[str, int]:
    """parse_spec(spec) when `engine` can run it; a NinferError with the next action when it cannot."""
    kind, k = parse_spec(spec or "off")
    if kind == "off":
        return kind, k
    if hasattr(engine, "speculator"):  # the CUDA engine
        model = getattr(engine, "model", None)
        if not getattr(model, "mtp_weights", None):
            raise NinferError(f"--spec {spec} needs a model with an MTP head",
                              "use --spec off, or a model whose artifact carries the mtp weights")
        return kind, k
    if getattr(engine, "device", "cpu") != "cpu":
        raise NinferError(f"--spec {spec} is not built for this engine", "use --spec off")
    if getattr(getattr(engine, "model", None), "mtp_layer", None) is None:
        raise NinferError(f"--spec {spec} needs a model with an MTP head",
                          "use --spec off, or a model whose artifact carries the mtp weights")
    return kind, k


def draft_head(engine) -> str:
    """What the MTP head drafts through: "proposal N" (a shortlist head of N rows, the artifact's) or "target" (the
    target's head over the whole vocabulary)."""
    model = getattr(engine, "model", None)
    head = (getattr(model, "mtp_weights", None) or {}).get("proposal/head")  # (the CUDA engine's weights)
    if head is not None:
        return f"proposal {head.n}"
    proposal = getattr(model, "proposal", None)  # (the NumPy model's)
    return f"proposal {proposal[0].shape[0]}" if proposal is not None else "target"


def speculative_steps(engine, prompt: list[int], config, sampler: Sampler, cancel=None):
    """(token generator, SpecStats) for `Engine.stream` under `config.spec`, or (None, None) when it is off.
    Refuses, with the next action, engines and models it cannot run on."""
    kind, k = check_spec(engine, config.spec)
    if kind == "off":
        return None, None
    stats = SpecStats(k)
    steps = speculative_generate_step(engine, prompt, sampler, k=k, max_tokens=config.max_tokens, cancel=cancel,
                                      stats=stats)
    return steps, stats


def with_stats(stream, stats: SpecStats):
    """Pass `stream`'s Responses on, each carrying a snapshot of `stats` as `spec`."""
    try:
        for r in stream:
            r.spec = stats.snapshot()
            yield r
    finally:
        stream.close()  # a round cut short commits what its consumer took now, not at garbage collection
