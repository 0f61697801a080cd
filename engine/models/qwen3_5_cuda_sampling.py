"""Token bursts of the CUDA decode step (`CudaQwen35` takes them as a base): the greedy graph's and the
sampled graph's, whose step ends in the device sampler (cuda/sampler.cu: sample_max_mb + sample_step_mb)
instead of the argmax. Both commit the token the same way (next input, position, history ring, step), so
a burst of n steps needs one read of the history ring at its end. The methods use the executor's buffers
(`_alloc`, `_alloc_state`), its stream and `_capture`."""
from __future__ import annotations

import numpy as np

from engine.ops import kernels as K


class SamplingOps:
    SAMPLE_BLOCKS = 64  # blocks a row of the device sampler

    def _sample_ops(self):
        """The device sampler in place of the argmax (parameters in `sp_params`, one row a lane, written by
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
        D = int(getattr(self.args, "domain", self.V) or self.V)
        return [K.prepared("sample_max_mb", (nb, M), (self.logits, self.V, D, self.sp_v, self.sp_i), block=256),
                K.prepared("sample_step_mb", (nb, M),
                           (self.logits, self.V, D, self.sp_params, self.sp_v, self.sp_i, self.sp_hist_c,
                            self.sp_hist_w, self.sp_cand, self.sp_cand_n, ds.SAMPLE_CAND, self.sp_ticket,
                            self.tokens, self.pos, self.history, self.step, self.hist_len), block=1024)]

    def capture_sampled(self):
        """Capture the sampled step (the greedy graph's ops with the device sampler as the tail) as
        `graph_sampled`; like capture(), it runs a step and resets, so call it before a sequence starts."""
        if self.graph is None:
            self.capture()
        if self.ops[-1] is not self._argmax_op:
            raise RuntimeError("the step does not end in the argmax: no sampled graph for this executor")
        self.ops_sampled = self.ops[:-1] + self._sample_ops()
        self.graph_sampled = self._capture(self.ops_sampled)

    def set_sampling(self, params) -> None:
        """Write the sampler's parameter row (engine.device_sampling.pack_params) for every lane, when changed."""
        row = np.asarray(params, dtype=np.uint64).reshape(-1)
        if self._sp_host is None or not np.array_equal(self._sp_host, row):
            self.sp_params.set(np.tile(row, (self.M, 1)), stream=self.stream)
            self._sp_host = row.copy()

    def decode_sampled(self, first_token: int, n: int, params) -> list[int]:
        """n tokens drawn on the device after `first_token`, each fed back by the graph itself."""
        self.set_sampling(params)
        return self._burst(self.graph_sampled, first_token, n)

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
