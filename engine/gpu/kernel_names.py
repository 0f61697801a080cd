"""The template instantiations of the CUDA kernels and the sizes the launchers share with the sources: the forms a
plan picks from (engine.gpu.plan), each family's name expressions, and the dynamic shared memory of the kernels
that take it (the CUDA macros' sizes, written once here). engine.gpu.launch re-exports them."""
from __future__ import annotations

from engine.gpu.gemv_tuning import H200 as GEMV_TABLE  # noqa: F401  (the plan's GEMV table)
from engine.gpu.gemv_tuning import H200_TC as GEMV_TC_TABLE

# Pre-staged GEMV input rows (slot-major blocks of 32 chunks of 16-bit pairs) are padded to this many values.
XPAD = 1024
GEMV_CONV_ROWS = (1, 2)  # rows a warp of the conv-epilogue GEMVs (GemvPlan takes 2 for any other)
# gemv_rs_pre (rows, unroll): the forms of the tuning table; w8 (pre-staged int16 pairs) takes them too
GEMV_PRE_MAIN = ((1, 2), (2, 2))
# gemv_rs_pre_pair<FA, RA, FB, RB, CONV, MINB> (two one-token GEMVs of the same x in one grid, gemv.pair_launch):
# the 27B's GDN v|z (q5, a row a warp) + q|k (q4, two rows or one) with the conv epilogue, its attention gate|v (q5) +
# q|k (q4)
GEMV_PAIR_NAMES = ("gemv_rs_pre_pair<1,1,0,2,true,4>", "gemv_rs_pre_pair<1,1,0,1,true,5>",
                   "gemv_rs_pre_pair<1,2,0,2,false,4>")
# gemv_rs_pre<fmt, rows, 1, 2, false, true>: x with a scale a 32-value chunk (q4-q6, one token)
GEMV_PRE_XS_NAMES = tuple(f"gemv_rs_pre<{f},{r},1,{u},false,true>" for f in range(3) for r, u in GEMV_PRE_MAIN)


# gemv_tc<FMT, M, GU, S[, PK]> (cuda/gemv_tc.cu): M = 2..8 token columns on the int8 tensor cores, GU groups a warp's
# run of copies, S runs a warp's ring of shared memory holds (S - 1 in flight); PK: x from its packed twin (q4-q6, up
# to GEMV_TC_PK_COLS columns: one MMA a step, the producers having split x into its high and low bytes)
GEMV_TC_GU = 2
GEMV_TC_STAGES = 4
GEMV_TC_PK_COLS = 4


# the row-split formats' ids in the kernels' FMT template argument (gemv_decode.cu FMT_Q4..FMT_W8)
FMT_IDS = {"q4_g64_fp16": 0, "q5_g64_fp16": 1, "q6_g64_fp16": 2, "q8_g32_fp16": 3}


def gemv_tc_form(fmt: str, n: int, k: int) -> tuple:
    """(groups a run, ring stages, warps a tile or None: gemv.tc_warps' rule[, split-K slices of its planes]) of gemv_tc
    for a [n, k] matrix of format `fmt`: the tuning table's, else the default."""
    return GEMV_TC_TABLE.get((fmt, n, k), (GEMV_TC_GU, GEMV_TC_STAGES, None))


def gemv_tc_name(fmt: int, m: int, gu: int | None = None, stages: int | None = None, pk: bool = False) -> str:
    return f"gemv_tc<{fmt},{m},{gu or GEMV_TC_GU},{stages or GEMV_TC_STAGES}{',true' if pk else ''}>"


def gemv_tc_packs(fmt: int, m: int) -> bool:
    """Whether gemv_tc reads x from the packed twin for format id `fmt` at m columns (where the producers write one)."""
    return fmt != FMT_IDS["q8_g32_fp16"] and 1 < m <= GEMV_TC_PK_COLS


def gemv_tc_names(fmt: int, m: int) -> list[str]:
    """Every gemv_tc form of format id `fmt` for m columns: the default and the tuning table's, each also on the packed
    twin where it takes one."""
    forms = [(GEMV_TC_GU, GEMV_TC_STAGES)] + [f[:2] for (name, _, _), f in GEMV_TC_TABLE.items() if FMT_IDS[name] == fmt]
    packs = (False, True) if gemv_tc_packs(fmt, m) else (False,)
    return [gemv_tc_name(fmt, m, gu, st, pk) for gu, st in dict.fromkeys(forms) for pk in packs]


def gemv_tc_stage_bytes(fmt: int, gu: int) -> int:
    """Shared bytes of one stage of gemv_tc's ring (TcStage): a run of gu groups of a 16-row tile, codes (32 bytes a
    group a row), high bits (q5 8, q6 16), scales (2)."""
    return 16 * gu * (32 + {1: 8, 2: 16}.get(fmt, 0) + 2)


def gemv_names(fmts, cols=(1, 8), pair: bool = True, bf16: bool = True, conv=None, xs=None) -> list[str]:
    """The GEMVs of row-split formats `fmts` (ids) for token rows `cols`: the register kernel and the pre-staged one
    (rows 1 and 2, unroll 2), their conv-epilogue forms (one token; formats `conv`, default all), the chunk-scaled
    one (formats `xs`), the pairs, bf16."""
    fmts = list(fmts)
    conv = fmts if conv is None else list(conv)
    xs = fmts if xs is None else list(xs)
    one = [1] if 1 in cols else []  # (more columns take gemv_tc)
    names = [f"gemv_rs<{f},{r},{m},2>" for f in fmts for r in (1, 2) for m in one]
    names += [f"gemv_rs_pre<{f},{r},{m},{u}>" for f in fmts for r, u in GEMV_PRE_MAIN for m in one]
    names += [f"gemv_rs<{f},{r},1,2,true>" for f in conv for r in GEMV_CONV_ROWS]
    names += [f"gemv_rs_pre<{f},{r},1,{u},true>" for f in conv for r, u in GEMV_PRE_MAIN]
    names += [n for n in GEMV_PRE_XS_NAMES if int(n[12]) in xs]
    names += [n for n in GEMV_PAIR_NAMES if pair and {0, 1} <= set(fmts)]
    names += [n for f in fmts for m in cols if 1 < m <= 8 for n in gemv_tc_names(f, m)]
    names += [f"gemv_bf16<{m}>" for m in cols] if bf16 else []
    return names


# ---- decode attention
ATTN_GROUPS = (1, 2, 3, 4, 6, 8)  # query heads a KV head the split kernel is compiled for
# attn_decode_split<G, KV8, GS>: a KV head's G GS query heads over GS blocks (the 27B's 6 heads: 3 a block)
ATTN_GSPLIT = ((3, 2), (4, 2))
# attn_decode_mma<G, KV8, W, NS> (cuda/attn_decode_mma.cu): query groups compiled; its forms (W warps a block, NS
# stages a warp) by int8 KV or not, the first whose shared memory fits the device runs: the H100/H200 form (211,200
# bytes), an A100-class one (143,616), a 99 KB consumer-GPU one (84,480 / 76,032: NS 1, each round loaded then used).
ATTN_MMA_G = (6, 8)
ATTN_MMA_FORMS = {True: ((4, 4), (4, 2), (3, 1)), False: ((4, 3), (4, 2), (4, 1))}
# int8 KV where the first int8 form fits (the sm_90 class): K's and V's codes straight into the MMAs
# (attn_decode_mma<G, true, W, NS, true, true>, no fp16 tile), 8 warps, 2 stages (ADM_SMEM_VR)
ATTN_MMA_VRAW_FORM = (8, 2)


def attn_mma_smem(kv8: bool, w: int, ns: int, vraw: bool = False) -> int:
    """Dynamic shared memory of attn_decode_mma<G, kv8, w, ns> (ADM_SMEM_OF; vraw: ADM_SMEM_VR): the Q tile, then per
    warp the stages (int8: raw codes and scales) and, for int8, the decoded fp16 tile (vraw: none)."""
    tile, raw = 2 * 16 * 264 * 2, 2 * 16 * 256 + 2 * 16 * 8
    if kv8 and vraw:
        return 16 * 264 * 2 + w * ns * raw
    return 16 * 264 * 2 + w * (ns * raw + tile if kv8 else ns * tile)


def attn_mma_form(kv8: bool, limit: int):
    """(W, NS) of the first attn_decode_mma form that fits `limit` bytes of shared memory a block, or None."""
    return next(((w, ns) for w, ns in ATTN_MMA_FORMS[kv8] if attn_mma_smem(kv8, w, ns) <= limit), None)


def attn_mma_vraw_name(g: int) -> str:
    w, ns = ATTN_MMA_VRAW_FORM
    return f"attn_decode_mma<{g},true,{w},{ns},true,true>"


def attn_columns_name(name: str, cols: int) -> str:
    """The form of attn_decode_mma `name` whose tile holds `cols` consecutive columns' query groups (the template's C;
    1: the name itself)."""
    if cols == 1:
        return name
    parts = name[name.index("<") + 1:-1].split(",")
    parts += ["false"] * (6 - len(parts))
    return f"attn_decode_mma<{','.join(parts)},{cols}>"


def attn_group(name: str) -> int:
    """The query heads a KV head of an attention kernel's name (attn_decode_split<G / GS, kv8, GS> covers G)."""
    parts = name[name.index("<") + 1:-1].split(",")
    return int(parts[0]) * (int(parts[2]) if name.startswith("attn_decode_split<") and len(parts) == 3 else 1)


def attn_launch(name: str) -> tuple[int, int]:
    """(threads, dynamic shared memory) of an attention kernel's name: attn_decode_mma's W warps and its form's
    shared memory, the split kernels' 256 and none."""
    if not name.startswith("attn_decode_mma<"):
        return 256, 0
    parts = name[name.index("<") + 1:-1].split(",")
    kv8, w, ns = parts[1] == "true", int(parts[2]), int(parts[3])
    return 32 * w, attn_mma_smem(kv8, w, ns, vraw=len(parts) >= 6 and parts[5] == "true")


def attn_names() -> list[str]:
    """Every decode attention kernel a plan can pick."""
    names = [f"attn_decode_split<{g},{kv8}>" for g in ATTN_GROUPS for kv8 in ("false", "true")]
    names += [f"attn_decode_split<{g},{kv8},{gs}>" for g, gs in ATTN_GSPLIT for kv8 in ("false", "true")]
    mma = [f"attn_decode_mma<{g},{str(kv8).lower()},{w},{ns}>" for g in ATTN_MMA_G for kv8 in (False, True)
           for w, ns in ATTN_MMA_FORMS[kv8]] + [attn_mma_vraw_name(g) for g in ATTN_MMA_G]
    # (and their two-column tiles, the verified columns': engine.gpu.columns.ColumnsAttention)
    return names + mma + [attn_columns_name(n, 2) for n in mma if 2 * attn_group(n) <= 16]


def flash_smem(warps: int) -> int:
    """attn_prefill_fa's dynamic shared memory: Q [16 warps][264] + K, V [64][264], 16-bit (FA_LD)."""
    return 2 * 264 * (16 * warps + 2 * 64)


# ---- GDN prefill: the chunked form's dynamic shared memory (GDN_PREP_SMEM in cuda/gdn_tc.cu, GDN_SCAN_TC_SMEM in
# cuda/gdn_tc_scan.cu) and the in-order pass's state rows a block (one block an SM either way: 64, 96 blocks, fills
# the 27B's GPU in one wave)
GDN_PREP_SMEM = 4 * (2 * 64 * 132 + 64 * 68 + 3 * 64 + 3 * 256)
GDN_SCAN_TC_RB = (32, 64)


def gdn_scan_smem(rb: int) -> int:
    return 4 * (rb * 132 + 2 * 64 * 132 + 64 * 136 + 64 * 68 + 2 * 64 * (rb + 8) + 2 * 64)


def gdn_scan_name(rb: int) -> str:
    """The in-order pass on tensor cores: QS and M U (they reach only the output) in 1xTF32, U and the state 3xTF32."""
    return f"gdn_chunk_scan_tc<{rb}, 1>"


# ---- the persistent MLP and MoE launches
# mlp_fused<gate|up fmt, down fmt, down rows a warp, norm values a thread, chunk scales, o-projection, x and w early,
# o loads a lane> (cuda/mlp_fused.cu): the groupwise-int recipe's q4 gate|up and q5 down; hidden sizes up to 1,024 VPT
# (VPT 5: the 27B's 5,120; 1: the tests' small models); the o-projection forms for those two only
MLP_FUSED_VPT = (1, 2, 5, 8)
MLP_FUSED_O_VPT = (1, 5)
MLP_FUSED_CHUNKS = 16  # (cuda/mlp_fused.cu MLP_CHUNKS: 32-value chunks a block of the chunk-scaled down input)


def mlp_fused_vpt(hidden: int) -> int:
    return min((v for v in MLP_FUSED_VPT if v * 1024 >= hidden), default=0)


def mlp_fused_names(vpt: int) -> list[str]:
    """mlp_fused for rows of `vpt` values a thread: one scale for the row, chunk scales, and with the o-projection."""
    names = [f"mlp_fused<0,1,1,{vpt}>", f"mlp_fused<0,1,1,{vpt},true>"]
    return names + ([f"mlp_fused<0,1,1,{vpt},true,true,true,3>"] if vpt in MLP_FUSED_O_VPT else [])


MLP_FUSED_NAMES = tuple(n for v in MLP_FUSED_VPT for n in mlp_fused_names(v))
# moe_fused<routed gate|up fmt, routed down fmt, shared gate|up fmt, shared down fmt, norm values a thread, down rows a
# half-warp> (cuda/moe_fused.cu): the groupwise-int-moe recipe's q4 / q5 routed experts and w8 shared expert; VPT 2 for
# the 35B-A3B's 2,048, 1 for the tests'; down rows 2
MOE_FUSED_VPT = (1, 2)
MOE_FUSED_CHUNKS = 16  # (cuda/moe_fused.cu MOE_CHUNKS: routed 32-value chunks a block)
MOE_FUSED_OT = 4  # (cuda/moe_fused.cu MOE_OT: the o-projection's chunks a lane a slice)
# moe_fused's option bits (the same outputs either way): 1 the norm's first two planes in x and w's round of loads,
# 2 the top-k on redux.sync, 8 the grid barriers' light form, 32 their red form
MOE_FUSED_OPTS = 43


def moe_fused_vpt(hidden: int) -> int:
    return min((v for v in MOE_FUSED_VPT if v * 1024 >= hidden), default=0)


def moe_fused_name(vpt: int) -> str:
    return f"moe_fused<0,1,3,3,{vpt},2>"


MOE_FUSED_NAMES = tuple(moe_fused_name(v) for v in MOE_FUSED_VPT)
# moe_down<routed fmt, shared fmt, rows a half-warp, int16 pairs> (the MoE decode's down-projections, cuda/moe.cu): any
# routed format with a q5 or w8 shared expert, rows 4; rows 3 for q5 + w8 (the 35B-A3B's: one wave); fp32 products
MOE_DOWN_NAMES = tuple([f"moe_down<{fr},{fs},4,false>" for fr in range(4) for fs in (1, 3)] + ["moe_down<1,3,3,false>"])


def moe_down_name(fr: int, fs: int) -> str:
    """The moe_down form of routed format fr and shared format fs, "" where none is compiled."""
    forms = (f"moe_down<{fr},{fs},3,false>", f"moe_down<{fr},{fs},4,false>")
    return next((n for n in forms if n in MOE_DOWN_NAMES), "")


MOE_DOWN_COLS_ROWS = 12  # (rows a half-warp of the columns' form)


def moe_down_cols_name(fr: int, fs: int) -> str:
    """The moe_down form of the verified columns' routed slots ((K + 1) x top-k, several waves where one token's
    fill one): q4-q6 experts with int16 pairs (dp2a, about a third of the fp32 products' instructions) and 12 rows a
    half-warp (the 35B-A3B's q5 over 32 slots on the H200: 11.8 us against 17.9 for the one-token form, 13.3 with 6
    rows); w8 experts keep the one-token form (13.6 us against 14.5 for the best int16 one)."""
    return moe_down_name(fr, fs) if fr == 3 else f"moe_down<{fr},{fs},{MOE_DOWN_COLS_ROWS},true>"


def all_names() -> list[str]:
    """Every instantiation some plan can take (every format, KV format, query group, GPU class)."""
    names = gemv_names(range(4), (1, 2, 3, 4, 5, 6, 8))
    names += [f"embed_rs<{f}>" for f in range(4)] + [f"dequant_rs<{f}>" for f in range(4)]
    names += attn_names() + [f"attn_prefill_fa<{w},{kv8}>" for w in (4, 8) for kv8 in ("false", "true")]
    names += ["gdn_delta_raw_rw<4>", "gdn_delta_rows<2>"] + [gdn_scan_name(rb) for rb in GDN_SCAN_TC_RB]
    names += list(MLP_FUSED_NAMES) + list(MOE_FUSED_NAMES) + list(MOE_DOWN_NAMES)
    names += [moe_down_cols_name(fr, fs) for fr in range(3) for fs in (1, 3)]
    return list(dict.fromkeys(names))
