"""Speculative rounds against plain decode on the NumPy engine (CPU): the mechanics, not a target.

Random weights accept (almost) no MTP draft, so the oracle rows replace the drafts by the target's own greedy
continuation (computed first by plain decode): every draft is accepted and a round yields K+1 tokens. With
`mtp` the MTP head still drafts each round (its cost stays in the round); without it the oracle alone drafts.

    OPENBLAS_NUM_THREADS=1 python bench/spec_cpu.py --k 3 --tokens 64   (one BLAS thread: steadier on a shared CPU)
"""
from __future__ import annotations

import argparse
import time

from engine.api import Engine
from engine.config import ModelArgs
from engine.models.qwen3_5 import Model, random_weights
from engine.sampling import Sampler
from engine.speculative import SpecStats, speculative_generate_step

GEOMETRIES = {
    # hidden, layers (3 GDN : 1 attention), vocab, FFN; heads sized like the real models' (GDN 128, attention 256)
    "small": dict(hidden_size=512, num_hidden_layers=4, vocab_size=4096, intermediate_size=1536),
    "medium": dict(hidden_size=1024, num_hidden_layers=8, vocab_size=16384, intermediate_size=3072),
}


def build(geometry: str) -> Model:
    g = GEOMETRIES[geometry]
    cfg = dict(model_type="qwen3_5_text", **g, num_attention_heads=4, num_key_value_heads=2, head_dim=256,
               linear_num_key_heads=2, linear_key_head_dim=128, linear_num_value_heads=4, linear_value_head_dim=128,
               full_attention_interval=4, rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25},
               mtp_num_hidden_layers=1, max_position_embeddings=8192)
    args = ModelArgs.from_config(cfg)
    return Model(args).load(random_weights(args, seed=0))


def run(model, prompt, n, k=None, draft=None, mtp=None):
    """(tokens, seconds after the first token, SpecStats or None)."""
    eng = Engine(model, {}, device="cpu")
    sampler = Sampler(temperature=0.0)
    stats = SpecStats(k) if k else None
    if k:
        steps = speculative_generate_step(eng, prompt, sampler, k=k, max_tokens=n, draft=draft, mtp=mtp, stats=stats)
    else:
        from engine.generate import generate_step  # noqa: PLC0415

        steps = generate_step(eng, prompt, sampler, max_tokens=n)
    out = [next(steps)]  # the prompt's token: prefill is not what is measured
    t0 = time.perf_counter()
    out += list(steps)
    return out, time.perf_counter() - t0, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--geometry", choices=sorted(GEOMETRIES), default="small")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    model = build(a.geometry)
    prompt = list(range(1, 17))
    long, _, _ = run(model, prompt, a.tokens + a.k + 1)  # also warms up
    ref, t_plain, _ = run(model, prompt, a.tokens)

    def oracle(tokens, k):
        j = len(tokens) - len(prompt)
        return long[j : j + k]

    steps = a.tokens - 1
    rows = [("plain decode", steps, 1.0, t_plain)]
    for label, draft, mtp in (("mtp (random head)", None, None), ("oracle + mtp", oracle, True),
                              ("oracle, no mtp", oracle, False)):
        got, t, st = run(model, prompt, a.tokens, a.k, draft, mtp)
        assert got == ref, label  # greedy speculation is plain decode, token for token
        rows.append((label, st.rounds, st.tokens_per_round, t))
    print(f"geometry {a.geometry} ({model.weight_bytes / 1e6:.0f} MB float32), K={a.k}, {steps} tokens after the first")
    print(f"{'':20} {'rounds':>7} {'tok/round':>9} {'ms/round':>9} {'tok/s':>8} {'vs plain':>8}")
    for label, rounds, tpr, t in rows:
        print(f"{label:20} {rounds:7d} {tpr:9.2f} {1e3 * t / rounds:9.2f} {steps / t:8.1f} {t_plain / t:7.2f}x")


if __name__ == "__main__":
    main()
