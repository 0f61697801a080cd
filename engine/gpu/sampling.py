"""Token bursts and streams of the CUDA decode step (`CudaQwen35` takes them as a base): the greedy graph's and the
sampled graphs', whose step ends in a device sampler instead of the argmax (cuda/sample_topk.cu for
1 <= top_k <= TOPK_MAX, penalties included; cuda/sampler.cu: sample_max_mb + sample_step_mb otherwise). Every graph
commits the token the same way (next input, position, history ring, step), so a burst of n steps needs one read of
the history ring at its end, and a stream launches the next step before it reads the last one's token. The methods
use the executor's buffers (`_alloc`, `_alloc_state`), its stream and `_capture`."""
from __future__ import annotations

import numpy as np

from engine.device_sampling import TOPK_MAX  # (cuda/sample_topk.cu)
from engine.gpu import launch as K
TOPK_TILE = 8192  # ids a block of the top-k sampler; it takes rows of up to 32 tiles
STREAM_RING = 4  # pinned token slots of a stream (the steps in flight are at most 2)


def argmax_step(*, logits, ld: int, vocab: int, best_v, best_i, tickets, tokens, pos, history, step, hist_len: int,
                rows: int, blocks: int = 64) -> K.Launch:
    """argmax_step_mb, the greedy step's commit: each of `rows` rows' argmax over logits [rows, ld] (the first `vocab`
    ids; the lowest id of a tie), `blocks` blocks a row (their bests in best_v, best_i [rows, blocks], the last block
    by its ticket in tickets [rows] reduces them and leaves the ticket at zero) written as the next input tokens[r],
    into history[r, step[r] % hist_len]; pos[r] and step[r] advance."""
    return K.prepared("argmax_step_mb", (blocks, rows),
                      (logits, ld, vocab, best_v, best_i, tickets, tokens, pos, history, step, hist_len), block=256)


def sample_max(*, logits, ld: int, domain: int, best_v, best_i, rows: int, blocks: int) -> K.Launch:
    """sample_max_mb: the histogram sampler's first pass, each row's largest logit of the first `domain` ids, `blocks`
    blocks a row (their bests in best_v, best_i [rows, blocks])."""
    return K.prepared("sample_max_mb", (blocks, rows), (logits, ld, domain, best_v, best_i), block=256)


def sample_step(*, logits, ld: int, domain: int, params, best_v, best_i, hist_c, hist_w, cand, cand_n, cand_cap: int,
                tickets, tokens, pos, history, step, hist_len: int, rows: int, blocks: int) -> K.Launch:
    """sample_step_mb: the histogram sampler's draw (params [rows, SAMPLE_PARAMS], engine.device_sampling) from
    sample_max's bests, through the per-block histograms hist_c, hist_w and the candidates cand (cand_cap a row, their
    count cand_n), committed as argmax_step commits; tickets and cand_n left at zero."""
    return K.prepared("sample_step_mb", (blocks, rows),
                      (logits, ld, domain, params, best_v, best_i, hist_c, hist_w, cand, cand_n, cand_cap, tickets,
                       tokens, pos, history, step, hist_len), block=1024)


def sample_topk(*, logits, ld: int, domain: int, params, counts, vocab: int, cand_key, cand_id, tickets, tokens, pos,
                history, step, hist_len: int, allow, allow_on, allow_words: int, rows: int) -> K.Launch:
    """sample_topk_mb: the top-k sampler with penalties (counts [rows, vocab] of generated ids), a block a TOPK_TILE
    of the first `domain` ids (their candidates in cand_key, cand_id [rows, blocks, TOPK_MAX]), under the grammar mask
    allow [rows, allow_words] where allow_on[r]; committed as argmax_step commits."""
    return K.prepared("sample_topk_mb", (-(-domain // TOPK_TILE), rows),
                      (logits, ld, domain, params, counts, vocab, cand_key, cand_id, tickets, tokens, pos, history, step,
                       hist_len, allow, allow_on, allow_words), block=1024)


def column_positions(*, pos, out, tokens: int) -> K.Launch:
    """cols_positions: out[t] = pos[0] + t for the `tokens` columns of a step over lane 0's sequence."""
    return K.prepared("cols_positions", (1,), (pos, out, tokens), block=32)


def advance_positions(*, pos, tokens: int) -> K.Launch:
    """advance_pos: pos[0] += tokens (a step of that many columns; the last argument, so a padded chunk can launch it
    with its valid length)."""
    return K.prepared("advance_pos", (1,), (pos, tokens), block=32)


class StreamState:
    """The steps a stream has launched: `first` was fed to the first one, `out[i]` is step i's token (read or not)."""

    def __init__(self, first: int, base: int = 0):
        self.first, self.launched, self.out = int(first), 0, []
        self.base = base  # the sequence's position before the first step

    def consumed(self) -> list[int]:
        """The ids the launched steps fed into the cache: first, then every token but the last step's."""
        return [self.first] + self.out[: self.launched - 1]


class SamplingOps:
    SAMPLE_BLOCKS = 64  # blocks a row of the histogram sampler

    def _sample_ops(self):
        """The histogram sampler in place of the argmax (parameters in `sp_params`, one row a lane, written by
        `set_sampling`): same commit of token, position, history and step."""
        from engine import device_sampling as ds  # noqa: PLC0415

        cp, M, nb = self.cp, self.M, self.SAMPLE_BLOCKS
        self.sp_params = cp.zeros((M, ds.SAMPLE_PARAMS), dtype=cp.uint64)  # temperature 0 (greedy) until set
        self.sp_v, self.sp_i = cp.zeros((M, nb), dtype=cp.float32), cp.zeros((M, nb), dtype=cp.int32)
        self.sp_hist_c = cp.zeros((M, nb, ds.SAMPLE_Q), dtype=cp.int32)
        self.sp_hist_w = cp.zeros((M, nb, ds.SAMPLE_Q), dtype=cp.float64)
        self.sp_cand = cp.zeros((M, ds.SAMPLE_CAND), dtype=cp.uint64)
        self.sp_cand_n, self.sp_ticket = cp.zeros(M, dtype=cp.uint32), cp.zeros(M, dtype=cp.uint32)
        self._sp_host = None
        D = self._domain()
        return [sample_max(logits=self.logits, ld=self.V, domain=D, best_v=self.sp_v, best_i=self.sp_i, rows=M, blocks=nb),
                sample_step(logits=self.logits, ld=self.V, domain=D, params=self.sp_params, best_v=self.sp_v,
                            best_i=self.sp_i, hist_c=self.sp_hist_c, hist_w=self.sp_hist_w, cand=self.sp_cand,
                            cand_n=self.sp_cand_n, cand_cap=ds.SAMPLE_CAND, tickets=self.sp_ticket, tokens=self.tokens,
                            pos=self.pos, history=self.history, step=self.step, hist_len=self.hist_len, rows=M,
                            blocks=nb)]

    def _topk_ops(self):
        """The top-k sampler with penalties (generated-token counts in `sp_counts`, one row a lane)."""
        cp, M, D = self.cp, self.M, self._domain()
        nb = -(-D // TOPK_TILE)
        self.sp_counts = cp.zeros((M, self.V), dtype=cp.int32)
        self.tk_key = cp.zeros((M, nb, TOPK_MAX), dtype=cp.uint64)
        self.tk_id = cp.zeros((M, nb, TOPK_MAX), dtype=cp.int32)
        self.tk_ticket = cp.zeros(M, dtype=cp.uint32)
        words = -(-self.V // 32)
        self.tk_allow = cp.zeros((M, words), dtype=cp.uint32)  # a grammar's mask (engine.constraints), one row a lane
        self.tk_allow_on = cp.zeros(M, dtype=cp.int32)
        self._allow_on = False
        return [sample_topk(logits=self.logits, ld=self.V, domain=D, params=self.sp_params, counts=self.sp_counts,
                            vocab=self.V, cand_key=self.tk_key, cand_id=self.tk_id, tickets=self.tk_ticket,
                            tokens=self.tokens, pos=self.pos, history=self.history, step=self.step,
                            hist_len=self.hist_len, allow=self.tk_allow, allow_on=self.tk_allow_on, allow_words=words,
                            rows=M)]

    def _domain(self) -> int:
        return int(getattr(self.args, "domain", self.V) or self.V)

    def capture_sampled(self):
        """Capture the sampled steps (the greedy graph's ops with a device sampler as the tail): `graph_sampled`
        (histogram sampler) and `graph_topk`; like capture(), each runs a step and resets, so call this before a
        sequence starts."""
        if self.graph is None:
            self.capture()
        if self.ops[-1] is not self._argmax_op:
            raise RuntimeError("the step does not end in the argmax: no sampled graph for this executor")
        self.ops_sampled = self.ops[:-1] + self._sample_ops()
        self.graph_sampled = self._capture(self.ops_sampled)
        if self._domain() <= 32 * TOPK_TILE:
            self.ops_topk = self.ops[:-1] + self._topk_ops()
            self.graph_topk = self._capture(self.ops_topk)

    def set_sampling(self, params) -> None:
        """Write the sampler's parameter row (engine.device_sampling.pack_params) for every lane, when changed."""
        row = np.asarray(params, dtype=np.uint64).reshape(-1)
        if self._sp_host is None or not np.array_equal(self._sp_host, row):
            self.sp_params.set(np.tile(row, (self.M, 1)), stream=self.stream)
            self._sp_host = row.copy()

    def set_counts(self, counts) -> None:
        """Every lane's generated-token counts (the penalties' input) from a {token: count} mapping."""
        host = np.zeros((self.M, self.V), dtype=np.int32)
        for tok, c in (counts or {}).items():
            if 0 <= int(tok) < self.V:
                host[:, int(tok)] = int(c)
        self.sp_counts.set(host, stream=self.stream)

    def set_allow(self, words) -> None:
        """The grammar mask the top-k sampler applies to the next draws (int32 words, bit i for id i), or None."""
        on = words is not None
        if on:
            row = np.zeros(self.tk_allow.shape[1], np.uint32)
            w = np.asarray(words).view(np.uint32)
            row[: w.size] = w
            self.tk_allow[0].set(row, stream=self.stream)
        if on != self._allow_on:
            self.tk_allow_on.set(np.full(self.M, int(on), np.int32), stream=self.stream)
            self._allow_on = on

    def masked_tokens(self, graph, state: StreamState, n: int, next_mask):
        """Yield the tokens of up to n replays of the top-k `graph`, each drawn under the mask `next_mask()` returns
        for it (computed on the host from the tokens so far, so each step waits for the one before; None: stop)."""
        cp = self.cp
        self._pinned_ring()
        self.set_token(state.first)
        src = self.tokens.data.ptr
        try:
            for _ in range(n):
                words = next_mask()
                if words is None:
                    break
                self.set_allow(words)
                graph.launch(self.stream)
                cp.cuda.runtime.memcpyAsync(self._ring.ctypes.data, src, 4, cp.cuda.runtime.memcpyDeviceToHost,
                                            self.stream.ptr)
                self._ring_ev[0].record(self.stream)
                state.launched += 1
                self._ring_ev[0].synchronize()
                state.out.append(int(self._ring[0]))
                yield state.out[-1]
        finally:
            self.set_allow(None)

    def _pinned_ring(self):
        cp = self.cp
        if getattr(self, "_ring", None) is None:
            self._ring_mem = cp.cuda.alloc_pinned_memory(4 * STREAM_RING)
            self._ring = np.frombuffer(self._ring_mem, dtype=np.int32, count=STREAM_RING)
            self._ring_ev = [cp.cuda.Event(block=False, disable_timing=True) for _ in range(STREAM_RING)]

    def sampled_graph(self, params):
        """The graph that draws what `params` asks for: the argmax for greedy, the top-k sampler where it applies."""
        from engine import device_sampling as ds  # noqa: PLC0415

        settings = ds.unpack_params(params)
        if not settings["temperature"] > 0.0:
            return self.graph
        if 0 < settings["top_k"] <= TOPK_MAX and getattr(self, "graph_topk", None) is not None:
            return self.graph_topk
        return self.graph_sampled

    def decode_sampled(self, first_token: int, n: int, params, counts=None) -> list[int]:
        """n tokens drawn on the device after `first_token`, each fed back by the graph itself."""
        graph = self.prepare_draws(params, counts)
        return self._burst(graph, first_token, n)

    def prepare_draws(self, params, counts=None):
        """Write the sampler's parameters (and counts) and return the graph to replay."""
        graph = self.sampled_graph(params)
        if getattr(self, "graph_topk", None) is not None:
            self.set_allow(None)
        if graph is not self.graph:
            self.set_sampling(params)
            if graph is getattr(self, "graph_topk", None):
                self.set_counts(counts)
        return graph

    def stream_tokens(self, graph, state: StreamState, n: int):
        """Yield the tokens of n replays of `graph` after `state.first`, one at a time, keeping the device a step
        ahead: step i + 1 is launched before step i's token is read (its input is already on the device), and each
        token comes back through a pinned slot and an event. Stops launching at n; `finish_stream` settles the rest
        when the consumer stops early (at most one step past the last token read)."""
        cp = self.cp
        self._pinned_ring()
        self.set_token(state.first)
        src = self.tokens.data.ptr
        d2h = cp.cuda.runtime.memcpyDeviceToHost

        def launch():
            slot = state.launched % STREAM_RING
            graph.launch(self.stream)
            cp.cuda.runtime.memcpyAsync(self._ring.ctypes.data + 4 * slot, src, 4, d2h, self.stream.ptr)
            self._ring_ev[slot].record(self.stream)
            state.launched += 1

        read = 0
        if n > 0:
            launch()
        while read < n:
            if state.launched < n:
                launch()
            slot = read % STREAM_RING
            self._ring_ev[slot].synchronize()
            state.out.append(int(self._ring[slot]))
            read += 1
            yield state.out[-1]

    def finish_stream(self, state: StreamState) -> None:
        """Wait for a stream's launched steps and collect the tokens nobody read."""
        self.stream.synchronize()
        while len(state.out) < state.launched:
            state.out.append(int(self._ring[len(state.out) % STREAM_RING]))

    def _burst(self, graph, first_token: int, n: int) -> list[int]:
        """n replays of `graph` after `first_token` (each step's token is the next one's input, on the
        device); the tokens read back from lane 0's history ring once a burst of at most hist_len steps,
        only the slots that burst wrote (one step: its token, the next input)."""
        self.set_token(int(first_token))
        if n == 1:  # (streaming: the step's token is also the next input, one read)
            graph.launch(self.stream)
            self.stream.synchronize()
            return [int(self.tokens[0].get())]
        s0 = int(self.step[0].get())
        out: list[int] = []
        while n > 0:
            b = min(n, self.hist_len)
            for _ in range(b):
                graph.launch(self.stream)
            self.stream.synchronize()
            i0 = s0 % self.hist_len
            i1 = min(i0 + b, self.hist_len)
            out += self.history[0, i0:i1].get().tolist()
            if i0 + b > i1:  # the ring wrapped
                out += self.history[0, : i0 + b - i1].get().tolist()
            s0 += b
            n -= b
        return out
