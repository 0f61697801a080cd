"""Per-sequence caches of the NumPy (and CuPy-array) models.

`Cache` holds one entry per layer: a `KVCache` for attention layers (post-norm, post-RoPE K and raw V)
and a `GDNState` for Gated DeltaNet layers (conv history + fp32 recurrent state), plus the position
(tokens consumed so far). Models read positions from the cache and advance it after each call.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
_GROW = 256  # tokens added per KV growth step when no max_len is given


class KVCache:
    """Append-only K/V store of one attention layer: k, v views are [S, Hkv, D]."""

    def __init__(self, n_kv_heads: int, head_dim: int, max_len: int | None = None, xp=np):
        self.xp = xp
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.length = 0
        cap = max_len or _GROW
        self._k = xp.zeros((cap, n_kv_heads, head_dim), dtype=F32)
        self._v = xp.zeros((cap, n_kv_heads, head_dim), dtype=F32)
        self.max_len = max_len

    def update(self, k, v):
        """Append k, v [T, Hkv, D]; return views of all keys and values so far [S, Hkv, D]."""
        t = k.shape[0]
        need = self.length + t
        if need > self._k.shape[0]:
            if self.max_len is not None:
                raise ValueError(f"KV cache full: {need} > max_len {self.max_len}")
            cap = max(need, 2 * self._k.shape[0])
            self._k = self._grow(self._k, cap)
            self._v = self._grow(self._v, cap)
        self._k[self.length : need] = k
        self._v[self.length : need] = v
        self.length = need
        return self._k[:need], self._v[:need]

    def _grow(self, buf, cap):
        new = self.xp.zeros((cap,) + buf.shape[1:], dtype=F32)
        new[: self.length] = buf[: self.length]
        return new

    def trim(self, length: int) -> None:
        """Forget everything after the first `length` positions."""
        self.length = min(self.length, length)

    def reset(self) -> None:
        self.length = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the keys and values held (not the reserved capacity)."""
        return 2 * self.length * self.n_kv_heads * self.head_dim * 4

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_kv_heads * self.head_dim * 4


class GDNState:
    """State of one Gated DeltaNet layer: conv history [C, K-1] (oldest first) and S [Hv, Dv, Dk] fp32."""

    def __init__(self, channels: int, n_taps: int, n_v_heads: int, d_v: int, d_k: int, xp=np):
        self.xp = xp
        self.conv = xp.zeros((channels, n_taps - 1), dtype=F32)
        self.recurrent = xp.zeros((n_v_heads, d_v, d_k), dtype=F32)

    def reset(self) -> None:
        self.conv[...] = 0
        self.recurrent[...] = 0

    @property
    def nbytes(self) -> int:
        return int(self.conv.nbytes + self.recurrent.nbytes)


class Cache:
    """All layer caches of one sequence plus its position (tokens consumed)."""

    def __init__(self, layers: list):
        self.layers = layers
        self.position = 0

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def can_trim(self) -> bool:
        """Only pure-attention caches can go back in time; GDN state holds every token mixed in."""
        return all(isinstance(c, KVCache) for c in self.layers)

    def trim(self, length: int) -> None:
        """Keep the first `length` positions (attention-only caches)."""
        if not self.can_trim:
            raise ValueError("a cache with GDN state cannot be trimmed")
        for c in self.layers:
            c.trim(length)
        self.position = min(self.position, length)

    def reset(self) -> None:
        """Empty every layer and go back to position 0."""
        for layer in self.layers:
            layer.reset()
        self.position = 0

    @property
    def state_bytes(self) -> int:
        """Fixed-size state (GDN conv + recurrent) in bytes."""
        return sum(c.nbytes for c in self.layers if isinstance(c, GDNState))

    @property
    def kv_bytes(self) -> int:
        return sum(c.nbytes for c in self.layers if isinstance(c, KVCache))

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(c.bytes_per_token for c in self.layers if isinstance(c, KVCache))

    @property
    def nbytes(self) -> int:
        return self.state_bytes + self.kv_bytes
