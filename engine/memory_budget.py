"""The device side of the memory plan: how many bytes a launch may plan with (free memory, or what a
`--vram-limit` card would leave), capping CuPy's pool to such a limit, and building an engine down a
ladder of contexts when the GPU refuses an allocation. The arithmetic is `engine.gpu.memory`'s."""
from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import NinferError
from engine.gpu.memory import CONTEXT_ESTIMATE, GIB, KIB, MIB, gib

@dataclass(frozen=True)
class Budget:
    """Device bytes free for this launch, and where the figure came from."""

    free: int
    total: int | None
    source: str


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "t": 1000**4, "tb": 1000**4, "ki": KIB, "kib": KIB, "mi": MIB, "mib": MIB, "gi": GIB, "gib": GIB,
          "ti": 1024**4, "tib": 1024**4}


def parse_size(text: str) -> int:
    """'24GiB', '24gib', '24G', '23.5 GB', '1000000' -> bytes (GiB/MiB binary, GB/MB/G decimal)."""
    m = _SIZE.match(str(text))
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise NinferError(f"{text!r} is not a size", "write it like 24GiB, 24000MB or 22.5GiB")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise NinferError(f"size {text!r} must be positive", "write it like 24GiB")
    return n


def device_memory() -> tuple[int, int, int] | None:
    """(free, total, in use by this process's CuPy pool) bytes of the current device; None without a GPU.

    Blocks the pool caches but does not use count as free: it hands them back when it needs room."""
    from engine.backend import cupy_or_none  # noqa: PLC0415

    cp = cupy_or_none()
    if cp is None:
        return None
    try:
        free, total = cp.cuda.runtime.memGetInfo()
        pool = cp.get_default_memory_pool()
        held, cached = pool.used_bytes(), pool.free_bytes()
    except Exception:  # noqa: BLE001 - a broken driver reads as "no device", the caller says so
        return None
    return int(free + cached), int(total), int(held)


def budget(vram_limit: int | None = None, memory: tuple | None | str = "probe") -> Budget | None:
    """Free bytes for planning: the device's free memory or, with `vram_limit`, what a card of that
    size would leave: limit minus an estimated CUDA context minus what this process already holds,
    never more than is really free. Other programs on a larger card do not count against the limit
    (they would not be on the smaller one) but do bound the real free memory.

    `memory` is (free, total[, held]) bytes, None for no device, or "probe" to ask CuPy.
    """
    mem = device_memory() if memory == "probe" else memory
    if mem is None:
        if vram_limit is None:
            return None
        return Budget(max(vram_limit - CONTEXT_ESTIMATE, 0), vram_limit,
                      f"--vram-limit {gib(vram_limit)} minus an estimated {gib(CONTEXT_ESTIMATE)} CUDA context "
                      "(no GPU here to measure)")
    free, total = mem[0], mem[1]
    held = mem[2] if len(mem) > 2 else 0
    if vram_limit is None:
        return Budget(free, total, f"{gib(free)} free of {gib(total)} on the GPU")
    limited = vram_limit - CONTEXT_ESTIMATE - held
    source = f"--vram-limit {gib(vram_limit)} minus an estimated {gib(CONTEXT_ESTIMATE)} CUDA context"
    if held:
        source += f" and {gib(held)} this process holds"
    if free < limited:
        source += f"; only {gib(free)} is free on the GPU"
    return Budget(max(min(free, limited), 0), vram_limit, source)


def build_with_ladder(build, contexts: list[int], on_step=None):
    """Call `build(context)` for each context in turn until one is not refused for memory; return
    (engine, context). `on_step(context, next_context, error)` is told of each step down."""
    last = None
    for i, ctx in enumerate(contexts):
        try:
            return build(ctx), ctx
        except Exception as e:  # noqa: BLE001 - only out-of-memory steps down
            if not (type(e).__name__ == "OutOfMemoryError" or isinstance(e, MemoryError)):
                raise
            last = e
            _release_pool()
            if on_step is not None and i + 1 < len(contexts):
                on_step(ctx, contexts[i + 1], e)
    raise NinferError(f"the GPU refused every context down to {contexts[-1]:,} tokens: {last}",
                      "close other programs using the GPU, or pick a smaller model")


def _release_pool() -> None:
    import gc  # noqa: PLC0415

    gc.collect()
    from engine.backend import cupy_or_none  # noqa: PLC0415

    cp = cupy_or_none()
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()



def apply_vram_limit(vram_limit: int | None) -> int | None:
    """Cap this process's CuPy pool so allocations beyond a `vram_limit` card fail as they would there
    (limit minus the estimated CUDA context). Returns the cap in bytes, or None without a GPU or limit."""
    if vram_limit is None:
        return None
    from engine.backend import cupy_or_none  # noqa: PLC0415

    cp = cupy_or_none()
    if cp is None:
        return None
    cap = max(vram_limit - CONTEXT_ESTIMATE, 0)
    cp.get_default_memory_pool().set_limit(size=cap)
    return cap
