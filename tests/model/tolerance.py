"""Named tolerance presets and the composite pass rule of spec/testing.md §5.1."""
from __future__ import annotations

import numpy as np

# name: (atol, rtol, tail_frac, worst_ratio, rel_l2)
PRESETS = {
    "bf16_elementwise": (1e-3, 8e-3, 1e-3, 4, 4e-3),
    "bf16_reduction": (2e-3, 1.6e-2, 2e-3, 5, 8e-3),
    "linear_bf16": (2e-3, 1.6e-2, 2e-3, 5, 8e-3),
    "attention_bf16": (2e-3, 1.6e-2, 2e-3, 5, 8e-3),
    "linear_tc": (2e-3, 1.6e-2, 1.0, 1e30, 4e-3),
    "fp32_transcendental": (1e-6, 1e-5, 1e-4, 2, 1e-5),
    "gdn_control_fp32": (1e-6, 1e-5, 1e-4, 2, 1e-5),
    "gdn_norm_control_fp32": (1e-4, 4e-3, 1.0, 1e30, 2e-3),
    "gdn_output_bf16": (1e-3, 1e-2, 2e-3, 5, 8e-3),
    "gdn_state_fp32": (5e-4, 5e-3, 2e-2, 5, 5e-3),
}


def check(actual, expected, preset: str) -> None:
    """Assert the composite rule: no NaN/Inf; strict allclose, or else tail fraction, worst ratio and rel-L2 all hold."""
    atol, rtol, tail, worst, rl2 = PRESETS[preset]
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.isfinite(a).all(), f"{preset}: non-finite values"
    bound = atol + rtol * np.abs(b)
    err = np.abs(a - b)
    if (err <= bound).all():
        return
    frac = float((err > bound).mean())
    ratio = float((err / bound).max())
    rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    assert frac <= tail and ratio <= worst and rel <= rl2, (
        f"{preset}: violating fraction {frac:.2e} (<= {tail}), worst ratio {ratio:.2f} (<= {worst}), rel-L2 {rel:.2e} (<= {rl2})"
    )
