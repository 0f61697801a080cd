"""The decode plan: the kernel and form of every op of the CUDA step, chosen once when a model loads.

`build_plan` picks them from the model (its `ModelArgs` and the formats of its weights), the GPU class
(`Device`: compute capability, shared memory a block may take, multiprocessors), the KV format and an
optional override, and returns a frozen `DecodePlan` that the executors read and `ninfer env` prints.

* sm_90 (H100/H200) is the tuned class: the residual norm and the GDN delta rule + gated norm as
  thread-block-cluster kernels, programmatic dependent launch, the 211 KB attention forms (int8 KV: K and
  V codes straight into the MMAs).
* sm_80/86/89 (A100, RTX 3090/4090) take the generic kernels: the multi-block norms, the delta rule and
  the gated norm as two launches, the tensor-core attention form that fits their shared memory, the
  4-warp flash prefill and, where the chunked GDN prefill does not fit, the token-by-token recurrence.

The plan names the template instantiations it launches (`kernels`): the CUDA module compiles those only.
Experiments override fields through one variable, read when a plan is built (never at import):
NINFER_PLAN='{"norm": "residual_rmsnorm_mb5_1r", "branches": false}' or NINFER_PLAN=/path/to/plan.json.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import NinferError
from engine.gpu import kernel_names as KN

PLAN_ENV = "NINFER_PLAN"
FMT_IDS = {"q4_g64_fp16": 0, "q5_g64_fp16": 1, "q6_g64_fp16": 2, "q8_g32_fp16": 3}
ATTN_HEAD_DIM, GDN_HEAD_DIM = 256, 128
CLUSTER_NORM_CHUNKS = 8 * 32  # residual_rmsnorm_cl: 8 blocks a row, at most 32 chunks of 32 values a block
GDN_CL = "gdn_delta_gated_cl"
GDN_RAW = "gdn_delta_raw_rw<4>"
NORMS = ("residual_rmsnorm_cl", "residual_rmsnorm_mb2", "residual_rmsnorm_mb5_1r", "residual_rmsnorm_mb")


@dataclass(frozen=True)
class Device:
    """What the plan needs to know of a GPU."""

    cc: int  # compute capability, major * 10 + minor
    smem_optin: int  # dynamic shared memory one block may opt into, bytes
    sms: int  # multiprocessors
    name: str = ""

    @property
    def arch(self) -> str:
        return f"sm_{self.cc}"


# The classes a plan can be printed for without a GPU (`ninfer env --plan MODEL --gpu sm_86`).
DEVICES = {
    "sm_90": Device(90, 227 * 1024, 132, "H100/H200"),
    "sm_80": Device(80, 163 * 1024, 108, "A100"),
    "sm_86": Device(86, 99 * 1024, 82, "RTX 3090"),
    "sm_89": Device(89, 99 * 1024, 128, "RTX 4090"),
}


def current_device() -> Device:
    """The GPU CuPy runs on (compute capability, shared memory opt-in, multiprocessors)."""
    from engine.gpu import launch as K  # noqa: PLC0415

    return Device(K.compute_capability(), K.smem_optin(), K.sm_count(), K.device_name())


@dataclass(frozen=True)
class DecodePlan:
    """Every choice the CUDA executors make, for one model on one GPU class. Frozen: built once at load."""

    gpu: str  # "sm_90"
    tuned: bool  # the sm_90 class (clusters, PDL, the large attention forms)
    kv: str  # "bf16" or "int8"
    pdl: bool  # programmatic dependent launch (sm_90)
    branches: bool  # independent projections of a layer on two streams (a fork and a join in the graph)
    gemv_pair: bool  # two one-token GEMVs of one normed row as one gemv_rs_pre_pair grid
    norm: str  # the residual norm before each block (one of NORMS)
    attn: str  # the decode attention kernel
    attn_threads: int
    attn_smem: int
    gdn: str  # the delta rule (+ gated norm): gdn_delta_gated_cl, or gdn_delta_raw_rw<4> + gated_rmsnorm_chunks
    gdn_ab_in: bool  # gdn_delta_gated_cl computes the layer's a|b projection itself (bf16 weights)
    mlp_fused: bool  # dense MLP: post-attention norm + MLP (+ the o-projection) as one persistent launch
    moe_fused: bool  # MoE: post-attention norm + router + experts (+ the o-projection) as one persistent launch
    flash_warps: int  # warps a block of the prefill's flash attention
    gdn_scan: str  # the chunked GDN prefill's in-order pass, "" for the token-by-token recurrence
    cols: tuple[int, ...]  # token rows the GEMVs are compiled for (decode, the columns step)
    gemv: tuple[tuple[str, int, int, int, int, int, bool], ...]  # (fmt, N, K, rows, unroll, splits, pre2)
    kernels: tuple[str, ...]  # the template instantiations the module compiles

    def gemv_cfg(self) -> dict:
        """The GEMV table as GemvPlan's keywords, keyed by (format, N, K)."""
        return {(f, n, k): dict(rows=r, unroll=u, splits=s, pre2=p) for f, n, k, r, u, s, p in self.gemv}

    def describe(self) -> dict:
        """The plan as printable fields (the kernel list as its count)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("gemv", "kernels")}
        out["gemv"] = [f"{f} {n}x{k}: rows {r}, unroll {u}, splits {s}{', pre' if p else ''}"
                       for f, n, k, r, u, s, p in self.gemv] or ["no table entry: GemvPlan's defaults"]
        out["gdn_scan"] = self.gdn_scan or "none: the token-by-token recurrence"
        out["cols"] = list(self.cols)
        out["kernels"] = len(self.kernels)
        return out


# ---------------------------------------------------------------------------------- the choices
def attention_form(g: int, kv: str, dev: Device) -> tuple[str, int, int]:
    """(kernel, threads, dynamic shared memory) of the decode attention for query groups of g heads: the
    tensor-core kernel (attn_decode_mma) in the first form that fits the device's shared memory (int8 KV on
    the sm_90 class: raw K and V codes in the MMAs, 8 warps, 2 stages), else the split kernel."""
    kv8 = kv == "int8"
    if g in KN.ATTN_MMA_G:
        if kv8 and KN.attn_mma_smem(True, *KN.ATTN_MMA_FORMS[True][0]) <= dev.smem_optin:
            w, ns = KN.ATTN_MMA_VRAW_FORM
            return KN.attn_mma_vraw_name(g), 32 * w, KN.attn_mma_smem(True, w, ns, vraw=True)
        form = KN.attn_mma_form(kv8, dev.smem_optin)
        if form is not None:
            w, ns = form
            return f"attn_decode_mma<{g},{str(kv8).lower()},{w},{ns}>", 32 * w, KN.attn_mma_smem(kv8, w, ns)
    kv_t = str(kv8).lower()
    if (g // 2, 2) in KN.ATTN_GSPLIT and g % 2 == 0:  # (a KV head's query group over two blocks)
        return f"attn_decode_split<{g // 2},{kv_t},2>", 256, 0
    return f"attn_decode_split<{g},{kv_t}>", 256, 0


def norm_form(hidden: int, dev: Device) -> str:
    """The residual norm: the cluster form on sm_90 (rows of at most 8,192 values), else the multi-block form
    for the row's width."""
    kpad = -(-hidden // KN.XPAD) * KN.XPAD
    if dev.cc >= 90 and kpad // 32 <= CLUSTER_NORM_CHUNKS:
        return "residual_rmsnorm_cl"
    if hidden <= 2 * 1024:
        return "residual_rmsnorm_mb2"
    return "residual_rmsnorm_mb5_1r" if hidden <= 5 * 1024 else "residual_rmsnorm_mb"


def gdn_scan_form(hv: int, dev: Device) -> str:
    """The chunked GDN prefill's in-order pass on tensor cores: the largest RB whose Hv x 128 / RB blocks still fill
    70% of the multiprocessors and whose shared memory fits, else the next that fits; "" where none does (the RTX
    30/40 class: the token-by-token recurrence)."""
    if KN.GDN_PREP_SMEM > dev.smem_optin:
        return ""
    tc = sorted(KN.GDN_SCAN_TC_RB, reverse=True)
    auto = next((rb for rb in tc if hv * (128 // rb) >= 0.7 * dev.sms), tc[-1])
    rb = next((r for r in [auto] + tc if KN.gdn_scan_smem(r) <= dev.smem_optin), 0)
    return KN.gdn_scan_name(rb) if rb else ""


def flash_warps(dev: Device) -> int:
    """Warps a block of the flash prefill: 8 where their shared memory fits, else 4 (99 KB GPUs)."""
    return next(w for w in (8, 4) if KN.flash_smem(w) <= dev.smem_optin or w == 4)


def _mlp_fused_ok(args, fmts: dict) -> bool:
    """The dense persistent MLP's rules: q4 gate|up and q5 down (the groupwise-int recipe), rows of at most 8,192."""
    return (not args.is_moe and fmts.get("mlp/gate") == fmts.get("mlp/up") == "q4_g64_fp16"
            and fmts.get("mlp/down") == "q5_g64_fp16" and args.hidden_size <= 8 * 1024
            and KN.mlp_fused_vpt(args.hidden_size) > 0)


def _moe_fused_ok(args, fmts: dict) -> bool:
    """The MoE persistent launch's compiled formats: q4 / q5 routed experts, w8 shared expert, a bf16 router."""
    want = {"moe/experts/gate": "q4_g64_fp16", "moe/experts/up": "q4_g64_fp16", "moe/experts/down": "q5_g64_fp16",
            "moe/shared/gate": "q8_g32_fp16", "moe/shared/up": "q8_g32_fp16", "moe/shared/down": "q8_g32_fp16",
            "moe/router": "bf16"}
    return bool(args.is_moe and all(fmts.get(r) == f for r, f in want.items())
                and KN.moe_fused_vpt(args.hidden_size) > 0)


def projection_shapes(args, fmts: dict) -> set[tuple[str, int, int]]:
    """(format, N, K) of every GEMV of the decode step (the executor's fused parents: q|k, gate|v, v|z, gate|up)."""
    h, a = args.hidden_size, args
    f = lambda role: fmts.get(role, "q8_g32_fp16")  # noqa: E731
    q, kvw = a.num_attention_heads * ATTN_HEAD_DIM, a.num_key_value_heads * ATTN_HEAD_DIM
    kd, vd = 2 * a.linear_num_key_heads * GDN_HEAD_DIM, 2 * a.linear_num_value_heads * GDN_HEAD_DIM
    out = {(f("text/output_head") if "text/output_head" in fmts else f("text/token_embedding"), a.vocab_size, h)}
    kinds = set(a.layer_types)
    if "full_attention" in kinds:
        out |= {(f("attention/query"), q + kvw, h), (f("attention/gate"), q + kvw, h), (f("attention/output"), h, q)}
        if f("attention/query") == f("attention/gate"):
            out.add((f("attention/query"), 2 * (q + kvw), h))
    if kinds - {"full_attention"}:
        out |= {(f("gdn/query"), kd, h), (f("gdn/value"), vd, h), (f("gdn/output"), h, vd // 2),
                (f("gdn/a_projection"), 2 * a.linear_num_value_heads, h)}
        if f("gdn/query") == f("gdn/value"):
            out.add((f("gdn/query"), kd + vd, h))
    if a.is_moe:
        e, ie, si = a.num_experts, a.moe_intermediate_size, a.shared_expert_intermediate_size
        out |= {(f("moe/router"), e + 1, h), (f("moe/shared/gate"), 2 * si, h), (f("moe/shared/down"), h, si),
                (f("moe/experts/gate"), 2 * ie, h), (f("moe/experts/down"), h, ie)}
    else:
        out |= {(f("mlp/gate"), 2 * a.intermediate_size, h), (f("mlp/down"), h, a.intermediate_size)}
    return out


def kernel_names(p: DecodePlan, args, fmts: dict) -> tuple[str, ...]:
    """The template instantiations the executors launch under plan `p` (extern "C" kernels need no name)."""
    rs = sorted({FMT_IDS[f] for f in fmts.values() if f in FMT_IDS})
    ids = lambda *roles: sorted({FMT_IDS[fmts[r]] for r in roles if fmts.get(r) in FMT_IDS})  # noqa: E731
    names = KN.gemv_names(rs, p.cols, pair=p.gemv_pair and not args.is_moe, bf16="bf16" in fmts.values(),
                          conv=ids("gdn/query", "gdn/key", "gdn/value", "gdn/z"),
                          xs=ids("attention/output", "gdn/output"))
    emb = fmts.get("text/token_embedding", "bf16")
    names += [f"embed_rs<{FMT_IDS[emb]}>"] if emb in FMT_IDS else []
    names += [f"dequant_rs<{f}>" for f in rs]
    if "full_attention" in args.layer_types:
        names += [p.attn, f"attn_prefill_fa<{p.flash_warps},{str(p.kv == 'int8').lower()}>"]
    if set(args.layer_types) - {"full_attention"}:
        names += [GDN_RAW, "gdn_delta_rows<2>"] + ([p.gdn_scan] if p.gdn_scan else [])
    if p.mlp_fused:
        names += KN.mlp_fused_names(KN.mlp_fused_vpt(args.hidden_size))
    if args.is_moe:
        names += [KN.moe_down_name(FMT_IDS.get(fmts.get("moe/experts/down"), -1),
                                   FMT_IDS.get(fmts.get("moe/shared/down"), -1))]
        names += [KN.moe_fused_name(KN.moe_fused_vpt(args.hidden_size))] if p.moe_fused else []
    return tuple(n for n in dict.fromkeys(names) if n)


def build_plan(args, dev: Device, kv: str, fmts: dict, override: dict | None = None,
               cols: tuple[int, ...] = (1, 8)) -> DecodePlan:
    """The plan of model `args` (weights in formats `fmts`: role -> format) on `dev` with a `kv` cache; `override`
    (field -> value, e.g. from NINFER_PLAN) replaces chosen fields and is checked against what is compiled."""
    if dev.cc < 80:
        raise NinferError(f"the CUDA engine needs compute capability 8.0 or newer (this GPU: {dev.cc / 10:.1f})",
                          "run on the CPU with NINFER_DEVICE=cpu")
    g = args.num_attention_heads // max(args.num_key_value_heads, 1)
    attn, warps, smem = attention_form(g, kv, dev)
    tuned = dev.cc >= 90
    gdn = GDN_CL if tuned else GDN_RAW
    h = args.hidden_size
    ab_in = gdn == GDN_CL and fmts.get("gdn/a_projection") == "bf16" and h % 8 == 0 and h <= 8192
    shapes = projection_shapes(args, fmts)
    gemv = tuple(sorted((f, n, k, c["rows"], c["unroll"], c["splits"], bool(c.get("pre2")))
                        for (f, n, k), c in KN.GEMV_TABLE.items() if (f, n, k) in shapes))
    plan = DecodePlan(gpu=dev.arch, tuned=tuned, kv=kv, pdl=tuned, branches=True, gemv_pair=True,
                      norm=norm_form(h, dev), attn=attn, attn_threads=warps, attn_smem=smem, gdn=gdn, gdn_ab_in=ab_in,
                      mlp_fused=_mlp_fused_ok(args, fmts), moe_fused=_moe_fused_ok(args, fmts),
                      flash_warps=flash_warps(dev), gdn_scan=gdn_scan_form(args.linear_num_value_heads or 1, dev),
                      cols=(1,) if args.is_moe else tuple(cols), gemv=gemv, kernels=())  # (MoE: no columns step)
    if override:
        plan = _apply(plan, override, dev, args)
    return dataclasses.replace(plan, kernels=kernel_names(plan, args, fmts))


def _refuse(what: str, hint: str = "") -> None:
    raise NinferError(f"{PLAN_ENV}: {what}", hint or "run `ninfer env --plan GEOMETRY` for the fields and their values")


def _apply(plan: DecodePlan, override: dict, dev: Device, args) -> DecodePlan:
    """`plan` with the fields of `override` replaced, each checked for its type and for what the GPU and the model can
    run. An attention kernel named alone brings its threads and shared memory (attn_launch)."""
    fields = {f.name for f in dataclasses.fields(plan)} - {"kernels", "gpu", "tuned"}
    bad = sorted(set(override) - fields)
    if bad:
        _refuse(f"no plan field {', '.join(bad)}", f"use some of: {', '.join(sorted(fields))}")
    changes = {}
    for k, v in override.items():
        cur = getattr(plan, k)
        if k in ("cols", "gemv"):
            v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        elif type(v) is not type(cur):
            _refuse(f"{k} takes a {type(cur).__name__}, not {v!r}")
        changes[k] = v
    h, kv8 = args.hidden_size, plan.kv == "int8"
    norm = changes.get("norm", plan.norm)
    widest = {"residual_rmsnorm_mb2": 2048, "residual_rmsnorm_mb5_1r": 5120, "residual_rmsnorm_mb": 8192,
              "residual_rmsnorm_cl": CLUSTER_NORM_CHUNKS * 32}
    if norm not in NORMS:
        _refuse(f"norm {norm!r} is not a residual norm", f"use one of {', '.join(NORMS)}")
    row = -(-h // KN.XPAD) * KN.XPAD if norm == "residual_rmsnorm_cl" else h  # (the cluster form: whole blocks)
    if row > widest[norm]:
        _refuse(f"{norm} takes rows of at most {widest[norm]:,} values, not {h:,}")
    if dev.cc < 90 and (norm == "residual_rmsnorm_cl" or changes.get("gdn") == GDN_CL):
        _refuse(f"the cluster kernels need sm_90 (this GPU: {dev.arch})")
    if changes.get("gdn", plan.gdn) not in (GDN_CL, GDN_RAW):
        _refuse(f"gdn {changes['gdn']!r} is not a delta-rule kernel", f"use {GDN_CL} or {GDN_RAW}")
    if "attn" in changes:
        name, g = changes["attn"], args.num_attention_heads // max(args.num_key_value_heads, 1)
        if name not in KN.attn_names():
            _refuse(f"attention kernel {name!r} is not one the module can compile")
        if KN.attn_group(name) != g or (",true" in name) != kv8:
            _refuse(f"{name} is not for {g} query heads a KV head and a {plan.kv} cache")
        threads, smem = KN.attn_launch(name)
        if smem > dev.smem_optin:
            _refuse(f"{name} takes {smem:,} bytes of shared memory, the GPU {dev.smem_optin:,}")
        changes.setdefault("attn_threads", threads)
        changes.setdefault("attn_smem", smem)
    if changes.get("gdn_scan", plan.gdn_scan) not in ("",) + tuple(KN.gdn_scan_name(rb) for rb in KN.GDN_SCAN_TC_RB):
        _refuse(f"gdn_scan {changes['gdn_scan']!r} is not an in-order pass", "\"\" is the token-by-token recurrence")
    if changes.get("flash_warps", plan.flash_warps) not in (4, 8) or KN.flash_smem(
            changes.get("flash_warps", plan.flash_warps)) > dev.smem_optin:
        _refuse(f"flash_warps {changes.get('flash_warps')!r}: 4, or 8 where its shared memory fits")
    plan = dataclasses.replace(plan, **changes)
    if plan.gdn != GDN_CL and plan.gdn_ab_in:
        plan = dataclasses.replace(plan, gdn_ab_in=False)
    return plan


def env_override() -> dict | None:
    """NINFER_PLAN: a JSON object, or the path of a file holding one; None when unset."""
    raw = os.environ.get(PLAN_ENV, "").strip()
    if not raw:
        return None
    try:
        text = raw if raw.startswith("{") else Path(raw).read_text()
        out = json.loads(text)
    except (OSError, ValueError) as e:
        raise NinferError(f"{PLAN_ENV}: not a JSON object or a readable JSON file ({e})",
                          "e.g. NINFER_PLAN='{\"branches\": false}'") from None
    if not isinstance(out, dict):
        raise NinferError(f"{PLAN_ENV}: not a JSON object", "e.g. NINFER_PLAN='{\"branches\": false}'")
    return out


def formats_of(weights: dict) -> dict:
    """role -> format of the target's matrices in a device weight mapping (the `DevMatrix` values under text/; the
    MTP head's, stored in q8, name the same roles and must not decide the target's plan)."""
    from engine.gpu.weights import role  # noqa: PLC0415

    return {role(name): m.fmt for name, m in weights.items() if hasattr(m, "fmt") and name.startswith("text/")}


def plan_for(args, weights: dict, kv: str, dev: Device | None = None) -> DecodePlan:
    """The plan a load takes: the model's weights on this GPU (or `dev`), with NINFER_PLAN applied."""
    return build_plan(args, dev or current_device(), kv, formats_of(weights), env_override())


def plan_for_recipe(args, recipe: str, kv: str = "bf16", dev: Device | str = "sm_90") -> DecodePlan:
    """The plan of a model stored in `recipe` (engine.gpu.weights.RECIPES) on a GPU class, without a GPU."""
    from engine.gpu.weights import RECIPES  # noqa: PLC0415

    if isinstance(dev, str):
        if dev not in DEVICES:
            raise NinferError(f"unknown GPU class {dev!r}", f"use one of {', '.join(DEVICES)}")
        dev = DEVICES[dev]
    fmts = dict(RECIPES[recipe])
    if "text/output_head" not in fmts or args.tie_word_embeddings:
        fmts.pop("text/output_head", None)
    return build_plan(args, dev, kv, fmts, env_override())
