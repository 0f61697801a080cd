"""The CUDA decode path behind the engine API: an adapter that gives `CudaQwen35` the model/cache
contract `engine.api.Engine` drives, and `CudaEngine`, whose greedy loop stays on the device."""
from __future__ import annotations

import numpy as np

from engine.api import Engine
from engine.gpu.memory import PREFILL_COLS, PREFILL_TAILS
from engine.gpu.decode import CudaQwen35


# Prompt tokens per tensor-core prefill chunk (`engine.gpu.prefill`). 27B pp8192 on the H200: 4,264 tok/s at
# chunk 1,024, 4,987 at 2,048, 5,432 at 4,096, 5,657 at 8,192. Its memory (~1.5-3 GiB of scratch, 12 B per context
# token for the gathered K/V) would cut the context a 24 GiB card fits by a third, so automatically (AUTO) it is
# built only when the device still has that room after the decode step and its KV cache: the largest of
# AUTO_CHUNKS that fits, else off. `build_engine(prefill_gemm=N)` forces chunk N (0: off).
AUTO = -1
AUTO_CHUNKS = (8192, 4096, 2048, 1024)
PREFILL_GEMM = AUTO
# The rest of a prompt (under the largest chunk) runs through the smallest tensor-core executor that holds it,
# padded, in one chunk: 27B pp2000 2,886 -> 6,645 tok/s.
PAD_MIN = 32  # fewer prompt tokens than this go through the columns step and the decode graph
# The piece plan's cost model, in prompt-token equivalents (27B on the H200: a chunk's fixed cost ~70 ms, ~0.126 ms
# a row; the columns step ~3.4 ms a token)
CHUNK_FIXED_TOKENS, COLS_TOKEN_COST = 550, 27


def piece_plan(r: int, sizes) -> list[tuple[int, int]]:
    """How to prefill r tokens (r under the largest size) with executors of `sizes` rows: a list of
    (executor rows, valid tokens), whole chunks and at most one padded one, the columns step and the
    decode graph taking what is left, at the least modeled cost."""
    best: dict[int, tuple[float, list]] = {}

    def go(n: int):
        if n in best:
            return best[n]
        choice = (COLS_TOKEN_COST * n, [])  # the columns step / decode graph
        for m in sizes:
            if m <= n:
                c, rest = go(n - m)
                if CHUNK_FIXED_TOKENS + m + c < choice[0]:
                    choice = (CHUNK_FIXED_TOKENS + m + c, [(m, m)] + rest)
            elif n >= PAD_MIN and CHUNK_FIXED_TOKENS + m < choice[0]:
                choice = (CHUNK_FIXED_TOKENS + m, [(m, n)])
        best[n] = choice
        return choice

    return go(r)[1]


def auto_prefill_chunk(args, cols: int, max_context: int, cap: int = AUTO_CHUNKS[0]) -> int:
    """The largest of AUTO_CHUNKS (at most `cap`) whose prefill executors, tails included, and K/V gather
    for `max_context` fit in the device's free memory (within the pool's --vram-limit cap) with 1 GiB to
    spare; 0 when none does."""
    from engine.backend import cupy_or_none  # noqa: PLC0415
    from engine.gpu.memory import prefill_executor_bytes, prefill_gather_bytes_per_token  # noqa: PLC0415

    cp = cupy_or_none()
    try:
        pool = cp.get_default_memory_pool()
        free = int(cp.cuda.runtime.memGetInfo()[0]) + int(getattr(pool, "free_bytes", lambda: 0)())
        limit = int(getattr(pool, "get_limit", lambda: 0)())  # --vram-limit caps the pool
        if limit > 0:
            free = min(free, limit - int(pool.used_bytes()))
    except Exception:  # noqa: BLE001 - no device query (CPU stand-in): leave the path off
        return 0
    # a --prefill-chunk below the smallest automatic size is taken as the chunk itself
    sizes = [c for c in AUTO_CHUNKS if c <= cap] or ([cap] if cap > cols else [])
    for chunk in sizes:
        need = prefill_executor_bytes(args, cols, chunk) + (1 << 30)  # tails included
        need += prefill_gather_bytes_per_token(args, cols, chunk) * max_context
        if need <= free:
            return chunk
    return 0


class _CudaCache:
    def __init__(self, model: "CudaModel"):
        self.model = model
        self.position = 0

    @property
    def state_bytes(self) -> int:
        return self.model.executor.state_bytes()

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.executor.kv_bytes_per_token()

    @property
    def nbytes(self) -> int:
        return self.model.executor.state_bytes() + self.position * self.kv_bytes_per_token


class CudaModel:
    """`model(tokens, cache) -> logits` over the graph-captured decode step (one token per replay)."""

    xp = np

    def __init__(self, args, weights: dict, *, max_context: int = 4096, gemv_cfg: dict | None = None,
                 kv: str = "bf16", prefill_cols: int = PREFILL_COLS, prefill_gemm: int = PREFILL_GEMM,
                 prefill_cap: int | None = None):
        self.args = args
        # (speculation, gpu/verify.py: the MTP head and the proposal head beside it)
        self.mtp_weights = {n: w for n, w in weights.items() if n.startswith(("mtp/", "proposal/"))}
        if "mtp/input_projection" not in self.mtp_weights:
            self.mtp_weights = {}
        self.speculator = None
        # fn(xn, rows, position, next ids) for every chunk fed: its final hidden rows (speculation's MTP prompt pass)
        self.hidden_sink = None
        self.executor = CudaQwen35(args, weights, max_context=max_context, gemv_cfg=gemv_cfg, kv=kv)
        self.weight_bytes = self.executor.weight_bytes()
        self.weight_bytes_per_token = self.executor.weight_bytes_per_token()
        # both graphs are captured now: capturing runs a step and resets the state, so never mid-sequence
        self.executor.capture()
        self.executor.capture_sampled()
        self.cols = None
        if prefill_cols > 1 and not args.is_moe:
            from engine.gpu.columns import CudaQwen35Columns  # noqa: PLC0415

            self.cols = CudaQwen35Columns(self.executor, prefill_cols)
            self.cols.capture()
        self.gemm = None
        self.gemms = []  # tensor-core prefill executors, largest chunk first
        if prefill_gemm < 0:  # auto: where the memory allows, at most prefill_cap rows
            prefill_gemm = auto_prefill_chunk(args, max(prefill_cols, 1), max_context,
                                              cap=prefill_cap or AUTO_CHUNKS[0])
        self.gemm_chunk = max(prefill_gemm, 0)
        if prefill_gemm > prefill_cols:
            from engine.gpu.prefill import CudaQwen35Prefill  # noqa: PLC0415

            self.gemm = CudaQwen35Prefill(self.executor, prefill_gemm)
            self.gemms = [self.gemm] + [CudaQwen35Prefill(self.executor, t, share=self.gemm)
                                        for t in PREFILL_TAILS if prefill_cols < t < prefill_gemm]

    def make_cache(self, *_):
        self.executor.reset()
        return _CudaCache(self)

    def _padded_chunks(self, ids, cache):
        """Whole chunks of the largest executor, then the rest as `piece_plan` says (whole chunks and at
        most one padded chunk). Returns (tokens consumed, last logits or None)."""
        i, last = 0, None
        big = self.gemms[0]
        while len(ids) - i >= big.M:
            big.run_chunk(ids[i:i + big.M], cache.position)
            self._sink(big.xn, big.M, cache.position, ids, i)
            i += big.M
            cache.position += big.M
            last = big.logits
        by_rows = {g.M: g for g in self.gemms}
        for m, valid in piece_plan(len(ids) - i, sorted(by_rows)):
            if cache.position + m > self.executor.max_context:  # no room for the padding's K/V
                break
            g = by_rows[m]
            g.run_chunk(ids[i:i + valid] + [0] * (m - valid), cache.position, valid=None if valid == m else valid)
            self._sink(g.xn, valid, cache.position, ids, i)
            i += valid
            cache.position += valid
            last = g.logits
        return i, last

    def _sink(self, xn, rows: int, position: int, ids, i: int) -> None:
        """Hand rows [0, rows) of a chunk's final hidden states (ids[i:], from `position`) to `hidden_sink`."""
        if self.hidden_sink is not None:
            self.hidden_sink(xn, rows, position, ids[i + 1:i + rows + 1])

    def __call__(self, tokens, cache, last_only: bool = True):
        """Feed tokens: whole chunks of T through the columns graph (prompts), the rest one per replay."""
        ex = self.executor
        ids = [int(t) for t in np.asarray(tokens).ravel()]
        rows, i, last = [], 0, None
        if last_only and self.gemms:
            i, last = self._padded_chunks(ids, cache)
        for gemm in self.gemms if last_only else ():
            T = gemm.M
            while len(ids) - i >= T:
                gemm.run_chunk(ids[i:i + T], cache.position)
                self._sink(gemm.xn, T, cache.position, ids, i)
                i += T
                cache.position += T
                last = gemm.logits
        if self.cols is not None and last_only:
            T = self.cols.M
            while len(ids) - i >= T:
                self.cols.run_chunk(ids[i:i + T])
                self._sink(self.cols.ctx.xn, T, cache.position, ids, i)
                i += T
                cache.position += T
                last = self.cols.logits
        for j, t in enumerate(ids[i:], i):
            ex.set_token(t)
            ex.graph.launch(ex.stream)
            self._sink(ex.ctx.xn, 1, cache.position, ids, j)
            cache.position += 1
            last = ex.logits
            if not last_only:
                rows.append(ex.logits[0].get())
        if last_only:
            ex.stream.synchronize()
            return last[:1].get()
        return np.stack(rows)


class CudaEngine(Engine):
    """Engine on the CUDA decode step: `decode_greedy` replays the graph with no host sync per token, and
    `decode_stream` keeps the device one step ahead of the reader.

    A stream that its consumer leaves early has launched at most one step past the last token read; that
    step's input was already part of the sequence, so the cache stays consistent: `_settle` waits for it and
    records what the launched steps consumed before any other call touches the sequence."""

    _stream_state = None

    def _chunk_len(self, position: int) -> int:
        # the CUDA executors keep no per-chunk score matrix of the whole context (the GEMM prefill
        # bounds its own query blocks), so prompt pieces need not shrink deep in the context
        return self.prefill_chunk

    def _settle(self) -> None:
        """Finish an open stream: wait for its steps, count what they consumed."""
        st, self._stream_state = self._stream_state, None
        if st is not None:
            self.model.executor.sampler.finish_stream(st)
            self.cache.position = st.base + st.launched
            self._tokens.extend(st.consumed())
            self._last = None

    def reset(self) -> None:
        self._settle()
        super().reset()

    def _run(self, ids, *, all_rows: bool = False):
        self._settle()
        return super()._run(ids, all_rows=all_rows)

    def _resume(self, prompt):
        self._settle()  # (the prefix match reads the consumed ids)
        return super()._resume(prompt)

    def logits(self, token_ids):
        self._settle()
        return super().logits(token_ids)

    def decode_greedy(self, first_token: int, n: int) -> list[int]:
        self._settle()
        self._check_room(n)
        out = self.model.executor.decode_greedy(int(first_token), n)
        self.cache.position += n
        self._tokens.extend([int(first_token)] + out[:-1])
        self._last = None
        return out

    @property
    def decode_sampled(self):
        """`fn(first_token, n, sampler_params) -> list[int]`: n tokens drawn on the device, one host read a
        burst. `sampler_params`: engine.device_sampling.pack_params(...) or a Sampler it can stand in for."""
        return self._decode_sampled

    def _params(self, sampler_params):
        from engine.device_sampling import device_params  # noqa: PLC0415

        if hasattr(sampler_params, "is_greedy"):
            params = device_params(sampler_params)
            if params is None:
                raise ValueError("this sampler needs the host (a logit bias, a grammar, or penalties without top_k)")
            return params, sampler_params.counts
        return sampler_params, None

    def _decode_sampled(self, first_token: int, n: int, sampler_params, counts=None) -> list[int]:
        self._settle()
        params, own = self._params(sampler_params)
        self._check_room(n)
        out = self.model.executor.decode_sampled(int(first_token), n, params, counts if counts is not None else own)
        self.cache.position += n
        self._tokens.extend([int(first_token)] + out[:-1])
        self._last = None
        return out

    def decode_stream(self, first_token: int, n: int, sampler_params, counts=None):
        """Yield n tokens after `first_token`, drawn on the device as `sampler_params` says (greedy, or a Sampler
        / packed row the device samplers take; `counts`: the penalties' generated-token counts so far), each as
        soon as its step ends while the next step already runs. Closing the iterator early settles the stream."""
        from engine.gpu.sampling import StreamState  # noqa: PLC0415

        self._settle()
        params, own = self._params(sampler_params)
        ex = self.model.executor
        if self.max_context:
            n = min(int(n), self.max_context - self.position)
        graph = ex.prepare_draws(params, counts if counts is not None else own)
        st = StreamState(first_token, self.position)
        self._stream_state = st
        try:
            for tok in ex.sampler.stream_tokens(graph, st, n):
                self.cache.position = st.base + st.launched
                yield tok
        finally:
            if self._stream_state is st:
                self._settle()

    def decode_masked(self, first_token: int, n: int, params, next_mask, counts=None):
        """Yield up to n tokens after `first_token`, each drawn on the device by the top-k sampler (`params`:
        engine.device_sampling.masked_params) under the grammar mask `next_mask()` gives for it (int32 words; None
        ends the stream). Each step waits for the host's mask, so nothing is launched ahead."""
        from engine.gpu.sampling import StreamState  # noqa: PLC0415

        self._settle()
        ex = self.model.executor
        if getattr(ex, "graph_topk", None) is None:
            raise ValueError("this engine has no top-k sampler graph")
        if self.max_context:
            n = min(int(n), self.max_context - self.position)
        ex.sampler.set_sampling(params)
        ex.sampler.set_counts(counts)
        st = StreamState(first_token, self.position)
        self._stream_state = st
        try:
            for tok in ex.sampler.masked_tokens(ex.graph_topk, st, n, next_mask):
                self.cache.position = st.base + st.launched
                yield tok
        finally:
            if self._stream_state is st:
                self._settle()

    @property
    def decode_step_sparse(self):
        """`fn(token, margin) -> SparseLogits`: streamed host sampling reads back only the ids within the
        sampler's margin of the top logit."""
        return self._decode_step_sparse

    def _decode_step_sparse(self, token_id: int, margin: float):
        from engine.backend import cupy_or_none  # noqa: PLC0415
        from engine.sampling import SparseLogits  # noqa: PLC0415

        self._settle()
        cp = cupy_or_none()
        self._check_room(1)
        ex = self.model.executor
        ex.set_token(int(token_id))
        ex.graph.launch(ex.stream)
        self.cache.position += 1
        self._tokens.append(int(token_id))
        self._last = None
        with ex.stream:
            row = ex.logits[0, : self.domain]
            # ufuncs called directly: CuPy's operators with a scalar operand go through __array_ufunc__,
            # which imports cupyx and SciPy (an import that has failed on device images whose
            # site-packages read back as NUL bytes)
            thr = cp.subtract(row.max(keepdims=True), cp.float32(margin))
            ids = cp.flatnonzero(cp.greater_equal(row, thr))
            vals = row[ids]
            out = SparseLogits(ids.get(), vals.get(), self.domain)
        return out

    def speculator(self, k: int):
        """The MTP speculation graphs for k drafts (engine.gpu.verify.Speculator), built on first use: building
        captures graphs, which drops the sequence held for prefix reuse."""
        self._settle()
        sp = self.model.speculator
        if sp is None or sp.k != k:
            from engine.gpu.verify import Speculator  # noqa: PLC0415

            self.model.speculator = None  # (the old graphs' buffers go before the new ones are made)
            super().reset()
            self.model.speculator = sp = Speculator(self.model.executor, self.model.mtp_weights, k,
                                                    prefill=self.model.gemm)
            super().reset()
        return sp

    def seek_synthetic(self, n: int) -> None:
        """Move a fresh sequence to position `n` without computing the `n` tokens (bench `-d` on a
        synthetic model, whose random weights make any context meaningless): the KV pages below `n`
        keep whatever they hold, and decode reads them exactly as it reads computed ones."""
        self._settle()
        if self.position:
            raise RuntimeError("seek_synthetic starts a fresh sequence: call reset() first")
        self._check_room(n)
        self.model.executor.pos.fill(n)
        self.cache.position = n
        self._tokens.extend([0] * n)
        self._last = None

    def info(self) -> dict:
        d = super().info()
        ex = self.model.executor
        d.update(backend="cuda-graph", weight_bytes=ex.weight_bytes(),
                 weight_bytes_per_token=ex.weight_bytes_per_token(), state_bytes=ex.state_bytes(),
                 kv_bytes_per_token=ex.kv_bytes_per_token(),
                 # prompt chunks on tensor cores, largest first ("" when that path is off), then the
                 # columns step's rows
                 prefill_chunks=",".join(str(g.M) for g in self.model.gemms),
                 prefill_cols=self.model.cols.M if self.model.cols is not None else 0)
        return d


def build_engine(args, device_weights: dict, config: dict, *, max_context: int = 4096, tokenizer=None,
                 gemv_cfg: dict | None = None, kv: str = "bf16", prefill_cols: int = PREFILL_COLS,
                 prefill_gemm: int = PREFILL_GEMM, prefill_chunk: int | None = None) -> CudaEngine:
    # auto (prefill_gemm < 0): prefill_chunk, when given, caps the tensor-core chunk
    model = CudaModel(args, device_weights, max_context=max_context, gemv_cfg=gemv_cfg, kv=kv,
                      prefill_cols=prefill_cols, prefill_gemm=prefill_gemm, prefill_cap=prefill_chunk)
    # the engine hands the model prompt pieces of prefill_chunk tokens: at least one GEMM chunk
    return CudaEngine(model, config, device="gpu", tokenizer=tokenizer, max_context=max_context,
                      prefill_chunk=max(prefill_chunk or 256, model.gemm_chunk))


def cuda_supported(args) -> bool:
    """Whether the CUDA decode step runs this model: Qwen3.5 dense or MoE with the published head sizes."""
    return (args.model_type in ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe")
            and args.head_dim == 256 and args.linear_key_head_dim == 128 and args.linear_value_head_dim == 128)


def try_build(config: dict, source, *, max_context: int | None = None, tokenizer=None, kv: str = "bf16",
              progress=None, prefill_chunk: int | None = None):
    """A CudaEngine for `source` (an Artifact, or a dict of float weights) when the model is supported,
    else None (the caller then runs the reference model on CuPy arrays). `progress(done, total)` follows
    the upload of an artifact's packed objects, in bytes."""
    from engine.gpu import weights as gpu_weights  # noqa: PLC0415
    from engine.config import ModelArgs  # noqa: PLC0415

    args = ModelArgs.from_config(config)
    if not cuda_supported(args):
        return None
    if hasattr(source, "bindings"):
        weights = gpu_weights.from_artifact(source, progress=progress)
    else:
        weights = gpu_weights.from_logical(args, source)
    ctx = int(max_context or min(args.max_position_embeddings or 32768, 32768))
    # --prefill-chunk: the prompt pieces; it sets the tensor-core chunk when that path is forced on
    # (build_engine(prefill_gemm=N)) and caps it when auto
    gemm = int(prefill_chunk) if prefill_chunk and PREFILL_GEMM > 0 else PREFILL_GEMM
    return build_engine(args, weights, config, max_context=ctx, tokenizer=tokenizer, kv=kv, prefill_gemm=gemm,
                        prefill_chunk=prefill_chunk)
