"""MTP speculation on the CUDA engine: the generation loop over `engine.gpu.verify.Speculator`'s rounds, with the
contract of `engine.speculative.speculative_generate_step` (which hands CUDA engines to it).

The loop: the prompt through the target, its final hidden rows through the MTP head as they come
(engine.gpu.mtp_prompt.MtpPrompt; a held sequence the MTP's pool does not cover is prefilled again), the first token from
the prompt's logits (the host sampler), one plain decode step (its hidden state and its pick start the MTP), then
rounds: one graph and one host read each, the accepted tokens yielded one by one; at the end the MTP's rows over the
last round's columns, so the next prompt that extends the sequence reuses it.
The sequence's bookkeeping (`engine._tokens`, the cache position) follows the committed columns; a consumer that
stops inside a round commits what it took (the fold graph), as the NumPy loop does. Fewer than K + 2 free positions:
plain decode for the rest. Sampled rounds draw each column's token on the device with the coin plain decode takes
at its position (engine.gpu.verify.Speculator.round_graph), with presence and frequency penalties under the top-k
sampler (its columns' counts kept on the device); a grammar, a logit bias, or penalties with another sampler decode
plainly.
"""
from __future__ import annotations


def cuda_speculative_generate_step(engine, prompt_ids, sampler, *, k: int, max_tokens: int = -1, cancel=None,
                                   draft=None, stats=None, mtp=None):
    from engine.device_sampling import device_params  # noqa: PLC0415
    from engine.speculative import PLAIN_CONSTRAINT, SpecStats  # noqa: PLC0415

    params = None if sampler.is_greedy else device_params(sampler)
    penalties = not sampler.is_greedy and bool(sampler.presence or sampler.frequency)
    spec = None
    if params is not None and penalties:
        spec = engine.speculator(k)  # (built on first use: the held sequence is dropped then)
    if getattr(sampler, "constraint", None) is not None or (not sampler.is_greedy and (
            params is None or (penalties and not spec.penalties(params)))):
        # a grammar, a logit bias, penalties beside a sampler other than top-k: the host's draws
        from engine.generate import generate_step  # noqa: PLC0415

        if stats is not None:
            stats.plain_why = (PLAIN_CONSTRAINT if getattr(sampler, "constraint", None) is not None
                               else "the GPU's speculative rounds draw with presence or frequency penalties only "
                                    "under a top_k of 1-20, and without logit biases: decoded plainly")
        yield from generate_step(engine, prompt_ids, sampler, max_tokens=max_tokens, cancel=cancel)
        return
    stats = stats if stats is not None else SpecStats(k)
    spec = spec or engine.speculator(k)
    ex = engine.model.executor
    n = 0

    def done() -> bool:
        return n == max_tokens or (cancel is not None and cancel.is_set())

    if done():
        return
    if not spec.follows(engine):  # the MTP's pool lacks rows of the held sequence: prefill it all again
        engine.reset()
    spec.cache = engine.cache
    engine.model.hidden_sink = spec.prompt.absorb  # (the MTP's rows over the prompt, chunk by chunk)
    try:
        logits = engine._resume([int(t) for t in prompt_ids])
    finally:
        engine.model.hidden_sink = None
    spec.cache = engine.cache  # (a prompt that diverges from the held one starts a new sequence)
    fed = sampler(logits, engine.position)  # the last token yielded, not yet fed to the target
    spec.prompt.flush(fed)
    covered = not spec.prompt.lost  # (the MTP's pool holds every row of the prompt)
    sampler.accept(fed)
    yield fed
    n = 1
    started = False
    pending = None  # (columns verified, their ids, accepted) of the round whose fold has not run
    try:
        while not done():
            held = engine.position + (pending[2] if pending is not None else 0)  # (the device is ahead by pending)
            room = engine.max_context - held if engine.max_context else 1 << 30
            if room < k + 2:  # the context edge: plain steps (the MTP's pool then lacks their rows)
                spec.prompt.lost = True
                if pending is not None:
                    spec.commit(_settle(engine, pending))
                    pending = None
                for tok in engine.decode_stream(fed, room if max_tokens < 0 else min(room, max_tokens - n), sampler):
                    stats.plain_steps += 1
                    sampler.accept(tok)
                    yield tok
                    n += 1
                    if done():
                        break
                return
            if not started:  # one plain step: the MTP's first row is its hidden state and its pick
                graph = ex.graph if params is None else ex.prepare_draws(params, sampler.counts)
                ex.set_token(fed)
                graph.launch(ex.stream)
                engine.cache.position += 1
                engine._tokens.append(fed)
                engine._last = None
                spec.start()
                spec.prompt.lost = True  # (until a round catches the MTP up on that step)
                fed = int(ex.tokens[:1].get(stream=ex.stream)[0])
                started = True
                stats.plain_steps += 1
                sampler.accept(fed)
                if penalties:  # (the columns' counts: every token generated so far, this one included)
                    spec.set_counts(sampler.counts)
                yield fed
                n += 1
                continue
            drafts = None
            if draft is not None:
                before = pending[1][:pending[2]] if pending is not None else []
                drafts = [int(d) for d in draft(engine._tokens + before + [fed], k)]
                if len(drafts) != k:
                    raise ValueError(f"the draft gave {len(drafts)} ids, not {k}")
            if pending is not None:  # (the round's graph folds the last round's columns first)
                _settle(engine, pending)
                pending = None
            try:
                m, picks = spec.round(drafts, params)
            except BaseException:
                engine.reset()  # a round cut short leaves the layers out of step with each other
                raise
            ids = [fed] + picks[: k]  # the verified columns' inputs as far as they were accepted
            pending = (m, ids, 0)
            stats.rounds += 1
            stats.drafted += k
            for i in range(m):
                if i < m - 1:
                    stats.accepted += 1
                    stats.accepted_at[i] += 1
                pending = (m, ids, i + 1)
                fed = picks[i]
                sampler.accept(fed)
                yield fed
                n += 1
                if done():
                    break
    finally:
        if pending is not None:  # fold what the consumer took, the MTP's rows over it
            spec.finish(_settle(engine, pending), engine.position)
            spec.prompt.lost = not covered


def _settle(engine, pending) -> int:
    """The host's record of a round's committed columns (the first `taken` of its `ids`); returns their count."""
    _, ids, taken = pending
    engine._tokens.extend(ids[:taken])
    engine.cache.position += taken
    engine._last = None
    return taken
