"""Which compute path runs, decided once per process and printed by `ninfer env`.

* cuda-graph: CuPy and a GPU are present; Qwen3.5 models decode through the CUDA kernels of `cuda/`
  captured into one graph per step (Llama runs the reference ops on CuPy arrays).
* numpy-reference: no usable GPU; every model runs `engine.ops.ref` on NumPy.
"""
from __future__ import annotations

import functools

from engine.backend import cupy_or_none


@functools.cache
def describe(compile_kernels: bool = False) -> dict:
    """The active path and the reason. The kernel module compiles on the first model load (NVRTC, some
    seconds; CuPy caches the binary on disk); `compile_kernels=True` compiles it here to check the toolchain."""
    cp = cupy_or_none()
    if cp is None:
        return {"path": "numpy-reference", "reason": "no CuPy or no CUDA device"}
    out = {"path": "cuda-graph", "reason": "CuPy sees a CUDA device",
           "models": "dense and MoE Qwen3.5/3.6/3.8 (Llama: reference ops on CuPy)"}
    if not compile_kernels:
        out["kernels"] = "compiled at the first model load"
        return out
    try:
        from engine.gpu import launch as kernels  # noqa: PLC0415

        kernels.kernel("argmax_step")
        out["kernels"] = "compiled"
    except Exception as e:  # a broken toolchain must not break `ninfer env`
        out["kernels"] = f"failed to compile: {str(e).splitlines()[0][:200]}"
    return out
