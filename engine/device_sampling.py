"""Host side of the device sampler (cuda/sampler.cu: sample_max_mb + sample_step_mb): the parameter row the
kernel reads, and which samplers it can stand in for.

The kernels reproduce `engine.sampling.Sampler` (temperature, top-k, top-p, min-p, the counter RNG keyed by
seed and position) token for token. Presence and frequency penalties run on the device where the top-k sampler
applies (1 <= top_k <= TOPK_MAX, cuda/sample_topk.cu: it keeps the generated-token counts on the device); with
top_k off they, a logit bias and grammar masks stay on the host. The parameters live in a small device buffer,
so a captured graph serves every request: the host writes the row before a burst.
"""
from __future__ import annotations

import numpy as np

from engine.sampling import PURPOSE_DECODE

# Constants shared with cuda/sampler.cu (tests/test_device_sampling_host.py checks they agree)
SAMPLE_R = 16  # buckets per temperature
SAMPLE_Q = 30 * SAMPLE_R + 1  # buckets over the 30-temperature margin
SAMPLE_QTOP = 4 * SAMPLE_R  # buckets whose ids go to the candidate list
SAMPLE_PARAMS = 8  # u64 a row: temperature, top_p, min_p (double bits), top_k, seed, purpose, presence, frequency
TOPK_MAX = 64  # the largest top_k the top-k sampler takes (cuda/sample_topk.cu)
SAMPLE_CAND = 8192  # candidate list entries a row (more: the last block rescans the row instead)
_M64 = (1 << 64) - 1


def pack_params(sampler_or_none=None, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                min_p: float = 0.0, seed: int = 0, purpose: int = PURPOSE_DECODE, presence: float = 0.0,
                frequency: float = 0.0) -> np.ndarray:
    """The u64 row [SAMPLE_PARAMS] the device samplers read, from a Sampler (its temperature, top_k after any
    top_k_cap, top_p, min_p, seed, penalties) or from keywords. temperature <= 0 is greedy."""
    s = sampler_or_none
    if s is not None:
        temperature, top_k, top_p, min_p, seed = s.temperature, s.top_k, s.top_p, s.min_p, s.seed
        presence, frequency = s.presence, s.frequency
    row = np.zeros(SAMPLE_PARAMS, np.uint64)
    row[:3] = np.array([temperature, top_p, min_p], np.float64).view(np.uint64)
    row[3] = np.int64(int(top_k)).view(np.uint64)
    row[4] = np.uint64(int(seed) & _M64)
    row[5] = np.uint64(int(purpose))
    row[6:8] = np.array([presence, frequency], np.float64).view(np.uint64)
    return row


def unpack_params(row) -> dict:
    """The inverse of pack_params (for tests and diagnostics)."""
    row = np.asarray(row, np.uint64)
    t, p, mp = row[:3].view(np.float64).tolist()
    pres, freq = row[6:8].view(np.float64).tolist()
    return dict(temperature=t, top_p=p, min_p=mp, top_k=int(row[3:4].view(np.int64)[0]), seed=int(row[4]),
                purpose=int(row[5]), presence=pres, frequency=freq)


def masked_params(sampler) -> np.ndarray | None:
    """The packed row the top-k sampler draws with under a grammar mask (cuda/sample_topk.cu's allow bits): greedy
    as top_k 1, or the sampler's own settings when its top_k is one the top-k sampler takes; None otherwise (the
    host then draws from the full logits)."""
    if sampler.is_greedy:
        return pack_params(temperature=1.0, top_k=1, seed=sampler.seed)
    if 0 < sampler.top_k <= TOPK_MAX and not getattr(sampler, "logit_bias", None):
        return pack_params(sampler)
    return None


def device_params(sampler) -> np.ndarray | None:
    """The packed row when a device sampler draws exactly what `sampler` would, else None (a logit bias or a
    grammar, and penalties without a top_k the top-k sampler takes: those need the host)."""
    if any(getattr(sampler, name, None) for name in ("logit_bias", "grammar", "constraint", "processors")):
        return None
    if not sampler.is_greedy and (sampler.presence or sampler.frequency) and not 0 < sampler.top_k <= TOPK_MAX:
        return None
    return pack_params(sampler)
