"""ReplaySSM (spec/runtime.md §3.5): verify T columns without writing the GDN state, then fold the accepted ones.

A speculative round runs the target over T = K+1 columns. Snapshotting the recurrent state after every column
would cost T state copies per GDN layer; instead the verify pass reads the committed state, computes its
outputs, and keeps per column what a replay needs: the conv input (the column that would join the conv
history), the post-conv key before its L2 norm, the value, g and beta. Once the round's accepted length m is
known, one fold re-applies the delta rule to the first m columns in place and shifts them into the conv history;
attention layers keep the KV of all T columns in their buffers and simply take the first m as committed.
"""
from __future__ import annotations

import numpy as np

from engine.cache import Cache, GDNState, KVCache
from engine.ops import ref


class GDNRecord:
    """Stands in for a GDNState during verification: `conv`/`recurrent` are the committed arrays (read only);
    GatedDeltaNet calls `record(...)` instead of writing them.

    Records per column t: conv_in [T, C] (pre-conv in-projection), key [T, Hk, Dk] (post-conv, before the L2
    norm), value [T, Hv, Dv], g and beta [T, Hv].
    """

    def __init__(self, state: GDNState):
        self.state = state
        self.conv, self.recurrent = state.conv, state.recurrent
        self.conv_in = self.key = self.value = self.g = self.beta = None

    def record(self, conv_in, key, value, g, beta) -> None:
        self.conv_in, self.key, self.value, self.g, self.beta = conv_in, key, value, g, beta

    def fold(self, m: int) -> None:
        """Replay the first m recorded columns into the committed state, in place (m = 0: nothing)."""
        if m <= 0:
            return
        st = self.state
        k = ref.l2norm(self.key[:m])
        # q only shapes the discarded outputs: the state trajectory is gdn_recurrent's, as in m decode steps
        _, s1 = ref.gdn_recurrent(k, k, self.value[:m], self.g[:m], self.beta[:m], st.recurrent)
        st.recurrent[...] = s1
        xp = st.xp
        history = xp.concatenate([st.conv, xp.asarray(self.conv_in[:m], dtype=np.float32).T], axis=1)
        st.conv[...] = history[:, history.shape[1] - st.conv.shape[1] :]


class Verification:
    """One verify pass over `ids` at positions p..p+T-1; `commit(m)` keeps the first m columns.

    Until `commit`, the cache reads as it did before the pass (position p, KV lengths p, GDN state untouched):
    a round its consumer abandons leaves a consistent sequence behind.
    """

    def __init__(self, model, ids, cache: Cache):
        self.cache, self.start, self.width = cache, int(cache.position), len(ids)
        self.records = {i: GDNRecord(c) for i, c in enumerate(cache.layers) if isinstance(c, GDNState)}
        view = Cache([self.records.get(i, c) for i, c in enumerate(cache.layers)])
        view.position = self.start
        self.logits, self.hidden = model.forward(np.asarray(ids, dtype=np.int64), view)
        self._kv = [c for c in cache.layers if isinstance(c, KVCache)]
        for kv in self._kv:  # the T columns stay in the buffers past `length`, to be taken by commit
            kv.trim(self.start)
        self.committed = None

    @property
    def current(self) -> bool:
        """Whether the cache is still where this pass left it (nothing else has fed it since)."""
        return self.committed is None and self.cache.position == self.start and all(
            kv.length == self.start for kv in self._kv)

    def commit(self, m: int) -> bool:
        """Make the first m columns part of the sequence: KV lengths and position p+m, GDN state folded.
        Returns False (and changes nothing) when the cache moved on since the pass."""
        if not 0 <= m <= self.width:
            raise ValueError(f"commit of {m} columns out of {self.width}")
        if not self.current:
            return False
        for kv in self._kv:
            kv.length = self.start + m
        for rec in self.records.values():
            rec.fold(m)
        self.cache.position = self.start + m
        self.committed = m
        return True
