"""The draws of the CUDA decode step (`Sampler`, held by `CudaQwen35`), and its token bursts and streams: the greedy
graph's and the sampled graphs', whose step ends in a device sampler instead of the argmax (cuda/sample_topk.cu for
1 <= top_k <= TOPK_MAX, penalties included; cuda/sampler.cu: sample_max_mb + sample_step_mb otherwise). Every graph
commits the token the same way (next input, position, history ring, step), so a burst of n steps needs one read of
the history ring at its end, and a stream launches the next step before it reads the last one's token. The sampler
holds the samplers' parameters and scratch and uses the step's shared state (engine.gpu.step: logits, the next input
tokens, positions, history ring, step counter, stream)."""
from __future__ import annotations

import numpy as np

from engine.device_sampling import TOPK_MAX  # (cuda/sample_topk.cu)
from engine.gpu import launch as K
TOPK_TILE = 8192  # ids a block of the top-k sampler; it takes rows of up to 32 tiles
STREAM_RING = 4  # pinned token slots of a stream (the steps in flight are at most 2)
ARGMAX_BLOCKS = 64  # blocks a row of the greedy argmax over the vocabulary


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


class Sampler:
    """The step's tails that pick the next token over the shared state of `c` (a StepContext): the greedy argmax and
    the device samplers (their parameters and scratch held here), and the host loops that replay one of the graphs
    ending in them (bursts, streams, masked draws)."""

    SAMPLE_BLOCKS = 64  # blocks a row of the histogram sampler

    def __init__(self, c, commit=None):
        """commit: (tokens, pos, history, step, hist_len) the draws go into in place of the context's sequence (the
        verified columns' picks: their own positions and rings)."""
        cp, M = c.cp, c.M
        self.c = c
        self.commit = commit or (c.tokens, c.pos, c.history, c.step, c.hist_len)
        # argmax_step_mb's per-block bests and per-row tickets (zero between launches)
        self.am_v = cp.zeros((M, ARGMAX_BLOCKS), dtype=cp.float32)
        self.am_i = cp.zeros((M, ARGMAX_BLOCKS), dtype=cp.int32)
        self.am_ticket = cp.zeros(M, dtype=cp.uint32)
        self.sp_params = self.sp_counts = self.tk_allow = None
        self._sp_host, self._allow_on, self._ring = None, False, None

    def argmax_op(self) -> K.Launch:
        """Device argmax as the step's commit: the next input token, the position and the history advance."""
        c = self.c
        tokens, pos, history, step, hist_len = self.commit
        return argmax_step(logits=c.logits, ld=c.V, vocab=c.V, best_v=self.am_v, best_i=self.am_i,
                           tickets=self.am_ticket, tokens=tokens, pos=pos, history=history, step=step,
                           hist_len=hist_len, rows=c.M, blocks=ARGMAX_BLOCKS)

    def sample_ops(self):
        """The histogram sampler in place of the argmax (parameters in `sp_params`, one row a lane, written by
        `set_sampling`): same commit of token, position, history and step."""
        from engine import device_sampling as ds  # noqa: PLC0415

        c = self.c
        cp, M, nb = c.cp, c.M, self.SAMPLE_BLOCKS
        self.sp_params = cp.zeros((M, ds.SAMPLE_PARAMS), dtype=cp.uint64)  # temperature 0 (greedy) until set
        self.sp_v, self.sp_i = cp.zeros((M, nb), dtype=cp.float32), cp.zeros((M, nb), dtype=cp.int32)
        self.sp_hist_c = cp.zeros((M, nb, ds.SAMPLE_Q), dtype=cp.int32)
        self.sp_hist_w = cp.zeros((M, nb, ds.SAMPLE_Q), dtype=cp.float64)
        self.sp_cand = cp.zeros((M, ds.SAMPLE_CAND), dtype=cp.uint64)
        self.sp_cand_n, self.sp_ticket = cp.zeros(M, dtype=cp.uint32), cp.zeros(M, dtype=cp.uint32)
        self._sp_host = None
        D = self.domain()
        tokens, pos, history, step, hist_len = self.commit
        return [sample_max(logits=c.logits, ld=c.V, domain=D, best_v=self.sp_v, best_i=self.sp_i, rows=M, blocks=nb),
                sample_step(logits=c.logits, ld=c.V, domain=D, params=self.sp_params, best_v=self.sp_v,
                            best_i=self.sp_i, hist_c=self.sp_hist_c, hist_w=self.sp_hist_w, cand=self.sp_cand,
                            cand_n=self.sp_cand_n, cand_cap=ds.SAMPLE_CAND, tickets=self.sp_ticket, tokens=tokens,
                            pos=pos, history=history, step=step, hist_len=hist_len, rows=M, blocks=nb)]

    def topk_ops(self):
        """The top-k sampler with penalties (generated-token counts in `sp_counts`, one row a lane)."""
        c = self.c
        cp, M, D = c.cp, c.M, self.domain()
        nb = -(-D // TOPK_TILE)
        self.sp_counts = cp.zeros((M, c.V), dtype=cp.int32)
        self.tk_key = cp.zeros((M, nb, TOPK_MAX), dtype=cp.uint64)
        self.tk_id = cp.zeros((M, nb, TOPK_MAX), dtype=cp.int32)
        self.tk_ticket = cp.zeros(M, dtype=cp.uint32)
        words = -(-c.V // 32)
        self.tk_allow = cp.zeros((M, words), dtype=cp.uint32)  # a grammar's mask (engine.constraints), one row a lane
        self.tk_allow_on = cp.zeros(M, dtype=cp.int32)
        self._allow_on = False
        tokens, pos, history, step, hist_len = self.commit
        return [sample_topk(logits=c.logits, ld=c.V, domain=D, params=self.sp_params, counts=self.sp_counts,
                            vocab=c.V, cand_key=self.tk_key, cand_id=self.tk_id, tickets=self.tk_ticket,
                            tokens=tokens, pos=pos, history=history, step=step, hist_len=hist_len,
                            allow=self.tk_allow, allow_on=self.tk_allow_on, allow_words=words, rows=M)]

    def domain(self) -> int:
        """The ids a sampler draws from (the model's text vocabulary; the logits row may be wider)."""
        V = self.c.V
        return int(getattr(self.c.args, "domain", V) or V)

    def set_sampling(self, params) -> None:
        """Write the sampler's parameter row (engine.device_sampling.pack_params) for every lane, when changed."""
        row = np.asarray(params, dtype=np.uint64).reshape(-1)
        if self._sp_host is None or not np.array_equal(self._sp_host, row):
            self.sp_params.set(np.tile(row, (self.c.M, 1)), stream=self.c.stream)
            self._sp_host = row.copy()

    def set_counts(self, counts) -> None:
        """Every lane's generated-token counts (the penalties' input) from a {token: count} mapping."""
        c = self.c
        host = np.zeros((c.M, c.V), dtype=np.int32)
        for tok, n in (counts or {}).items():
            if 0 <= int(tok) < c.V:
                host[:, int(tok)] = int(n)
        self.sp_counts.set(host, stream=c.stream)

    def set_allow(self, words) -> None:
        """The grammar mask the top-k sampler applies to the next draws (int32 words, bit i for id i), or None."""
        on = words is not None
        if on:
            row = np.zeros(self.tk_allow.shape[1], np.uint32)
            w = np.asarray(words).view(np.uint32)
            row[: w.size] = w
            self.tk_allow[0].set(row, stream=self.c.stream)
        if on != self._allow_on:
            self.tk_allow_on.set(np.full(self.c.M, int(on), np.int32), stream=self.c.stream)
            self._allow_on = on

    def _feed(self, token: int) -> None:
        """Every lane's next input token (the first of a burst or stream), on the step's stream."""
        self.c.tokens.set(np.full(self.c.M, int(token), dtype=np.int32), stream=self.c.stream)

    def masked_tokens(self, graph, state: StreamState, n: int, next_mask):
        """Yield the tokens of up to n replays of the top-k `graph`, each drawn under the mask `next_mask()` returns
        for it (computed on the host from the tokens so far, so each step waits for the one before; None: stop)."""
        c = self.c
        cp, stream = c.cp, c.stream
        self._pinned_ring()
        self._feed(state.first)
        src = c.tokens.data.ptr
        try:
            for _ in range(n):
                words = next_mask()
                if words is None:
                    break
                self.set_allow(words)
                graph.launch(stream)
                cp.cuda.runtime.memcpyAsync(self._ring.ctypes.data, src, 4, cp.cuda.runtime.memcpyDeviceToHost,
                                            stream.ptr)
                self._ring_ev[0].record(stream)
                state.launched += 1
                self._ring_ev[0].synchronize()
                state.out.append(int(self._ring[0]))
                yield state.out[-1]
        finally:
            self.set_allow(None)

    def _pinned_ring(self):
        cp = self.c.cp
        if self._ring is None:
            self._ring_mem = cp.cuda.alloc_pinned_memory(4 * STREAM_RING)
            self._ring = np.frombuffer(self._ring_mem, dtype=np.int32, count=STREAM_RING)
            self._ring_ev = [cp.cuda.Event(block=False, disable_timing=True) for _ in range(STREAM_RING)]

    def stream_tokens(self, graph, state: StreamState, n: int):
        """Yield the tokens of n replays of `graph` after `state.first`, one at a time, keeping the device a step
        ahead: step i + 1 is launched before step i's token is read (its input is already on the device), and each
        token comes back through a pinned slot and an event. Stops launching at n; `finish_stream` settles the rest
        when the consumer stops early (at most one step past the last token read)."""
        c = self.c
        cp, stream = c.cp, c.stream
        self._pinned_ring()
        self._feed(state.first)
        src = c.tokens.data.ptr
        d2h = cp.cuda.runtime.memcpyDeviceToHost

        def launch():
            slot = state.launched % STREAM_RING
            graph.launch(stream)
            cp.cuda.runtime.memcpyAsync(self._ring.ctypes.data + 4 * slot, src, 4, d2h, stream.ptr)
            self._ring_ev[slot].record(stream)
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
        self.c.stream.synchronize()
        while len(state.out) < state.launched:
            state.out.append(int(self._ring[len(state.out) % STREAM_RING]))

    def burst(self, graph, first_token: int, n: int) -> list[int]:
        """n replays of `graph` after `first_token` (each step's token is the next one's input, on the
        device); the tokens read back from lane 0's history ring once a burst of at most hist_len steps,
        only the slots that burst wrote (one step: its token, the next input)."""
        c = self.c
        stream, hist_len = c.stream, c.hist_len
        self._feed(first_token)
        if n == 1:  # (streaming: the step's token is also the next input, one read)
            graph.launch(stream)
            stream.synchronize()
            return [int(c.tokens[0].get())]
        s0 = int(c.step[0].get())
        out: list[int] = []
        while n > 0:
            b = min(n, hist_len)
            for _ in range(b):
                graph.launch(stream)
            stream.synchronize()
            i0 = s0 % hist_len
            i1 = min(i0 + b, hist_len)
            out += c.history[0, i0:i1].get().tolist()
            if i0 + b > i1:  # the ring wrapped
                out += c.history[0, : i0 + b - i1].get().tolist()
            s0 += b
            n -= b
        return out
