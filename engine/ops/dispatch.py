"""Which compute path runs, decided once per process and printed by `ninfer env`.

* cuda-graph: CuPy and a GPU are present; dense Qwen3.5 models decode through the CUDA kernels of
  `cuda/` captured into one graph per step (other models run the reference ops on CuPy arrays).
* numpy-reference: no usable GPU; every model runs `engine.ops.ref` on NumPy.
"""
from __future__ import annotations

import functools

from engine.backend import cupy_or_none


@functools.cache
def describe() -> dict:
    """The active path, with the reason and (on a GPU) whether the kernel module compiles."""
    cp = cupy_or_none()
    if cp is None:
        return {"path": "numpy-reference", "reason": "no CuPy or no CUDA device"}
    out = {"path": "cuda-graph", "reason": "CuPy sees a CUDA device",
           "models": "dense Qwen3.5/3.6/3.8 (MoE and Llama: reference ops on CuPy)"}
    try:
        from engine.ops import kernels  # noqa: PLC0415

        kernels.kernel("argmax_step")
        out["kernels"] = "compiled"
    except Exception as e:  # a broken toolchain must not break `ninfer env`
        out["kernels"] = f"failed to compile: {str(e).splitlines()[0][:200]}"
    return out
