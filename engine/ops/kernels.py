"""CUDA kernels of the decode step: one NVRTC module built from `cuda/*.cu`, and thin launchers.

Every launcher takes CuPy arrays (or `DevMatrix` for packed weights), never allocates, and never
synchronises, so a sequence of launches can be captured into one CUDA graph. Each kernel has a
reference in `engine.ops.ref` (and `engine.artifact.formats` for the packed planes) and a test in
`tests/gpu/`.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.resources
import os
import re
from pathlib import Path

import numpy as np

from engine.backend import cupy_or_none

SOURCES = ("common.cuh", "gemv_decode.cu", "gemv.cu", "gemv_variants.cu", "gemv_mma.cu", "rows.cu", "norm.cu",
           "attention.cu", "gdn.cu", "gdn_chunked.cu", "sample.cu", "sampler.cu", "moe.cu", "attn_prefill.cu", "attn_decode_mma.cu",
           "gemv_tma.cu", "persistent.cu", "mlp_fused.cu", "moe_fused.cu")
# Pre-staged GEMV input rows (fp16 pairs, slot-major blocks of 32 chunks) are padded to this many values.
XPAD = 1024
FMT_IDS = {"q4_g64_fp16": 0, "q5_g64_fp16": 1, "q6_g64_fp16": 2, "q8_g32_fp16": 3}
EPI = {"store": 0, "partial": 1, "swiglu": 2, "add": 3, "conv": 4}
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
# how many of those the automatic choice considers (all): session 11 forced each form on the H200
# (NINFER_ATTN_MMA_FORM, `bench/gpu_all.sh next`): the attention kernel tests pass for every form (105), and
# at depth 32768 a process a form, twice: -1 133.0 / 135.4 tok/s (int8 / bf16 KV), 1 133.3 / 135.4, 2 134.4 /
# 132.9. NINFER_ATTN_MMA_FORM=N still picks one.
ATTN_MMA_AUTO = 3


def attn_mma_smem(kv8: bool, w: int, ns: int) -> int:
    """Dynamic shared memory of attn_decode_mma<G, kv8, w, ns> (ADM_SMEM_OF): the Q tile, then per warp the
    stages (int8: raw codes and scales) and, for int8, the decoded fp16 tile."""
    tile, raw = 2 * 16 * 264 * 2, 2 * 16 * 256 + 2 * 16 * 8
    return 16 * 264 * 2 + w * (ns * raw + tile if kv8 else ns * tile)


def attn_mma_kraw_name(g: int) -> str:
    """attn_decode_mma's raw-K int8 form (KRAW: the codes into the MMAs, scales on the scores), compiled for the
    first int8 form only."""
    w, ns = ATTN_MMA_FORMS[True][0]
    return f"attn_decode_mma<{g},true,{w},{ns},true>"


def attn_mma_form(kv8: bool, limit: int, pick: int = -1):
    """(W, NS) of the attn_decode_mma form to run with `limit` bytes of shared memory a block (the first
    ATTN_MMA_AUTO entries of ATTN_MMA_FORMS; `pick` >= 0: only that entry), or None when none fits."""
    if pick >= len(ATTN_MMA_FORMS[kv8]):
        raise ValueError(f"NINFER_ATTN_MMA_FORM={pick}: the forms are 0..{len(ATTN_MMA_FORMS[kv8]) - 1} (-1: automatic)")
    forms = ATTN_MMA_FORMS[kv8][:ATTN_MMA_AUTO] if pick < 0 else ATTN_MMA_FORMS[kv8][pick:pick + 1]
    return next(((w, ns) for w, ns in forms if attn_mma_smem(kv8, w, ns) <= limit), None)
GDN_DELTA_ROWS = (2, 4)  # state rows a warp of gdn_delta_rows (the prefill's GDN recurrence)
# the chunked GDN prefill (gdn_chunk_prep, gdn_chunk_scan<RB> / gdn_chunk_scan_tc<RB>): state rows a block
# of the in-order pass, and the dynamic shared memory (GDN_PREP_SMEM in cuda/gdn_tc.cu, GDN_SCAN_TC_SMEM in
# cuda/gdn_tc_scan.cu, GDN_SCAN_SMEM in cuda/gdn_chunked.cu)
GDN_SCAN_RB = (16, 32, 64)
GDN_PREP_SMEM = 4 * (2 * 64 * 132 + 64 * 68 + 3 * 64 + 3 * 256)


def gdn_scan_smem(rb: int, tc: bool = False) -> int:
    if tc:  # gdn_chunk_scan_tc (GDN_SCAN_TC_SMEM)
        return 4 * (rb * 132 + 2 * 64 * 132 + 64 * 136 + 64 * 68 + 2 * 64 * (rb + 8) + 2 * 64)
    return 4 * (rb * 129 + 3 * 64 * 129 + 64 * 65 + 64 * (rb + 1) + 3 * 64)


GDN_SCAN_TC_RB = (32, 64)  # one block an SM either way: 64 (96 blocks) fills the 27B's GPU in one wave


WARPS = 8  # every kernel runs 256-thread blocks
GDN_DELTA_RW = (2, 4)  # gdn_delta_raw_rw<RW>: state rows a warp (cuda/gdn.cu)
# Programmatic dependent launch: each kernel may start while the one before it finishes (its blocks
# wait at griddepcontrol.wait before reading what that kernel wrote; GEMVs prefetch weights first).
# NINFER_PDL=0 launches plainly. Read at each launch (a graph keeps what it was captured with).
PDL = os.environ.get("NINFER_PDL", "1") != "0"
# GEMV L2 prefetch distance in loop iterations (0: off); a plan's `pf` overrides it.
GEMV_PF = int(os.environ.get("NINFER_GEMV_PF", "0"))


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


def cuda_source_dir() -> Path:
    """The CUDA sources: shipped in the wheel as engine/_cuda, or the repository's cuda/ in a checkout."""
    try:
        shipped = importlib.resources.files("engine") / "_cuda"
        if shipped.is_dir():
            return Path(str(shipped))
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "cuda"


# The chunked GDN's tensor-core kernels (inline-PTX mma.sync, no mma.h), a module of their own compiled on
# first use: common.cuh + these. gdn_chunk_prep (pass 1 of either in-order pass) lives there too.
TC_SOURCES = ("gdn_tc.cu", "gdn_tc_scan.cu")
TC_KERNELS = ("gdn_chunk_prep", "gdn_chunk_scan_tc<")


def _source(files=None, ldg: bool = False) -> str:
    root = cuda_source_dir()
    common = (root / "common.cuh").read_text()
    parts = [common]
    if ldg or os.environ.get("NINFER_W_NOALLOC", "1") == "0":  # GEMV weight loads through L1 (plain __ldg)
        parts.insert(0, "#define NI_W_NOALLOC 0")
    if XI16:  # q4/q5/q6 GEMV input staged as int16 pairs, dp2a decode (cuda/gemv_decode.cu dot_i16)
        parts.insert(0, "#define NI_XI16 1")
    for name in SOURCES[1:] if files is None else files:
        text = (root / name).read_text()
        parts.append(re.sub(r'#include "(common.cuh|persistent.cu)"\n', "", text))
    return "\n".join(p.replace("#pragma once\n", "") for p in parts)


# GEMV variants under measurement (bench/NOTES-decode.md), not in the tuning table: compiled into a second
# module on first use, so the engine's first run does not wait for them. The gemv_rs_pre (rows, unroll)
# pairs of GEMV_PRE_MAIN are in the table and compile with the engine's module.
GEMV_PRE_MAIN = ((1, 2), (2, 2))
# gemv_rs_pre<fmt, rows, 1, unroll, false, true>: x with a scale a 32-value chunk (q4-q6, one token)
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


def gemv_tma_smem(stages: int, xbytes: int, stage_bytes: int) -> int:
    """Dynamic shared memory of gemv_tma: barriers, the x region (the pairs, kpad x 2 bytes; the NORM prologue's
    fp32 x and 1 + w after them, kpad x 8), the stages."""
    return 128 * (((2 * stages + 1) * 8) // 128 + 1) + xbytes + stages * stage_bytes


def gemv_tma_stages(xbytes: int, stage_bytes: int, most: int = 8) -> int:
    """Stages of gemv_tma that fit the device's shared memory (at most `most`; 1 KiB left for its static part)."""
    s = most
    while s > 0 and gemv_tma_smem(s, xbytes, stage_bytes) > smem_optin() - 1024:
        s -= 1
    return s


@functools.cache
def tma_capable() -> bool:
    """sm_90 or newer: cp.async.bulk and mbarrier transaction counts (gemv_tma)."""
    return _compute_capability() >= 90


def _names(experimental: bool = False) -> list[str]:
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
    names += [attn_mma_kraw_name(g) for g in ATTN_MMA_G]  # the raw-K int8 form (the H100/H200 one)
    names += [f"gdn_delta_rows<{r}>" for r in GDN_DELTA_ROWS]
    names += [f"gdn_chunk_scan<{rb}>" for rb in GDN_SCAN_RB]
    names += [f"attn_prefill_fa<{w},{kv8}>" for w in (4, 8) for kv8 in ("false", "true")]  # warps, int8 KV
    return names


@functools.cache
def module(experimental: bool = False):
    """The compiled RawModule (compiled once per process; CuPy caches the cubin on disk); the
    EXPERIMENTAL variants live in a second one."""
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError("CUDA kernels need CuPy and a GPU")
    return cp.RawModule(code=_source(), options=("-std=c++17",), name_expressions=_names(experimental))


@functools.cache
def module_tc():
    """The chunked GDN's tensor-core module (TC_SOURCES), compiled on first use."""
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError("CUDA kernels need CuPy and a GPU")
    return cp.RawModule(code=_source(TC_SOURCES), options=("-std=c++17",),
                        name_expressions=[f"gdn_chunk_scan_tc<{rb}{q1}>" for rb in GDN_SCAN_TC_RB
                                          for q1 in ("", ", 1")])


# GEMV weight loads through L1 (__ldg) instead of ld.global.nc.L1::no_allocate, for the shapes whose tuning
# entry says ldg=True: the one-token register kernels in a module of their own, compiled on first use,
# kernel("ldg:NAME"). No table entry uses it: session 7 on the H200 (in-step A/B, `gpu_decode.py --ldg`),
# 27B 127.2 tok/s with no_allocate everywhere, 127.0 with ldg on the o-projection, 126.7 on every q5
# shape, 125.2 on all (the o-projection's breakdown loss in session 6 did not show in the step).
LDG_PREFIX = "ldg:"
LDG_NAMES = tuple([f"gemv_rs<{f},{r},1,2>" for f in range(4) for r in GEMV_ROWS]
                  + [f"gemv_rs_pre<{f},{r},1,{u}>" for f in range(3) for r, u in GEMV_PRE_MAIN])


@functools.cache
def module_ldg():
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError("CUDA kernels need CuPy and a GPU")
    return cp.RawModule(code=_source(("gemv_decode.cu", "gemv.cu", "gemv_variants.cu"), ldg=True), options=("-std=c++17",),
                        name_expressions=list(LDG_NAMES))


@functools.cache
def _main_names() -> frozenset:
    return frozenset(_names(False))


@functools.cache
def kernel(name: str):
    if name.startswith(LDG_PREFIX):
        return module_ldg().get_function(name[len(LDG_PREFIX):])
    if name.startswith(TC_KERNELS):
        return module_tc().get_function(name)
    return module(name.startswith(EXPERIMENTAL) and name not in _main_names()).get_function(name)


def _compute_capability() -> int:
    return int(getattr(cupy_or_none().cuda.Device(), "compute_capability", "90"))


@functools.cache
def pdl_capable() -> bool:
    """sm_90 or newer: programmatic dependent launch (griddepcontrol); older GPUs launch plainly and
    their builds of NI_PDL_ENTRY are empty."""
    return _compute_capability() >= 90


@functools.cache
def mma_ok() -> bool:
    """sm_80 or newer: mma.sync on bf16/fp16/tf32 and cp.async, which the flash prefill (attn_prefill_fa)
    and the chunked GDN on tensor cores (module_tc) need; older GPUs take the cuBLAS attention and the
    token-by-token recurrence (their build of attn_prefill_fa is a trap)."""
    return _compute_capability() >= 80


@functools.cache
def smem_optin() -> int:
    """The most dynamic shared memory one block may take on this device (227 KiB on the H100/H200, 163 on
    the A100, 99 on the RTX 30/40 series): the flash prefill's warps and the chunked GDN's form follow it."""
    cp = cupy_or_none()
    return int(cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", 227 * 1024))


@functools.cache
def sm_count() -> int:
    cp = cupy_or_none()
    return cp.cuda.Device().attributes["MultiProcessorCount"]


class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h
_CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
_CTYPE = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
          np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
          np.dtype(np.float32): ctypes.c_float}


def _occupancy(name: str, block: int, smem: int):
    """The driver's resident blocks of kernel `name` a multiprocessor (after allowing it `smem` bytes of dynamic
    shared memory), or None where it cannot be asked (no driver, a stand-in kernel)."""
    _allow_smem(kernel(name), name, smem)
    out = ctypes.c_int(0)
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        rc = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(out), ctypes.c_void_p(int(kernel(name).kernel.ptr)),
                                                            ctypes.c_int(block), ctypes.c_size_t(smem))
    except (OSError, AttributeError):
        return None
    return out.value if rc == 0 else None


@functools.cache
def blocks_per_sm(name: str, block: int = WARPS * 32, smem: int = 0) -> int:
    """Resident blocks of kernel `name` per multiprocessor (the driver's occupancy calculator; with `smem`
    bytes of dynamic shared memory, which the kernel is first allowed to take); 2 where it cannot be asked."""
    return _occupancy(name, block, smem) or 2


def resident_blocks(name: str, block: int, smem: int = 0) -> int:
    """Blocks of kernel `name` that the occupancy calculator says fit on a multiprocessor at once (no guess: a grid
    barrier needs every block resident; 1 without a driver, where nothing is launched). Raises where none fits."""
    n = _occupancy(name, block, smem)
    if n is None:
        return 1
    if n < 1:
        raise RuntimeError(f"{name}: no resident block of {block} threads and {smem} bytes of shared memory")
    return n


@functools.cache
def _cu_launch_ex():
    """The driver's cuLaunchKernelEx (CUDA >= 12), or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


class Launch:
    """One kernel launch with its arguments fixed at build time; call it to launch on the current stream.

    With `PDL` on it goes through cuLaunchKernelEx with programmatic stream serialization allowed, so
    the kernel overlaps the tail of the one before it (see NI_PDL_ENTRY in cuda/common.cuh). `cooperative`
    (a kernel with grid barriers: mlp_fused): always through cuLaunchKernelEx with the cooperative attribute
    instead, so that a grid whose blocks cannot all be resident is refused at launch rather than waiting."""

    def __init__(self, fn, grid, block: int, args: tuple, smem: int = 0, name: str = "", cooperative: bool = False):
        self.fn, self.grid, self.block, self.args, self.smem = fn, tuple(int(g) for g in grid), int(block), args, smem
        self.name, self.cooperative = name, cooperative
        self._ex = None
        launch_ex = _cu_launch_ex()
        if launch_ex is None or not (pdl_capable() or cooperative):
            return
        try:
            fptr = int(fn.kernel.ptr)
            vals = [_CTYPE[np.asarray(a).dtype](a.item() if hasattr(a, "item") else a) for a in args]
        except (AttributeError, KeyError, TypeError):
            return
        params = (ctypes.c_void_p * max(len(vals), 1))(*[ctypes.addressof(v) for v in vals])
        attr = _LaunchAttr()
        attr.id = _CU_LAUNCH_ATTRIBUTE_COOPERATIVE if cooperative else _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        ctypes.memmove(attr.value, ctypes.byref(ctypes.c_int(1)), 4)
        g = self.grid + (1,) * (3 - len(self.grid))
        cfg = _LaunchConfig(g[0], g[1], g[2], self.block, 1, 1, int(smem), None, ctypes.pointer(attr), 1)
        self._ex = (launch_ex, cfg, fptr, params, vals, attr)

    def __call__(self):
        if (PDL or self.cooperative) and self._ex is not None:
            launch_ex, cfg, fptr, params, _vals, _attr = self._ex
            cfg.hStream = cupy_or_none().cuda.get_current_stream().ptr
            rc = launch_ex(ctypes.byref(cfg), fptr, params, None)
            if rc != 0 and self.cooperative:
                raise RuntimeError(f"{self.name}: the GPU refused its cooperative launch ({rc}: another process or MPS may "
                                   "hold part of it); run with NINFER_MLP_FUSED=0")
            if rc != 0:
                raise RuntimeError(f"cuLaunchKernelEx failed ({rc}) for {self.name or 'a kernel'}")
            return
        self.fn(self.grid, (self.block,), self.args, shared_mem=self.smem)


class Concurrent:
    """`main` on the current stream and `side` on a second stream at the same time, both after what the
    current stream holds so far; the current stream then waits for the side. Independent GEMVs of one
    layer (they all read the normed x) overlap each other's ramp-up and tail this way: two 24 MiB
    streaming kernels take 6.9 us each at once against 9.0 one after the other on the H200
    (bench/pdl_probe.py). In a captured graph it is a fork and a join."""

    def __init__(self, cp, side_stream, main: list, side: list):
        self.cp, self.stream, self.main, self.side = cp, side_stream, main, side
        self.fork = cp.cuda.Event(disable_timing=True)
        self.done = cp.cuda.Event(disable_timing=True)
        self.name = "concurrent " + " + ".join(op_name(op) for op in main + side)

    def __call__(self):
        cur = self.cp.cuda.get_current_stream()
        self.fork.record(cur)
        self.stream.wait_event(self.fork)
        with self.stream:
            for op in self.side:
                op()
        self.done.record(self.stream)
        for op in self.main:
            op()
        cur.wait_event(self.done)


def op_name(op) -> str:
    """What a graph op is called in breakdowns and profiles: its name, else its GEMV's shape."""
    name = getattr(op, "name", None)
    if name:
        return name
    w = getattr(getattr(op, "__self__", None), "w", None)
    return f"gemv {w.fmt} {w.n}x{w.k}" if w is not None else getattr(op, "__qualname__", "op")


def pdl_ready(ops) -> tuple[int, int]:
    """(launches able to use programmatic dependent launch, all launches) among graph ops."""
    launches = [getattr(getattr(op, "__self__", None), "_go", op) for op in ops]
    return sum(getattr(lo, "_ex", None) is not None for lo in launches), len(launches)


_SMEM_SET: dict[str, int] = {}


def _allow_smem(fn, name: str, smem: int) -> None:
    """Let kernel `name` take `smem` bytes of dynamic shared memory (the attribute is the kernel's, so it
    is only ever raised). Set for any size: a kernel's default allowance is 48 KiB less its static shared memory."""
    if smem > _SMEM_SET.get(name, 0):
        fn.max_dynamic_shared_size_bytes = smem
        _SMEM_SET[name] = smem


def _arg(a):
    """A kernel argument: arrays become device pointers, Python floats fp32, Python ints int32."""
    if isinstance(a, np.generic):
        return a
    if hasattr(a, "data") and hasattr(a, "dtype"):
        return np.uint64(a.data.ptr)
    if isinstance(a, float):
        return np.float32(a)
    if isinstance(a, int):
        return np.int32(a)
    return a


def prepared(name: str, grid, args, block: int = WARPS * 32, smem: int = 0, cooperative: bool = False):
    """A launch with its arguments converted once (and `smem` bytes of dynamic shared memory; `cooperative`: see
    Launch); call the result to launch."""
    fn = kernel(name)
    _allow_smem(fn, name, smem)
    return Launch(fn, grid, block, tuple(_arg(a) for a in args), smem=smem, name=name, cooperative=cooperative)
