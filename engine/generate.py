"""Generation loop over any engine that speaks the low-level protocol (prefill / decode_step / position).

`generate_step` yields token ids; `stream_generate` turns them into `Response` records (text deltas,
rates, finish reason). Both are lazy: a token is fed back to the model only when the consumer asks
for the next one, so stopping or cancelling never computes a token that is thrown away.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

from engine.device_sampling import device_params, masked_params
from engine.sampling import Sampler

if TYPE_CHECKING:
    from engine.constraints import Constraint


@dataclass
class GenerationConfig:
    """What to generate; `temperature == 0` is greedy. Stop ids are added to the tokenizer's EOS ids
    unless `ignore_eos`. `constraint` (engine.constraints.Constraint) restricts the answer to a JSON
    object, a schema, a regex, a grammar or a choice."""

    max_tokens: int = 512
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    spec: str = "off"  # speculative decoding: "off" or "mtp:K", K = 1..5 (engine.speculative.parse_spec)
    constraint: "Constraint | None" = None


@dataclass
class Response:
    """One streamed record. `text` is new text since the last record; `finish_reason` is None until the
    last record, then "stop" | "length" | "cancelled". Rates are tokens/s; `memory` is GB (1e9 bytes)
    held by the engine (weights + caches)."""

    text: str
    token: int | None
    reasoning: str = ""
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    memory: float = 0.0
    finish_reason: str | None = None
    spec: object = None  # engine.speculative.SpecStats so far, when the stream speculates


def generate_step(
    engine,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    *,
    max_tokens: int = -1,
    cancel: threading.Event | None = None,
) -> Iterator[int]:
    """Prefill `prompt_ids`, then yield sampled ids one at a time (max_tokens < 0: no limit).

    The sampler draws the token at position p with its counter RNG keyed by p (p = tokens before it),
    so a seed reproduces the same tokens. `cancel` is checked before every token. GPU engines that draw on
    the device (`decode_stream`, engine.device_sampling) take every token after the first from the graph,
    the device a step ahead of this loop; the others feed each token back when the next one is asked for.
    With `sampler.constraint` set, an engine with `decode_masked` draws each token on the device under the
    grammar's bitmask when its top-k sampler takes the sampler (engine.device_sampling.masked_params); otherwise
    every step takes the full logits on the host (the mask may allow ids the sparse read-back or the device
    sampler never sees). A complete grammar ends with its stop id without another model step.
    """
    if max_tokens == 0 or (cancel is not None and cancel.is_set()):
        return
    logits = engine.prefill(list(prompt_ids))
    constraint = getattr(sampler, "constraint", None)
    tok = sampler(logits, engine.position)
    sampler.accept(tok)
    yield tok
    n = 1
    if n == max_tokens or (cancel is not None and cancel.is_set()):
        return
    stream = getattr(engine, "decode_stream", None) if constraint is None else None
    params = device_params(sampler) if stream is not None else None
    if params is not None:
        left = max_tokens - 1 if max_tokens > 0 else 1 << 40
        steps = stream(tok, left, params, counts=sampler.counts)
        try:
            for tok in steps:
                sampler.accept(tok)
                yield tok
                if cancel is not None and cancel.is_set():
                    return
        finally:
            steps.close()
        return
    masked = getattr(engine, "decode_masked", None) if constraint is not None else None
    params = masked_params(sampler) if masked is not None else None
    if params is not None:  # the grammar's mask applied on the device, computed here from each token
        left = max_tokens - 1 if max_tokens > 0 else 1 << 40
        steps = masked(tok, left, params, lambda: None if constraint.done else constraint.bitmask(),
                       counts=sampler.counts)
        try:
            for tok in steps:
                sampler.accept(tok)
                yield tok
                n += 1
                if cancel is not None and cancel.is_set():
                    return
        finally:
            steps.close()
        if n != max_tokens and constraint.done and constraint.stop_id is not None and not constraint.stopped:
            yield constraint.stop_id
        return
    # GPU engines: only the ids that can matter (not under a constraint, whose mask may allow others)
    sparse = getattr(engine, "decode_step_sparse", None) if constraint is None else None
    while True:
        if constraint is not None and constraint.done and constraint.stop_id is not None:
            if not constraint.stopped:
                yield constraint.stop_id
            return
        logits = sparse(tok, sampler.margin()) if sparse is not None else engine.decode_step(tok)
        tok = sampler(logits, engine.position)
        sampler.accept(tok)
        yield tok
        n += 1
        if n == max_tokens or (cancel is not None and cancel.is_set()):
            return


class _StopStrings:
    """Holds back text that could still become a stop string; cuts the text at the first match."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buf[: min(hits)], True
        keep = 0
        for s in self.stops:  # longest suffix of buf that is a proper prefix of a stop string
            for k in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:k]):
                    keep = k
                    break
        self.held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def stream_generate(
    engine,
    prompt_ids: Sequence[int],
    config: GenerationConfig,
    sampler: Sampler,
    *,
    detokenizer=None,
    stop_token_ids: Sequence[int] = (),
    cancel: threading.Event | None = None,
    memory_fn=None,
    steps: Iterator[int] | None = None,
) -> Iterator[Response]:
    """Yield one `Response` per generated token, the last one carrying `finish_reason`.

    A stop token ends the stream with "stop" (its text is not emitted); a stop string ends it with
    "stop" and the text up to the string; `config.max_tokens` gives "length"; `cancel` gives
    "cancelled" with `token=None`. `steps` replaces generate_step's token ids (engine.speculative's rounds).
    """
    stops = set(int(t) for t in stop_token_ids)
    cutter = _StopStrings(config.stop_strings)
    n_prompt = len(prompt_ids)
    t0 = time.perf_counter()
    t_first = None
    prompt_tps = 0.0
    count = 0

    def record(text, token, finish=None):
        now = time.perf_counter()
        gen_tps = (count - 1) / (now - t_first) if t_first is not None and count > 1 and now > t_first else 0.0
        mem = memory_fn() / 1e9 if memory_fn is not None else 0.0
        return Response(text=text, token=token, prompt_tokens=n_prompt, generation_tokens=count,
                        prompt_tps=prompt_tps, generation_tps=gen_tps, memory=mem, finish_reason=finish)

    def tail() -> str:
        return cutter.feed(detokenizer.flush())[0] + cutter.flush() if detokenizer is not None else cutter.flush()

    if steps is None:
        steps = generate_step(engine, prompt_ids, sampler, max_tokens=config.max_tokens, cancel=cancel)
    for tok in steps:
        if t_first is None:
            t_first = time.perf_counter()
            prompt_tps = n_prompt / (t_first - t0) if t_first > t0 else 0.0
        if tok in stops:
            yield record(tail(), tok, "stop")
            return
        count += 1
        piece = detokenizer.add(tok) if detokenizer is not None else ""
        text, hit = cutter.feed(piece)
        if hit:
            yield record(text, tok, "stop")
            return
        if count == config.max_tokens:
            yield record(text + tail(), tok, "length")
            return
        yield record(text, tok)
    if config.max_tokens == 0:
        yield record("", None, "length")
    else:  # the step generator only ends early when cancelled
        yield record(tail(), None, "cancelled")
