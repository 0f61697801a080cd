"""The speculative rows of `ninfer bench` (engine.bench.run_test): rounds timed through `stream_generate` as
`Engine.stream` hands them, forced acceptance from the plain greedy oracle with its identity check, the row's
counters."""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class SpecRun:
    """How a speculative instance decodes: K drafts a round; with `accept` (forced acceptance) the drafts are
    `oracle`, the plain greedy continuation, kept right with these cumulative per-position probabilities
    (engine.speculative.forced_draft) while the MTP head still runs every round."""

    k: int
    accept: tuple[float, ...] | None = None
    oracle: tuple[int, ...] = ()
    seed: int = 0  # of the forced coins: each repetition draws its own (run_test)


class SpecMismatch(RuntimeError):
    """Speculative greedy output that is not the plain greedy output (a bug, reported as an error row)."""


def speculated(engine, ids: list[int], n_gen: int, sampling: Sampling, spec: SpecRun):
    """(time to the first token, time from it to the last, SpecStats) of speculative rounds generating 1 + n_gen
    tokens after `ids`, each token handed through `stream_generate` as `Engine.stream` hands them. Forced
    acceptance checks every token against the oracle."""
    from engine.generate import stream_generate  # noqa: PLC0415
    from engine.sampling import make_sampler  # noqa: PLC0415
    from engine.speculative import SpecStats, forced_draft, speculative_generate_step  # noqa: PLC0415

    config = sampling.config(n_gen + 1)
    sampler = make_sampler(config, domain=engine.domain)
    stats = SpecStats(spec.k)
    draft = None
    if spec.accept is not None:
        draft = forced_draft(spec.oracle, len(ids), spec.accept, seed=spec.seed)
    steps = speculative_generate_step(engine, ids, sampler, k=spec.k, max_tokens=n_gen + 1, draft=draft, stats=stats,
                                      mtp=True if draft is not None else None)
    tok = getattr(engine, "tokenizer", None)
    clock = time.perf_counter
    t0 = clock()
    t_first, out, last = None, [], None
    for rec in stream_generate(None, ids, config, sampler, steps=steps, memory_fn=engine.memory_bytes,
                               detokenizer=tok.detokenizer() if tok is not None else None):
        if t_first is None:
            t_first = clock()
        out.append(rec.token)
        last = rec
    t1 = clock()
    if len(out) != n_gen + 1 or last.finish_reason != "length":
        raise RuntimeError(f"the speculative stream gave {len(out)} tokens ({last.finish_reason}), asked for "
                           f"{n_gen + 1}")
    if spec.accept is not None and out != list(spec.oracle[: n_gen + 1]):
        i = next(i for i, (a, b) in enumerate(zip(out, spec.oracle)) if a != b)
        raise SpecMismatch(f"greedy identity broken: speculative token {i} is {out[i]}, plain decode gave "
                           f"{spec.oracle[i]}")
    return t_first - t0, t1 - t_first, stats


def spec_oracle(engine, test: Test, tokens: list[int], k: int) -> tuple[int, ...]:
    """The plain greedy continuation a forced-acceptance run of `test` drafts from: 1 + n_gen tokens after its
    prompt, and k more so the last round has drafts to propose (untimed)."""
    from engine.bench import Sampling  # noqa: PLC0415

    d, p = test.depth, test.n_prompt
    engine.reset()
    seek = 0
    if d and getattr(engine, "synthetic_depth", False):
        engine.seek_synthetic(d)
        seek, d = d, 0
    ids = [0] * seek + tokens[:d] + tokens[d : d + max(p, 1)]
    return tuple(int(r.token) for r in engine.stream(ids, Sampling().config(test.n_gen + 1 + k)))


def spec_fields(spec: SpecRun, runs: list[dict]) -> dict:
    """A speculative row's counters, summed over the timed repetitions, and the mean round time."""
    from engine.speculative import SpecStats  # noqa: PLC0415

    total = SpecStats(spec.k)
    for r in runs:
        total = total + r["spec"]
    decode_s = sum(r["decode"] for r in runs)
    return {"spec_forced": list(spec.accept) if spec.accept is not None else None,
            "greedy_identity": "checked" if spec.accept is not None and runs else None,
            "drafted": total.drafted, "accepted": total.accepted, "rounds": total.rounds,
            "accepted_per_position": list(total.accepted_at), "plain_steps": total.plain_steps,
            "acceptance": total.acceptance, "acceptance_per_position": total.acceptance_at(),
            "tokens_per_round": total.tokens_per_round,
            "round_ms": 1e3 * decode_s / total.rounds if total.rounds else None}
