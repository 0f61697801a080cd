"""Qwen3.5 hybrid decode on the GPU: packed weights, static buffers, one CUDA graph per step.

The step is shaped for M token rows (`lanes`; later also the K+1 columns of speculative
verification); wave one runs M = 1. Every buffer is allocated once, at build; the step is a fixed list of
prepared kernel launches captured into a CUDA graph; per-step scalars (input token, position, step
counter) live in device memory and are advanced by the last kernel, so a burst of greedy tokens needs
no host synchronisation at all. The NumPy model (`qwen3_5.py`) is the reference for every number here.

The executor is a composition: a StepContext (engine.gpu.step: dimensions, plan, streams, sequence state, the shared
activation buffers and GEMV helpers) and the blocks it holds and calls in `_plan`, each in its module: NormBlock,
AttentionBlock, GdnBlock, MlpBlock or MoeBlock, Sampler. The column forms (engine.gpu.columns, engine.gpu.verify) pick
their own GDN block (`GDN`) and supply the step's hooks (`_alloc_state`, `_pre_ops`, `_embed_ops`, `_tail_ops`).
"""
from __future__ import annotations

import math

import numpy as np

from engine.gpu import plan as gpu_plan
from engine.gpu.weights import concat_rows
from engine.gpu import launch as K
from engine.gpu.gemv import embed_rows
from engine.gpu.attention import ATTN_HEAD_DIM, KV_PAGE, AttentionBlock
from engine.gpu.gdn import GDN_HEAD_DIM, GdnBlock
from engine.gpu.mlp import MlpBlock
from engine.gpu.moe import MoeBlock
from engine.gpu.norm import NormBlock
from engine.gpu.sampling import TOPK_MAX, TOPK_TILE, Sampler
from engine.gpu.step import StepContext, padded


def _four_projections(cp, L: dict, parts: list, merged: str, second: str) -> None:
    """A layer's four projections of the normed row (q, k, then gate and v or v and z): where they share a row-split
    format and K, one object L[merged] with L["qk"] and L[second] its row views (one GEMV can project it); else the two
    pairs concatenated apart."""
    nqk = parts[0].n + parts[1].n
    if all(m.fmt in K.FMT_IDS and m.fmt == parts[0].fmt and m.k == parts[0].k for m in parts):
        L[merged] = concat_rows(cp, parts)
        L["qk"], L[second] = L[merged].row_slice(0, nqk), L[merged].row_slice(nqk, L[merged].n)
    else:
        L["qk"], L[second] = concat_rows(cp, parts[:2]), concat_rows(cp, parts[2:])


class CudaQwen35:
    """Decode-step executor for Qwen3.5 dense models on one GPU.

    `weights` maps logical names (spec/container.md §2.3) to `DevMatrix` (projections, embedding,
    head) or 1-D/2-D CuPy float32 arrays (norms, conv, a_log, dt_bias). `plan` (engine.gpu.plan): the
    kernel and form of every op; by default the one this GPU takes for these weights (NINFER_PLAN applied).
    """

    GDN = GdnBlock  # the GDN layers' block (the column forms take one with their own core)
    ATTN = AttentionBlock  # the attention layers' block (the column forms: two columns a tile)

    def __init__(self, args, weights: dict, *, max_context: int = 4096, lanes: int = 1,
                 gemv_cfg: dict | None = None, kv: str = "bf16", plan: gpu_plan.DecodePlan | None = None):
        import cupy as cp  # noqa: PLC0415

        self.cp, self.args, self.M = cp, args, lanes
        if kv not in ("bf16", "int8"):
            raise ValueError(f"unknown KV format {kv!r}: bf16 or int8")
        self.kv = kv
        self.plan = plan if plan is not None else gpu_plan.plan_for(args, weights, kv)
        if self.plan.kv != kv:
            raise ValueError(f"the plan is for a {self.plan.kv} KV cache, not {kv}")
        K.require(self.plan.kernels)
        K.PDL = self.plan.pdl
        a = args
        if a.head_dim != ATTN_HEAD_DIM or (a.linear_key_head_dim or GDN_HEAD_DIM) != GDN_HEAD_DIM:
            raise ValueError("GPU kernels need attention head_dim 256 and GDN head dims 128")
        self.H, self.V = a.hidden_size, a.vocab_size
        self.max_context = int(math.ceil(max_context / KV_PAGE) * KV_PAGE)
        # the table was measured for one token row; M > 1 (columns) keeps GemvPlan's defaults
        cfg = gemv_cfg if gemv_cfg else (self.plan.gemv_cfg() if lanes == 1 else {})
        self.ctx = c = StepContext(cp, args, self.plan, rows=lanes, max_context=self.max_context, kv=kv, gemv_cfg=cfg)
        self._build_weights(weights)
        c.alloc(self.layers)
        self._alloc_state()
        self.tokens, self.logits = c.tokens, c.logits
        self.pos, self.step, self.history = c.pos, c.step, c.history
        self.norm, self.attention, self.gdn = NormBlock(c), self.ATTN(c), self.GDN(c)
        self.mlp, self.moe = (None, MoeBlock(c)) if a.is_moe else (MlpBlock(c), None)
        self.sampler = self._sampler()
        self.graph = None
        self.ops = self._plan()

    @property
    def stream(self):
        """The stream the step's graphs run on (the executor's own, made at the first capture, or another's)."""
        return self.ctx.stream

    # ---- weights -------------------------------------------------------------------------------
    def _build_weights(self, w):
        cp = self.cp
        self.embed = w["text/token_embedding"]
        self.head = w.get("text/output_head", self.embed)
        self.final_norm = w["text/final_norm"]
        self.layers = []
        for i, kind in enumerate(self.args.layer_types):
            p = f"text/layers/{i}/"
            L = {"kind": kind, "in_norm": w[p + "input_norm"], "post_norm": w[p + "post_attention_norm"]}
            if self.args.is_moe:
                E, m = self.args.num_experts, p + "moe/"
                L["router"] = concat_rows(cp, [w[m + "router"], w[m + "shared_score"]])
                L["experts_gu"] = concat_rows(cp, [w[f"{m}experts/{e}/{r}"] for e in range(E) for r in ("gate", "up")])
                L["experts_down"] = concat_rows(cp, [w[f"{m}experts/{e}/down"] for e in range(E)])
                L["shared_gu"] = concat_rows(cp, [w[m + "shared/gate"], w[m + "shared/up"]])
                L["shared_down"] = w[m + "shared/down"]
            else:
                L["gate_up"] = concat_rows(cp, [w[p + "mlp/gate"], w[p + "mlp/up"]])
                L["down"] = w[p + "mlp/down"]
            if kind == "full_attention":  # (q|k and gate|v: ATTN_MERGE projects their shared object in one GEMV)
                _four_projections(cp, L, [w[p + f"attention/{n}"] for n in ("query", "key", "gate", "value")],
                                  "qkgv", "gv")
                L["o"] = w[p + "attention/output"]
                L["qn"], L["kn"] = w[p + "attention/query_norm"], w[p + "attention/key_norm"]
            else:  # (q|k and v|z: GDN_MERGE projects their shared object in one GEMV)
                _four_projections(cp, L, [w[p + f"gdn/{n}"] for n in ("query", "key", "value", "z")], "qkvz", "vz")
                L["ab"] = concat_rows(cp, [w[p + "gdn/a_projection"], w[p + "gdn/b_projection"]])
                L["o"] = w[p + "gdn/output"]
                L["conv"] = w[p + "gdn/convolution"]
                L["a_log"], L["dt_bias"], L["norm"] = w[p + "gdn/a_log"], w[p + "gdn/dt_bias"], w[p + "gdn/norm"]
            self.layers.append(L)

    def _matrices(self):
        yield self.head
        if self.head is not self.embed:
            yield self.embed
        for L in self.layers:
            for key in ("qk", "gv", "vz", "ab", "o", "gate_up", "down", "router", "shared_gu", "shared_down",
                        "experts_gu", "experts_down"):
                if key in L:
                    yield L[key]

    def weight_bytes(self) -> int:
        """Packed weight bytes resident on the device."""
        return sum(m.nbytes for m in self._matrices())

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights read per decoded token (the embedding gather reads one row; of the routed
        experts only top-k of E are read)."""
        total = self.weight_bytes() - (self.embed.nbytes - self.embed.nbytes // max(self.embed.n, 1))
        if self.head is self.embed:
            total = self.weight_bytes()
        for L in self.layers:
            if "experts_gu" in L:
                routed = L["experts_gu"].nbytes + L["experts_down"].nbytes
                total -= routed - int(routed * self.args.num_experts_per_tok / self.args.num_experts)
        return total

    def state_bytes(self) -> int:
        """One copy of the GDN recurrent + conv state (a decode step reads it and writes it back)."""
        c = self.ctx
        n_gdn = sum(1 for t in self.args.layer_types if t != "full_attention")
        conv = 3 * (2 * c.Hk + c.Hv) * GDN_HEAD_DIM * 4
        return n_gdn * (c.Hv * GDN_HEAD_DIM * GDN_HEAD_DIM * 4 + conv)

    def kv_bytes_per_token(self) -> int:
        n_attn = sum(1 for t in self.args.layer_types if t == "full_attention")
        per_row = ATTN_HEAD_DIM * 2 if self.kv == "bf16" else ATTN_HEAD_DIM + ATTN_HEAD_DIM // 64 * 2
        return n_attn * self.ctx.Hkv * per_row * 2

    # ---- sequence state ------------------------------------------------------------------------
    def _alloc_state(self):
        """Per-lane sequence state in the context: positions, the paged KV pool, GDN conv history and recurrent
        state."""
        c = self.ctx
        cp, M, f32 = self.cp, self.M, self.cp.float32
        c.pos = cp.zeros(M, dtype=cp.int32)
        c.step = cp.zeros(M, dtype=cp.int32)
        c.hist_len = 4096
        c.history = cp.zeros((M, c.hist_len), dtype=cp.int32)
        C = (2 * c.Hk + c.Hv) * GDN_HEAD_DIM
        pages_per_lane = self.max_context // KV_PAGE
        c.page_table = cp.arange(M * pages_per_lane, dtype=cp.int32).reshape(M, pages_per_lane)
        for L in self.layers:
            if L["kind"] == "full_attention":
                shape = (M * pages_per_lane, KV_PAGE, c.Hkv, ATTN_HEAD_DIM)
                if self.kv == "bf16":
                    L["kc"] = cp.zeros(shape, dtype=cp.uint16)
                    L["vc"] = cp.zeros(shape, dtype=cp.uint16)
                    L["ks"] = L["vs"] = None
                else:
                    L["kc"] = cp.zeros(shape, dtype=cp.int8)
                    L["vc"] = cp.zeros(shape, dtype=cp.int8)
                    L["ks"] = cp.zeros(shape[:-1] + (ATTN_HEAD_DIM // 64,), dtype=cp.float16)
                    L["vs"] = cp.zeros(shape[:-1] + (ATTN_HEAD_DIM // 64,), dtype=cp.float16)
            else:
                L["conv_state"] = cp.zeros((M, 3, C), dtype=f32)
                L["state"] = cp.zeros((M, c.Hv, GDN_HEAD_DIM, GDN_HEAD_DIM), dtype=f32)
        c.qpos, c.pt_stride = c.pos, pages_per_lane  # where each token row's position and pages are

    def _sampler(self):
        """The block of the step's tail (the greedy argmax and the device samplers), or None where the tail is
        another."""
        return Sampler(self.ctx)

    def reset(self):
        """Forget the sequence: zero caches and GDN state, position 0."""
        for L in self.layers:
            for key in ("conv_state", "state"):
                if key in L:
                    L[key].fill(0)
        self.pos.fill(0)
        self.step.fill(0)

    # ---- the step ------------------------------------------------------------------------------
    def _plan(self):
        c = self.ctx
        ops = self._pre_ops() + self._embed_ops()
        prev_splits = 0
        c.res = (c.x, c.x2)
        for L in self.layers:
            ops.append(self.norm.op(prev_splits, L["in_norm"]))
            xn = (c.xh_n, c.xinv_n, c.xpk_n)
            att_k = L["o"].k
            att_stage = (att_k, padded(att_k), c.xh_att, c.xinv_att)  # (per layer: the o-projection's K)
            # the o-projection reads its input staged a 32-value chunk at a time where its GEMV (or the fused MoE
            # block's o-phase) takes chunk scales
            o_pairs = (c.xh_att, c.xinv_att, c.xpk_att)
            o_plan = c.plan_gemv(L["o"], c.att, c.part, "partial", c.splits(L["o"]), o_pairs, xs=c.gated_chunk_scales())
            staged_chunks = bool(o_plan.xs or (self.moe is not None and self.moe.o_chunked(L)))
            block = self.attention if L["kind"] == "full_attention" else self.gdn
            proj, core = block.ops(L, xn, att_stage, chunk=staged_chunks)
            ops += proj + core
            o_in = None  # (the o-projection inside the fused MLP: its input pairs and scales)
            if self.mlp is not None:
                if o_plan.xs:
                    o_in = (c.xh_att, c.gated_chunk_scales(), True)
                elif L["kind"] == "full_attention":
                    o_in = (c.xh_att, c.xinv_att, False)
            if o_in is not None:
                fused = self.mlp.fused_ops(L, 0, oproj=(L["o"],) + o_in)
                if fused is not None:
                    ops.extend(fused[0])
                    prev_splits = fused[1]
                    continue
            if self.moe is not None and not o_plan.xs:  # (the o-projection inside moe_fused)
                fused = self.moe.fused_ops(L, 0, oproj=(L["o"], c.xh_att, c.xinv_att,
                                                        c.xsc_att if staged_chunks else None))
                if fused is not None:
                    ops.extend(fused[0])
                    prev_splits = fused[1]
                    continue
            if staged_chunks and not o_plan.xs:
                raise RuntimeError("the o-projection's input was staged by chunks for a launch that did not take it")
            ops.append(o_plan.launch)
            ffn = self.moe if self.moe is not None else self.mlp
            one_launch = ffn.fused_ops(L, o_plan.splits)
            if one_launch is not None:  # (the post-attention norm inside the fused MLP launch)
                ops.extend(one_launch[0])
                prev_splits = one_launch[1]
                continue
            ops.append(self.norm.op(o_plan.splits, L["post_norm"]))
            ffn_ops, prev_splits = ffn.ops(L, xn)
            ops.extend(ffn_ops)
        ops.append(self.norm.op(prev_splits, self.final_norm))
        ops.extend(self._tail_ops())
        return ops

    def _pre_ops(self):
        """The step's first ops, before the embedding (the columns step: its columns' positions)."""
        return []

    def _embed_ops(self, out=None):
        """The token rows' embeddings into x (`out`: another [M, H] buffer; the MTP head's executor puts its
        own input stage here)."""
        return [embed_rows(self.embed, tokens=self.tokens, out=self.ctx.x if out is None else out, ld=self.H,
                           rows=self.M)]

    def _tail_ops(self):
        """Head and device argmax: the next input token, the position and the history advance."""
        c = self.ctx
        self._argmax_op = self.sampler.argmax_op()
        return [c.gemv(self.head, c.xn, c.logits, xpre=(c.xh_n, c.xinv_n)), self._argmax_op]

    def run_eager(self):
        for op in self.ops:
            op()

    def capture(self):
        """Capture the step into a CUDA graph (the step is run once eagerly first, then state reset)."""
        self.graph = self._capture(self.ops)

    def _capture(self, ops):
        c = self.ctx
        if c.stream is None:
            c.stream = self.cp.cuda.Stream(non_blocking=True)
        stream = c.stream
        with stream:
            for op in ops:
                op()
            stream.synchronize()
            self.reset()
            stream.begin_capture()
            for op in ops:
                op()
            graph = stream.end_capture()
            graph.upload(stream)
        stream.synchronize()
        return graph

    def step_async(self):
        if self.graph is None:
            self.capture()
        self.graph.launch(self.stream)

    # ---- the sampled graphs --------------------------------------------------------------------
    def capture_sampled(self):
        """Capture the sampled steps (the greedy graph's ops with a device sampler as the tail): `graph_sampled`
        (histogram sampler) and `graph_topk`; like capture(), each runs a step and resets, so call this before a
        sequence starts."""
        if self.graph is None:
            self.capture()
        if self.sampler is None or self.ops[-1] is not self._argmax_op:
            raise RuntimeError("the step does not end in the argmax: no sampled graph for this executor")
        self.ops_sampled = self.ops[:-1] + self.sampler.sample_ops()
        self.graph_sampled = self._capture(self.ops_sampled)
        if self.sampler.domain() <= 32 * TOPK_TILE:
            self.ops_topk = self.ops[:-1] + self.sampler.topk_ops()
            self.graph_topk = self._capture(self.ops_topk)

    def sampled_graph(self, params):
        """The graph that draws what `params` asks for: the argmax for greedy, the top-k sampler where it applies."""
        from engine import device_sampling as ds  # noqa: PLC0415

        settings = ds.unpack_params(params)
        if not settings["temperature"] > 0.0:
            return self.graph
        if 0 < settings["top_k"] <= TOPK_MAX and getattr(self, "graph_topk", None) is not None:
            return self.graph_topk
        return self.graph_sampled

    def prepare_draws(self, params, counts=None):
        """Write the sampler's parameters (and counts) and return the graph to replay."""
        graph = self.sampled_graph(params)
        if getattr(self, "graph_topk", None) is not None:
            self.sampler.set_allow(None)
        if graph is not self.graph:
            self.sampler.set_sampling(params)
            if graph is getattr(self, "graph_topk", None):
                self.sampler.set_counts(counts)
        return graph

    # ---- the engine protocol -------------------------------------------------------------------
    def set_token(self, token: int):
        self.tokens.set(np.full(self.M, token, dtype=np.int32), stream=self.stream if self.graph else None)

    def prefill(self, token_ids) -> np.ndarray:
        """Run the prompt one token at a time through the decode graph; return the last logits."""
        if self.graph is None:
            self.capture()
        for t in token_ids:
            self.set_token(int(t))
            self.graph.launch(self.stream)
        self.stream.synchronize()
        return self.logits[0].get()

    def decode_step(self, token: int) -> np.ndarray:
        return self.prefill([token])

    def decode_greedy(self, first_token: int, n: int) -> list[int]:
        """n greedy tokens after `first_token`, the loop kept on the device (argmax feeds the next step)."""
        if self.graph is None:
            self.capture()
        return self.sampler.burst(self.graph, first_token, n)

    def decode_sampled(self, first_token: int, n: int, params, counts=None) -> list[int]:
        """n tokens drawn on the device after `first_token`, each fed back by the graph itself."""
        return self.sampler.burst(self.prepare_draws(params, counts), first_token, n)

    @property
    def position(self) -> int:
        return int(self.pos[0].get())
