"""ninfer engine: load a `.ninfer` artifact and generate, on NumPy or CuPy.

Public API (stable): `load(path, device="auto") -> Engine`, `Engine.logits(token_ids)`,
`Engine.stream(...)`, `GenerationConfig`, `Response`. Importing this package imports neither
cupy nor any CLI/TUI/server library.
"""
from __future__ import annotations

__all__ = ["load", "Engine", "GenerationConfig", "Response"]


def __getattr__(name):
    if name in __all__:
        from engine import api  # noqa: PLC0415

        return getattr(api, name)
    raise AttributeError(name)
