"""Array backend: NumPy everywhere, CuPy where a CUDA GPU is usable.

This is the only engine module that may import cupy at module level (lazily, through
`cupy_or_none`). The choice is made once per process and cached.
"""
from __future__ import annotations

import functools
import os


@functools.cache
def cupy_or_none():
    """Return the cupy module when CuPy imports and sees at least one GPU, else None."""
    if os.environ.get("NINFER_DEVICE", "").lower() == "cpu":
        return None
    try:
        import cupy  # noqa: PLC0415

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return cupy
    except Exception:  # ImportError, CUDARuntimeError (no driver), ...
        return None


def gpu_available() -> bool:
    return cupy_or_none() is not None


def resolve_device(device: str = "auto") -> str:
    """Map 'auto' | 'cpu' | 'gpu' | 'cuda' to 'cpu' or 'gpu'; raise when a GPU is asked for and absent."""
    d = (device or "auto").lower()
    if d in ("gpu", "cuda"):
        if not gpu_available():
            raise RuntimeError("no usable CUDA GPU (CuPy missing or no device): use --device cpu")
        return "gpu"
    if d == "cpu":
        return "cpu"
    if d == "auto":
        return "gpu" if gpu_available() else "cpu"
    raise ValueError(f"unknown device {device!r}: use auto, cpu or gpu")


def xp_for(device: str):
    """The array module for a resolved device name."""
    if device == "gpu":
        return cupy_or_none()
    import numpy  # noqa: PLC0415

    return numpy
