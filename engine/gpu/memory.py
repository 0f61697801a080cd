"""The device memory plan: what a model needs on the GPU, computed before anything is allocated.

A plan has fixed parts (packed weights of the components a launch loads, GDN state slots, the
activation workspace, the CUDA-graph pool, speculative-decoding arenas) and the paged KV pools, which
grow with the context (pages of 64 tokens, spec/runtime.md §3.2). Headroom (1 GiB by default, as
upstream) is kept free for the allocator and the libraries. `fit_context` walks a ladder of context
sizes (surfaces.md §4.3) down to the largest that fits; `check_context` turns an explicit context that
cannot fit into one error with needed vs free and the next action.

Weight bytes come from an artifact's object sizes (JSON header only) or from the synthetic recipe
(`engine.gpu.weights.RECIPES`) and the geometry. What is free to plan with, `--vram-limit` and stepping
down when an allocation is refused live in `engine.memory_budget`. Only the standard library is
imported at module level.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import NinferError

KIB, MIB, GIB = 1024, 1024**2, 1024**3
KV_PAGE = 64
DEFAULT_HEADROOM = GIB  # runtime.md §3.2: auto capacity keeps R = 1 GiB free
GRAPH_POOL = 64 * MIB  # estimate: captured decode graphs and their private pool
CONTEXT_ESTIMATE = 512 * MIB  # CUDA context + cuBLAS when a budget is given without a device to measure
# upstream launcher rungs (surfaces.md §4.3), extended below 65,536 for small cards
LADDER = (262144, 229376, 212992, 196608, 163840, 131072, 114688, 98304, 65536, 49152, 32768, 16384, 8192, 4096)
KV_FORMATS = ("bf16", "int8")
# KV formats the CUDA engine stores (`CudaQwen35(kv=...)`)
GPU_KV_FORMATS = ("bf16", "int8")
# per-row fp32 scratch of chunked prefill, per activation element (inputs, outputs, partials)
PREFILL_ROW_FACTOR = 1.25


def kv_head_bytes(head_dim: int, kv: str) -> int:
    """Bytes of one token's K (or V) for one head: bf16 2 B/elem; int8-g64 1 B/elem + fp16 scale per 64."""
    if kv == "bf16":
        return 2 * head_dim
    if kv == "int8":
        return head_dim + 2 * math.ceil(head_dim / 64)
    raise NinferError(f"unknown KV format {kv!r}", f"use one of {', '.join(KV_FORMATS)}")


def kv_bytes_per_token(args, kv: str = "bf16", layers: int | None = None) -> int:
    """K + V bytes per context position over all full-attention layers (or `layers` of them).

    27B: 16 layers x 4 heads x 256 -> 65,536 (bf16) / 33,792 (int8-g64); 35B-A3B: 20,480 / 10,560.
    """
    n = len(args.full_attention_layers) if layers is None else layers
    return 2 * n * args.num_key_value_heads * kv_head_bytes(args.head_dim, kv)


def gdn_slot_bytes(args, *, conv_bytes: int = 4) -> int:
    """One GDN state slot (one lane's current state): fp32 recurrent [Hv, Dv, Dk] + conv history [K-1, C].

    The CUDA engine keeps the conv history in fp32 (upstream BF16), hence `conv_bytes=4`.
    """
    n_gdn = args.num_hidden_layers - len(args.full_attention_layers)
    recurrent = args.linear_num_value_heads * args.linear_value_head_dim * args.linear_key_head_dim * 4
    conv = (args.linear_conv_kernel_dim - 1) * args.gdn_conv_channels * conv_bytes
    return n_gdn * (recurrent + conv)


def replay_arena_bytes(args, lanes: int, columns: int) -> int:
    """ReplaySSM record arena (runtime.md §3.5): L x C x T x (2Cp + 2KHq + 2VHv + 8Hv) bytes."""
    n_gdn = args.num_hidden_layers - len(args.full_attention_layers)
    per = (2 * args.gdn_conv_channels + 2 * args.linear_key_head_dim * args.linear_num_key_heads
           + 2 * args.linear_value_head_dim * args.linear_num_value_heads + 8 * args.linear_num_value_heads)
    return n_gdn * lanes * columns * per


def workspace_bytes(args, rows: int, prefill_chunk: int = 0) -> int:
    """Activations: the decode step's static buffers for `rows` token rows (as `StepContext.alloc` makes
    them, fp32), plus chunked-prefill scratch for `prefill_chunk` rows (an estimate)."""
    h, v = args.hidden_size, args.vocab_size
    q = args.num_attention_heads * args.head_dim
    kvw = args.num_key_value_heads * args.head_dim
    kd = args.linear_num_key_heads * args.linear_key_head_dim
    vd = args.linear_value_dim
    inter = max(args.intermediate_size, args.moe_intermediate_size, args.shared_expert_intermediate_size)
    widest = max(q + kvw, 2 * kd, 2 * vd)
    att = max(q, vd)
    splits = max(8, args.num_experts_per_tok + 1)
    per_row = 4 * (3 * h + splits * h + 2 * widest + inter + 2 * att + q + v) + 2 * (h + att + inter) + 4 * 4096
    if args.is_moe:
        per_row += 4 * args.num_experts_per_tok * (args.moe_intermediate_size + 1) + 4 * (args.num_experts + 1)
    prefill_row = int(4 * (3 * h + 2 * widest + 2 * inter + 2 * att + q) * PREFILL_ROW_FACTOR)
    return rows * per_row + prefill_chunk * prefill_row


# Row counts of the smaller tensor-core prefill executors built beside a larger chunk (the rest of a
# prompt runs through them before the columns step); they share the largest one's fp16 scratch.
PREFILL_TAILS = (4096, 2048, 1024, 512, 256, 64)
# Prompt tokens per step of the columns graph (weights read once per chunk of 8; the rest of a prompt goes token
# by token): bit-identical to token-by-token on the device, 27B pp512 291 tok/s against 104.5 on the H200.
PREFILL_COLS = 8


# Dense models: the tensor-core prefill's GEMM weights dequantized to fp16 on a second stream ahead of their
# GEMMs (CudaQwen35Prefill), into this many fp16 buffers of the largest layer matrix.
PREFILL_DQ_BUFS = 3


MTP_PROMPT_ROWS = 512  # rows of the MTP head's tensor-core prompt chunk (engine.gpu.mtp_prompt.GEMM_ROWS)


def prefill_executor_bytes(args, cols: int = 0, gemm: int = 0) -> int:
    """The CUDA engine's prefill executors beside the decode step: the columns step (`cols` token rows of
    the same buffers) and the tensor-core chunk (`gemm` rows, one logits row, plus its fp16 copies of the
    largest layer matrix, the fp16 activations, the gate|up product and the chunked GDN's scratch). MoE
    models have no
    columns step; their chunk adds the router logits, the top-k, one expert's output rows and the
    gathered rows CuPy makes per expert (`_moe_chunk`). The tail executors (`PREFILL_TAILS`) add their
    own rows."""
    if args.is_moe:
        cols = 0
    total = workspace_bytes(args, cols) if cols > 1 else 0
    if gemm > cols:
        h = args.hidden_size
        inter = max(args.intermediate_size, args.moe_intermediate_size, args.shared_expert_intermediate_size)
        q = args.num_attention_heads * args.head_dim
        kvw = args.num_key_value_heads * args.head_dim
        vd = args.linear_value_dim
        widest = max(q + kvw, 2 * args.linear_num_key_heads * args.linear_key_head_dim, 2 * vd)
        logits_row = 4 * args.vocab_size
        total += workspace_bytes(args, gemm) - (gemm - 1) * logits_row
        if args.is_moe:  # fp16 weights of the largest matrix (bounded: the experts' are dequantized together)
            total += 2 * max(2 * inter, widest) * max(h, inter, q, vd)
        else:  # (every dense matrix has the hidden size on one side) times the buffers
            total += 2 * h * max(2 * inter, widest, q, vd) * PREFILL_DQ_BUFS
        total += 2 * gemm * max(h, inter, q, vd) + 4 * gemm * 2 * inter
        if args.num_hidden_layers > len(args.full_attention_layers):
            total += 4 * args.linear_num_value_heads * (2 * 128 * 64 + 64 * 64 + 64) * -(-gemm // 64)
        if args.is_moe:  # routing, the sorted pairs' rows (fp16 in, gate|up, fp16 SwiGLU, fp32 out; experts
            # padded to one row count: up to 1.5 rows a pair, CudaQwen35Prefill.MOE_PAD_WASTE), and
            e, k, ie = args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size  # every expert in fp16
            total += gemm * (4 * (e + 1) + 8 * (k + 1) + 16 * k + int(1.5 * k) * (6 * h + 10 * ie))
            total += max(0, 2 * e * 2 * ie * h - 2 * max(2 * inter, widest) * max(h, inter, q, vd))
        total += sum(workspace_bytes(args, t) - (t - 1) * logits_row for t in PREFILL_TAILS if cols < t < gemm)
    return total


def prefill_gather_bytes_per_token(args, cols: int = 0, gemm: int = 0) -> int:
    """Cache rows the tensor-core prefill's attention gathers, per token of context: none (its flash kernel reads
    the pages in place)."""
    return 0


def engine_prefill_executors() -> dict:
    """`plan_memory` keywords for the prefill executors the CUDA engine builds by default: the columns step;
    the tensor-core chunk reserves nothing (the engine builds it only in memory the plan leaves free)."""
    return {"prefill_cols": PREFILL_COLS, "prefill_gemm": 0}


# ---------------------------------------------------------------------------------- weights
def _component(name: str) -> str:
    """Component an object belongs to; the proposal (draft) head (bound as proposal/*, stored as text/draft_head* in
    the published files) loads apart."""
    if name.startswith(("text/draft_head", "proposal/")):
        return "draft_head"
    return name.split("/", 1)[0]


def _device_bytes(name: str, nbytes: int, shape) -> int:
    from engine.gpu.weights import is_vector  # noqa: PLC0415

    if shape and is_vector(name):  # norms, conv taps, gates: decoded to fp32 on upload
        return max(nbytes, 4 * math.prod(shape))
    return nbytes


def weights_from_artifact(artifact) -> dict[str, int]:
    """Device bytes per component from the artifact's object table (no tensor data is read).

    Packed matrices are uploaded as stored; vectors (norms, conv taps, gates) are decoded to fp32.
    """
    out: dict[str, int] = {}
    for o in artifact.objects.values():
        if o.kind == "tensor":
            comp = _component(o.id)
            out[comp] = out.get(comp, 0) + _device_bytes(o.id, o.bytes, o.shape)
    return out


def weights_from_inventory(inventory: dict) -> dict[str, int]:
    """Bytes per component from a published inventory JSON (`shared/data/inventory-*.json` form)."""
    out: dict[str, int] = {}
    for o in inventory["objects"]:
        if o.get("kind") == "tensor":
            comp = _component(o["name"])
            out[comp] = out.get(comp, 0) + _device_bytes(o["name"], int(o["bytes"]), o.get("shape"))
    return out


def weights_from_recipe(args, recipe: str) -> dict[str, int]:
    """Device bytes of the components that `engine.gpu.weights.synthetic` builds (same fused parents): text, and with
    an MTP head mtp and draft_head."""
    from engine.artifact.formats import encoded_size  # noqa: PLC0415
    from engine.gpu.weights import RECIPES, mtp_table  # noqa: PLC0415
    from engine.models.qwen3_5 import PROPOSAL_ROWS  # noqa: PLC0415

    if recipe not in RECIPES:
        raise NinferError(f"unknown recipe {recipe!r}", f"use one of {', '.join(RECIPES)}")
    table = RECIPES[recipe]

    def mat(role: str, n: int, k: int, tbl=None) -> int:
        fmt = (tbl or table)[role]
        return encoded_size(fmt, "contiguous_le_v1" if fmt == "bf16" else "row_split_k128_v1", (n, k))

    a, h = args, args.hidden_size
    q, kvw = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
    kd, vd, hv = a.linear_num_key_heads * a.linear_key_head_dim, a.linear_value_dim, a.linear_num_value_heads

    def layer(kind: str, t=None) -> int:
        total = 2 * 4 * h  # input and post-attention norms
        if a.is_moe:
            e, ie, si = a.num_experts, a.moe_intermediate_size, a.shared_expert_intermediate_size
            total += (mat("moe/router", e + 1, h, t) + mat("moe/experts/gate", e * 2 * ie, h, t)
                      + mat("moe/experts/down", e * h, ie, t) + mat("moe/shared/gate", 2 * si, h, t)
                      + mat("moe/shared/down", h, si, t))
        else:
            i = a.intermediate_size
            total += mat("mlp/gate", 2 * i, h, t) + mat("mlp/down", h, i, t)
        if kind == "full_attention":
            total += (mat("attention/query", q + kvw, h, t) + mat("attention/gate", q + kvw, h, t)
                      + mat("attention/output", h, q, t) + 2 * 4 * a.head_dim)
        else:
            total += (mat("gdn/query", 2 * kd, h) + mat("gdn/value", 2 * vd, h) + mat("gdn/a_projection", 2 * hv, h)
                      + mat("gdn/output", h, vd) + 4 * (a.linear_conv_kernel_dim * a.gdn_conv_channels
                                                        + 2 * hv + a.linear_value_head_dim))
        return total

    text = mat("text/token_embedding", a.vocab_size, h) + mat("text/output_head", a.vocab_size, h) + 4 * h
    out = {"text": text + sum(layer(kind) for kind in a.layer_types)}
    if a.mtp_num_hidden_layers:  # the MTP head: a full-attention block, its input projection and three norms
        fc = table.get("mtp/input_projection", "q8_g32_fp16")
        out["mtp"] = (layer("full_attention", mtp_table(table)) + encoded_size(fc, "row_split_k128_v1", (h, 2 * h))
                      + 3 * 4 * h)
        rows = min(PROPOSAL_ROWS, a.vocab_size)  # (and the proposal head beside it, with its token ids)
        out["draft_head"] = encoded_size(table.get("proposal/head", "q4_g64_fp16"), "row_split_k128_v1",
                                         (rows, h)) + 4 * rows
    return out


# ---------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class PlanItem:
    """One line of the plan: a name, its bytes, and how they were counted."""

    name: str
    bytes: int
    detail: str = ""


@dataclass(frozen=True)
class KVPool:
    """A paged pool growing with the context: bytes per token, and pages it gets beyond the context's."""

    name: str
    bytes_per_token: int
    extra_pages: int = 0


@dataclass(frozen=True)
class MemoryPlan:
    """Device bytes of one launch: `fixed` parts plus KV pools sized by the context, plus headroom."""

    model: str
    source: str
    kv: str
    lanes: int
    fixed: tuple[PlanItem, ...]
    pools: tuple[KVPool, ...]
    headroom: int = DEFAULT_HEADROOM
    max_positions: int = 262144
    notes: tuple[str, ...] = field(default=())

    @property
    def fixed_bytes(self) -> int:
        return sum(i.bytes for i in self.fixed)

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(p.bytes_per_token for p in self.pools)

    def pages(self, context: int) -> int:
        """Pages of the main pool: ceil(S / 64) per lane (each lane may hold a full context)."""
        return self.lanes * math.ceil(context / KV_PAGE)

    def kv_bytes(self, context: int) -> int:
        return sum((self.pages(context) + p.extra_pages) * KV_PAGE * p.bytes_per_token for p in self.pools)

    def needed(self, context: int) -> int:
        """Bytes allocated at `context` (weights, state, KV, workspace, graphs), headroom excluded."""
        return self.fixed_bytes + self.kv_bytes(context)

    def total(self, context: int) -> int:
        """Bytes that must be free before loading: `needed` plus the headroom."""
        return self.needed(context) + self.headroom

    def items(self, context: int) -> list[PlanItem]:
        """Every line at `context`: fixed parts, each KV pool, headroom (no total line)."""
        out = list(self.fixed)
        for p in self.pools:
            pages = self.pages(context) + p.extra_pages
            out.append(PlanItem(f"KV pool: {p.name}", pages * KV_PAGE * p.bytes_per_token,
                                f"{pages:,} pages x {KV_PAGE} tokens x {p.bytes_per_token:,} B ({self.kv})"))
        out.append(PlanItem("headroom", self.headroom, "kept free for the allocator and libraries"))
        return out

    def largest_context(self, free_bytes: int) -> int:
        """The largest page-aligned context whose total fits `free_bytes` (0 when nothing fits)."""
        room = free_bytes - self.total(0)
        per_page = sum(KV_PAGE * p.bytes_per_token for p in self.pools) * self.lanes
        if room < 0 or per_page <= 0:
            return 0 if room < 0 else self.max_positions
        return min(self.max_positions, (room // per_page) * KV_PAGE)

    def to_dict(self, context: int) -> dict:
        """JSON form at `context`."""
        return {"model": self.model, "source": self.source, "kv": self.kv, "lanes": self.lanes,
                "context": context, "kv_bytes_per_token": self.kv_bytes_per_token,
                "items": [{"name": i.name, "bytes": i.bytes, "detail": i.detail} for i in self.items(context)],
                "needed_bytes": self.needed(context), "total_bytes": self.total(context), "notes": list(self.notes)}


def plan_memory(args, weights: dict[str, int], *, model: str = "", source: str = "", kv: str = "bf16",
                lanes: int = 1, components=("text",), optional=(), spec: str | None = None, draft_tokens: int = 0,
                prefill_chunk: int = 0, state_slots_per_lane: int = 1, headroom: int = DEFAULT_HEADROOM,
                graph_pool: int = GRAPH_POOL, prefill_cols: int = 0, prefill_gemm: int = 0) -> MemoryPlan:
    """The plan of a Qwen3.5 hybrid launch.

    `weights` maps component ("text", "draft_head", "mtp", "dflash2", "dflash", "vision") to device
    bytes; `components` are counted (one the model lacks is an error), `optional` ones when present.
    `spec` "mtp" adds the MTP KV pool (one attention layer, `lanes * ceil((K-1)/64)` extra pages) and,
    like any spec mode, the ReplaySSM arena for K + 1 columns; "dflash"/"dflash2" add the draft's own
    fixed state. `prefill_cols` / `prefill_gemm` add the CUDA engine's prefill executors
    (`prefill_executor_bytes`; `PREFILL_COLS` and the automatic tensor-core chunk are what the engine builds).
    """
    kv_head_bytes(args.head_dim or 256, kv)  # validates kv
    if lanes < 1:
        raise NinferError(f"lanes must be at least 1, got {lanes}")
    fixed: list[PlanItem] = []
    for comp in components:
        if comp not in weights:
            have = ", ".join(sorted(weights)) or "none"
            raise NinferError(f"{model or 'the model'} has no {comp} weights (it has: {have})",
                              "pick a profile or flags that load only what the model has")
        fixed.append(PlanItem(f"weights: {comp}", int(weights[comp]), source))
    for comp in optional:
        if comp in weights and comp not in components:
            fixed.append(PlanItem(f"weights: {comp}", int(weights[comp]), source))
    slots = lanes * state_slots_per_lane
    if args.linear_num_value_heads:
        n_gdn = args.num_hidden_layers - len(args.full_attention_layers)
        fixed.append(PlanItem("GDN state slots", slots * gdn_slot_bytes(args),
                              f"{slots} slot(s) x {n_gdn} layers x fp32 {args.linear_num_value_heads}x"
                              f"{args.linear_value_head_dim}x{args.linear_key_head_dim} + conv history"))
    rows = lanes * (draft_tokens + 1 if spec else 1)
    fixed.append(PlanItem("activations/workspace", workspace_bytes(args, rows, prefill_chunk),
                          f"{rows} decode row(s), prefill chunk {prefill_chunk}"))
    pre = prefill_executor_bytes(args, prefill_cols, prefill_gemm)
    if pre:
        fixed.append(PlanItem("prefill executors", pre,
                              f"columns step of {prefill_cols} rows" + (f", tensor-core chunk of {prefill_gemm}"
                                                                        if prefill_gemm > prefill_cols else "")))
    pools = [KVPool("text", kv_bytes_per_token(args, kv))]
    if spec:
        columns = draft_tokens + 1
        if args.linear_num_value_heads:
            fixed.append(PlanItem("ReplaySSM arena", replay_arena_bytes(args, lanes, columns),
                                  f"{lanes} lane(s) x {columns} columns"))
        if spec == "mtp":  # (its pool's extra pages: the drafts' rows and the prompt chunk's padding)
            pools.append(KVPool("mtp", kv_bytes_per_token(args, kv, layers=1),
                                lanes * (math.ceil(max(draft_tokens - 1, 0) / KV_PAGE) + MTP_PROMPT_ROWS // KV_PAGE)))
            fixed.append(PlanItem("MTP prompt chunk", workspace_bytes(args, MTP_PROMPT_ROWS)
                                  + 16 * MTP_PROMPT_ROWS * args.hidden_size,
                                  f"the MTP head over {MTP_PROMPT_ROWS} prompt rows at a time"))
        elif spec in DRAFT_STATE:
            fixed.append(PlanItem(f"{spec} draft state", DRAFT_STATE[spec].fixed_bytes, DRAFT_STATE[spec].detail))
            if DRAFT_STATE[spec].full_bytes_per_token:
                pools.append(KVPool(f"{spec} full layer", DRAFT_STATE[spec].full_bytes_per_token))
    fixed.append(PlanItem("CUDA graph pool", graph_pool, "estimate"))
    return MemoryPlan(model=model, source=source, kv=kv, lanes=lanes, fixed=tuple(fixed), pools=tuple(pools),
                      headroom=headroom, max_positions=int(args.max_position_embeddings or LADDER[0]))


@dataclass(frozen=True)
class DraftState:
    fixed_bytes: int
    full_bytes_per_token: int
    detail: str


# model.md §1.7-1.8: DFlash keeps 5 cyclic 4096-slot layers (8 kv heads x 128, bf16 K+V) and one paged
# full layer; DFlash2 keeps a 2048-token ring over 5 layers (8 x 128).
DRAFT_STATE = {
    "dflash": DraftState(5 * 4096 * 8 * 128 * 2 * 2, 8 * 128 * 2 * 2, "5 cyclic layers x 4096 slots, bf16"),
    "dflash2": DraftState(5 * 2048 * 8 * 128 * 2 * 2, 0, "5 layers x 2048-token ring, bf16"),
}


# ---------------------------------------------------------------------------------- fitting
def ladder_for(plan: MemoryPlan, ladder=LADDER) -> list[int]:
    """The rungs a model can use, largest first: those within its max positions (and that maximum)."""
    rungs = sorted({r for r in ladder if r <= plan.max_positions}, reverse=True)
    if plan.max_positions < (ladder[0] if ladder else 0) and plan.max_positions not in rungs:
        rungs.insert(0, plan.max_positions)
    return rungs


def fit_context(plan: MemoryPlan, free_bytes: int, ladder=LADDER) -> int:
    """The largest rung of `ladder` whose total (headroom included) fits `free_bytes`.

    Raises NinferError with needed vs free when even the smallest rung does not fit.
    """
    rungs = ladder_for(plan, ladder)
    for r in rungs:
        if plan.total(r) <= free_bytes:
            return r
    smallest = rungs[-1] if rungs else KV_PAGE
    raise NinferError(
        f"{plan.model or 'the model'} does not fit: {gib(plan.total(smallest))} needed at context {smallest:,} "
        f"(weights and state {gib(plan.fixed_bytes)}, headroom {gib(plan.headroom)}), {gib(free_bytes)} free",
        "close other programs using the GPU, raise --vram-limit, or pick a smaller model")


def check_context(plan: MemoryPlan, context: int, free_bytes: int, *, ladder=LADDER,
                  int8_available: bool = "int8" in GPU_KV_FORMATS) -> None:
    """Raise NinferError when an explicit `context` does not fit, with needed vs free and what would."""
    if context > plan.max_positions:
        raise NinferError(f"context {context:,} is beyond the model's {plan.max_positions:,} positions",
                          f"use --ctx {plan.max_positions} or less")
    need = plan.total(context)
    if need <= free_bytes:
        return
    hints = []
    fits = plan.largest_context(free_bytes)
    if fits >= KV_PAGE:
        rung = next((r for r in ladder_for(plan, ladder) if plan.total(r) <= free_bytes), fits)
        hints.append(f"lower --ctx to {rung:,} or less")
    else:
        hints.append("lower --ctx")
    if plan.kv == "bf16":
        if int8_available:
            hints.append("use --kv int8 (half the KV bytes)")
        else:
            hints.append("--kv int8 would halve the KV bytes but is not implemented on the GPU yet")
    hints.append("close other programs using the GPU")
    raise NinferError(
        f"context {context:,} needs {gib(need)} ({gib(plan.fixed_bytes)} weights/state/workspace + "
        f"{gib(plan.kv_bytes(context))} KV + {gib(plan.headroom)} headroom), {gib(free_bytes)} free",
        "; ".join(hints))


def gib(n: int) -> str:
    """Bytes as GiB with two decimals (how plans and budgets print sizes)."""
    return f"{n / GIB:.2f} GiB"
