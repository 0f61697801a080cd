"""Which template instantiations of the CUDA kernels are compiled: the variant tables (rows a warp, loads in flight,
query groups, formats, ...) that the executor and the tests pick from, and the name expressions of the modules
(`names`). engine.ops.kernels compiles and launches them and re-exports every table, so `kernels.X` still reads
here; what a test patches on `kernels` (ATTN_MMA_AUTO, MLP_FUSED_CHUNKS, ...) is read through `kernels`."""
from __future__ import annotations

import os

GEMV_ROWS = (1, 2, 4)
GEMV_CONV_ROWS = (1, 2)  # rows a warp of the conv-epilogue GEMVs (GemvPlan takes 2 for any other)
GEMV_UNROLL = (2, 4)  # 8 was never the best in the sweep; fewer variants compile faster
GEMV_M = (1, 2, 8)
# moe_down<routed fmt, shared fmt, rows a half-warp, int16 pairs> (the MoE decode's down-projections, cuda/moe.cu):
# any routed format with a q5 or w8 shared expert, rows 2 / 4, fp32 or int16 products; rows 3 for q5 + w8 (the
# 35B-A3B's)
MOE_DOWN_ROWS = (2, 3, 4)
MOE_DOWN_NAMES = tuple(dict.fromkeys(
    [f"moe_down<{fr},{fs},{r},{i16}>" for fr in range(4) for fs in (1, 3) for r in (2, 4) for i16 in ("false", "true")]
    + [f"moe_down<1,3,3,{i16}>" for i16 in ("false", "true")]))
# gemv_mma (tensor-core MMA, q4/q5, pre-staged x, 1-8 token columns): (tiles of 16 rows, warps splitting K
# within a block, groups loaded per round) variants compiled
# (measured slower than gemv_rs on every 27B shape, also through a cp.async ring: bench/NOTES-decode.md,
# session 4; kept as the base of the MMA route, not in the tuning table)
GEMV_MMA = ((1, 4, 2), (1, 8, 2), (2, 4, 2), (1, 4, 4), (1, 8, 8))
# gemv_rs_async (weights streamed through a per-warp shared-memory ring): formats q4-q6, pre-staged x
GEMV_ASYNC_STAGES = (3, 4)
GEMV_ASYNC_M = (1,)
ATTN_GROUPS = (1, 2, 3, 4, 6, 8)
# Tokens a warp a round of attn_decode_tt (their loads in flight together; attn_decode_split takes one):
# CudaQwen35.ATTN_TT picks one.
ATTN_TT = (4,)
# attn_decode_split<G, KV8, GS>: a KV head's G GS query heads over GS blocks of G (CudaQwen35.ATTN_GSPLIT)
ATTN_GSPLIT = ((3, 2), (4, 2), (2, 4))
# attn_decode_mma<G, KV8, W, NS> (cuda/attn_decode_mma.cu; CudaQwen35.ATTN_MMA): query groups compiled; its
# forms (W warps a block, NS stages a warp) by int8 KV or not, the first whose shared memory fits the device
# runs: the H100/H200 form (211,200 bytes), an A100-class one (143,616), a 99 KB consumer-GPU one (84,480 /
# 76,032: NS 1, each round loaded then used).
ATTN_MMA_G = (6, 8)
ATTN_MMA_FORMS = {True: ((4, 4), (4, 2), (3, 1)), False: ((4, 3), (4, 2), (4, 1))}


# attn_decode_mma's raw-K int8 forms (KRAW: a warp's fp16 tile is V's alone, ADM_SMEM_KR), where the first int8 form
# of ATTN_MMA_FORMS fits: (W, NS) by CudaQwen35.ATTN_KRAW_FORM; the first is that form's (W 4, NS 4, 177,408 bytes),
# the others spend the room the K tile left on warps (211,200 / 211,200 / 219,648 bytes).
ATTN_MMA_KRAW_FORMS = ((4, 4), (6, 3), (8, 2), (5, 4))


# ... and with V's codes into the MMAs too (VRAW: no fp16 tile at all, ADM_SMEM_VR), by CudaQwen35.ATTN_VRAW
ATTN_MMA_VRAW_FORMS = ((8, 3), (8, 2))


def attn_mma_vraw_name(g: int, form: int = 0) -> str:
    """attn_decode_mma's raw-K, raw-V int8 form number `form` of ATTN_MMA_VRAW_FORMS."""
    w, ns = ATTN_MMA_VRAW_FORMS[form]
    return f"attn_decode_mma<{g},true,{w},{ns},true,true>"


# attn_decode_mma_t<G, W, NS, MINB> (the transposed int8 form: tokens as the MMAs' rows, the query heads one n8 tile;
# CudaQwen35.ATTN_TR): (W warps, NS stages, MINB blocks an SM), shared memory ADT_SMEM (kernels.attn_mma_t_smem)
ATTN_MMA_T_FORMS = ((8, 2, 1), (4, 3, 2), (6, 2, 2), (8, 1, 2), (4, 2, 3))


def attn_mma_t_name(g: int, form: int) -> str:
    w, ns, minb = ATTN_MMA_T_FORMS[form]
    return f"attn_decode_mma_t<{g},{w},{ns},{minb}>"


def attn_mma_kraw_name(g: int, form: int = 0) -> str:
    """attn_decode_mma's raw-K int8 form (KRAW: the codes into the MMAs, scales on the scores) number `form` of
    ATTN_MMA_KRAW_FORMS."""
    w, ns = ATTN_MMA_KRAW_FORMS[form]
    return f"attn_decode_mma<{g},true,{w},{ns},true>"


GDN_DELTA_ROWS = (2, 4)  # state rows a warp of gdn_delta_rows (the prefill's GDN recurrence)
# the chunked GDN prefill (gdn_chunk_prep, gdn_chunk_scan<RB> / gdn_chunk_scan_tc<RB>): state rows a block
# of the in-order pass, and the dynamic shared memory (GDN_PREP_SMEM in cuda/gdn_tc.cu, GDN_SCAN_TC_SMEM in
# cuda/gdn_tc_scan.cu, GDN_SCAN_SMEM in cuda/gdn_chunked.cu)
GDN_SCAN_RB = (16, 32, 64)
GDN_SCAN_TC_RB = (32, 64)  # one block an SM either way: 64 (96 blocks) fills the 27B's GPU in one wave
GDN_DELTA_RW = (2, 4)  # gdn_delta_raw_rw<RW>: state rows a warp (cuda/gdn.cu)

# The staged GEMV input of the q4/q5/q6 formats: int16 pairs and the dp2a decode (1), or fp16 pairs and the
# magic-number decode (0). Read once at import: every module of a process must agree (the producers stage
# what the GEMVs read). gemv_mma (experimental) reads fp16 pairs only.
# Session 11 on the H200 (a process a mode, twice each): 27B 129.7 -> 140.1 tok/s, 35B-A3B 341 -> 349; the GEMV,
# engine and prefill tests pass with it (bench/NOTES-decode.md).
XI16 = os.environ.get("NINFER_XI16", "1") != "0"
# With int16 pairs the w8 GEMVs read the pre-staged x too (gemv_rs_pre<3, ...>, dot_w8_i16) instead of staging
# x per block from fp32 (NINFER_W8_PRE=0: as before). Session 11 on the H200 (a process a mode, twice): 35B-A3B
# 352 -> 384.7 tok/s (its projections are w8), 27B unchanged (146.9 / 146.6, the head).
W8_PRE = XI16 and os.environ.get("NINFER_W8_PRE", "1") != "0"


# GEMV variants under measurement (bench/NOTES-decode.md), not in the tuning table: compiled into a second
# module on first use, so the engine's first run does not wait for them. The gemv_rs_pre (rows, unroll)
# pairs of GEMV_PRE_MAIN are in the table and compile with the engine's module.
GEMV_PRE_MAIN = ((1, 2), (2, 2))
# gemv_rs_pre<fmt, rows, 1, unroll, false, true>: x with a scale a 32-value chunk (q4-q6, one token)
# gemv_rs_pre_pair<FA, RA, FB, RB, CONV, MINB> (two one-token GEMVs of the same x in one grid, GemvPlan.pair): the 27B's
# GDN v|z (q5, a row a warp) + q|k (q4, two rows or one) with the conv epilogue, its attention gate|v (q5) + q|k (q4)
GEMV_PAIR_NAMES = ("gemv_rs_pre_pair<1,1,0,2,true,4>", "gemv_rs_pre_pair<1,1,0,1,true,5>",
                   "gemv_rs_pre_pair<1,2,0,2,false,4>")
GEMV_PRE_XS_NAMES = tuple(f"gemv_rs_pre<{f},{r},1,{u},false,true>" for f in range(3) for r, u in GEMV_PRE_MAIN)
EXPERIMENTAL = ("gemv_rs_pre<", "gemv_rs_async<", "gemv_mma<", "gemv_tma<")
# gemv_tma<fmt, NW> (cuda/gemv_tma.cu, sm_90: weights by bulk copies through a ring of shared-memory stages,
# one block an SM, NW consumer warps and a producer warp): consumer warps compiled. Measured slower than
# gemv_rs_pre on the 27B's big shapes (session 13): in no tuning entry; CudaQwen35.MLP_TMA (off) uses it.
GEMV_TMA_NW = (8, 16)
# mlp_fused<gate|up fmt, down fmt, down rows a warp, norm values a thread> (cuda/mlp_fused.cu: the post-attention
# norm and the dense MLP in one persistent launch, CudaQwen35.MLP_FUSED): the groupwise-int recipe's q4 gate|up and
# q5 down; hidden sizes up to 1,024 VPT (VPT 5: the 27B's 5,120; 1: the tests' small models)
MLP_FUSED_VPT = (1, 2, 5, 8)
MLP_FUSED_CHUNKS = 16  # (cuda/mlp_fused.cu MLP_CHUNKS: 32-value chunks a block of the chunk-scaled down input)
MLP_FUSED_NAMES = tuple(f"mlp_fused<0,1,1,{v}{c}>" for v in MLP_FUSED_VPT for c in ("", ",true")) + tuple(
    f"mlp_fused<0,1,1,{v}{c}>" for v in (1, 5) for c in ((",true,true", ",true,true,true") if v == 1 else ())
    + (",true,true,true,3",))
# moe_fused<routed gate|up fmt, routed down fmt, shared gate|up fmt, shared down fmt, norm values a thread, down rows a
# half-warp> (cuda/moe_fused.cu: the MoE block of one token in one persistent launch, CudaQwen35.MOE_FUSED): the
# groupwise-int-moe recipe's q4 / q5 routed experts and w8 shared expert; VPT 2 for the 35B-A3B's 2,048, 1 for the tests'
MOE_FUSED_VPT = (1, 2)
MOE_FUSED_DR = (2, 3)
MOE_FUSED_CHUNKS = 16  # (cuda/moe_fused.cu MOE_CHUNKS: routed 32-value chunks a block)
MOE_FUSED_OT = 4  # (cuda/moe_fused.cu MOE_OT: the o-projection's chunks a lane a slice)
MOE_FUSED_NAMES = tuple(f"moe_fused<0,1,3,3,{v},{r}>" for v in MOE_FUSED_VPT for r in MOE_FUSED_DR)
# (down rows 2 spill; ",true": the chunk-scaled down input; ",true,true": with the o-projection first, MLP_FUSED_O; a
# third: the norm's x and weight before its barrier, MLP_FUSED_XW; a last 3: the o-projection's loads a lane in flight,
# MLP_FUSED_OU. The o-projection forms for the 27B's hidden size (VPT 5) and the tests' (1) only, the A/B-only ones for
# the tests': each instantiation adds to the module's first compile. The down's loads 3 / 4 a lane in flight lost, s16c)


# the one-token register GEMVs compiled with weight loads through L1 (kernels.module_ldg, kernel("ldg:NAME"))
LDG_NAMES = tuple([f"gemv_rs<{f},{r},1,2>" for f in range(4) for r in GEMV_ROWS]
                  + [f"gemv_rs_pre<{f},{r},1,{u}>" for f in range(3) for r, u in GEMV_PRE_MAIN])


def names(experimental: bool = False) -> list[str]:
    """The name expressions of the engine's module (or, experimental, of the module of EXPERIMENTAL variants)."""
    if experimental:
        names = [f"gemv_rs_pre<{f},{r},{m},{u}>" for f in range(3) for r in GEMV_ROWS for m in GEMV_M
                 for u in GEMV_UNROLL if (r, u) not in GEMV_PRE_MAIN]
        names += [f"gemv_rs_async<{f},{r},{m},{st}>" for f in range(3) for r in GEMV_ROWS for m in GEMV_ASYNC_M
                  for st in GEMV_ASYNC_STAGES]
        names += [f"gemv_mma<{f},{t},{kw},{u}>" for f in range(2) for t, kw, u in GEMV_MMA]
        names += [f"gemv_tma<{f},{nw}>" for f in range(3) for nw in GEMV_TMA_NW] if XI16 else []
        return names
    names = [f"gemv_rs<{f},{r},{m},{u}>" for f in range(4) for r in GEMV_ROWS for m in GEMV_M for u in GEMV_UNROLL]
    pre_f = range(4 if XI16 else 3)  # w8 reads pre-staged pairs when they are int16
    names += [f"gemv_rs_pre<{f},{r},{m},{u}>" for f in pre_f for r, u in GEMV_PRE_MAIN for m in GEMV_M]
    # the GDN projections' conv epilogue (EPI_CONV), one token: gemv_rs / gemv_rs_pre<..., true>
    names += [f"gemv_rs<{f},{r},1,{u},true>" for f in range(4) for r in GEMV_CONV_ROWS for u in GEMV_UNROLL]
    names += [f"gemv_rs_pre<{f},{r},1,{u},true>" for f in pre_f for r, u in GEMV_PRE_MAIN]
    names += [f"gdn_delta_raw_rw<{rw}>" for rw in GDN_DELTA_RW]  # (state rows a warp, GdnOps.GDN_DELTA_RW)
    names += list(GEMV_PRE_XS_NAMES)  # (x with a scale a 32-value chunk: the GDN o-projection, GATED_CHUNK)
    names += list(GEMV_PAIR_NAMES)  # (two GEMVs of one x in one grid: gemv_plan.pair_launch, CudaQwen35.GEMV_PAIR)
    names += [f"gemv_bf16<{m}>" for m in GEMV_M]
    names += list(MOE_FUSED_NAMES) if XI16 else []  # (the MoE block's persistent launch, cuda/moe_fused.cu)
    names += list(MLP_FUSED_NAMES) if XI16 else []  # (the dense MLP's persistent launch, cuda/mlp_fused.cu)
    names += [f"router_route<{m}>" for m in GEMV_M]
    names += list(MOE_DOWN_NAMES)
    names += [f"embed_rs<{f}>" for f in range(4)]
    names += [f"dequant_rs<{f}>" for f in range(4)]
    names += [f"attn_decode_split<{g},{kv8}>" for g in ATTN_GROUPS for kv8 in ("false", "true")]
    names += [f"attn_decode_tt<{g},{kv8},{tt}>" for g in ATTN_GROUPS for kv8 in ("false", "true") for tt in ATTN_TT]
    names += [f"attn_decode_split<{g},{kv8},{gs}>" for g, gs in ATTN_GSPLIT for kv8 in ("false", "true")]
    names += [f"attn_decode_mma<{g},{str(kv8).lower()},{w},{ns}>" for g in ATTN_MMA_G for kv8 in (False, True)
              for w, ns in ATTN_MMA_FORMS[kv8]]
    names += [attn_mma_kraw_name(g, f) for g in ATTN_MMA_G for f in range(len(ATTN_MMA_KRAW_FORMS))]  # raw-K int8
    names += [attn_mma_vraw_name(g, f) for g in ATTN_MMA_G for f in range(len(ATTN_MMA_VRAW_FORMS))]  # and raw V
    names += [attn_mma_t_name(g, f) for g in ATTN_MMA_G for f in range(len(ATTN_MMA_T_FORMS))]  # transposed
    names += [f"gdn_delta_rows<{r}>" for r in GDN_DELTA_ROWS]
    names += [f"gdn_chunk_scan<{rb}>" for rb in GDN_SCAN_RB]
    names += [f"attn_prefill_fa<{w},{kv8}>" for w in (4, 8) for kv8 in ("false", "true")]  # warps, int8 KV
    return names
