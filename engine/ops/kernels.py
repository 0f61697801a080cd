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
from engine.ops.kernel_names import (  # noqa: F401  (the variant tables: kernels.X reads them as before)
    ATTN_GROUPS, ATTN_GSPLIT, ATTN_MMA_FORMS, ATTN_MMA_G, ATTN_TT, EXPERIMENTAL, GDN_DELTA_ROWS, GDN_DELTA_RW,
    GDN_SCAN_RB, GDN_SCAN_TC_RB, GEMV_ASYNC_M, GEMV_ASYNC_STAGES, GEMV_CONV_ROWS, GEMV_M, GEMV_MMA, GEMV_PRE_MAIN,
    GEMV_PAIR_NAMES, GEMV_PRE_XS_NAMES, GEMV_ROWS, GEMV_TMA_NW, GEMV_UNROLL, LDG_NAMES, MLP_FUSED_CHUNKS,
    MLP_FUSED_NAMES, MLP_FUSED_VPT, MOE_DOWN_NAMES, MOE_DOWN_ROWS, MOE_FUSED_CHUNKS, MOE_FUSED_DR, MOE_FUSED_NAMES,
    MOE_FUSED_OT, MOE_FUSED_VPT, W8_PRE, XI16, ATTN_MMA_KRAW_FORMS, ATTN_MMA_T_FORMS, ATTN_MMA_VRAW_FORMS,
    attn_mma_kraw_name, attn_mma_t_name, attn_mma_vraw_name)
from engine.ops.kernel_names import names as _names

SOURCES = ("common.cuh", "gemv_decode.cu", "gemv.cu", "gemv_variants.cu", "gemv_mma.cu", "rows.cu", "norm.cu",
           "norm_cluster.cu", "attention.cu", "attn_combine.cu", "gdn.cu", "gdn_cluster.cu", "gdn_chunked.cu",
           "sample.cu", "sampler.cu", "sample_topk.cu", "moe.cu", "attn_prefill.cu", "attn_decode_mma.cu", "attn_decode_mma_t.cu",
           "gemv_tma.cu", "persistent.cu", "mlp_fused.cu", "moe_fused.cu")
# Pre-staged GEMV input rows (fp16 pairs, slot-major blocks of 32 chunks) are padded to this many values.
XPAD = 1024
FMT_IDS = {"q4_g64_fp16": 0, "q5_g64_fp16": 1, "q6_g64_fp16": 2, "q8_g32_fp16": 3}
EPI = {"store": 0, "partial": 1, "swiglu": 2, "add": 3, "conv": 4}
# how many of attn_decode_mma's forms (kernel_names.ATTN_MMA_FORMS) the automatic choice considers (all): session 11 forced each form on the H200
# (NINFER_ATTN_MMA_FORM, `bench/gpu_all.sh next`): the attention kernel tests pass for every form (105), and
# at depth 32768 a process a form, twice: -1 133.0 / 135.4 tok/s (int8 / bf16 KV), 1 133.3 / 135.4, 2 134.4 /
# 132.9. NINFER_ATTN_MMA_FORM=N still picks one.
ATTN_MMA_AUTO = 3


def attn_mma_smem(kv8: bool, w: int, ns: int, kraw: bool = False, vraw: bool = False) -> int:
    """Dynamic shared memory of attn_decode_mma<G, kv8, w, ns> (ADM_SMEM_OF; kraw: ADM_SMEM_KR; vraw: ADM_SMEM_VR): the
    Q tile, then per warp the stages (int8: raw codes and scales) and, for int8, the decoded fp16 tile (kraw: V's half
    only; vraw: none)."""
    tile, raw = 2 * 16 * 264 * 2, 2 * 16 * 256 + 2 * 16 * 8
    if kv8 and vraw:
        return 16 * 264 * 2 + w * ns * raw
    return 16 * 264 * 2 + w * (ns * raw + (tile // 2 if kraw else tile) if kv8 else ns * tile)


def attn_mma_t_smem(w: int, ns: int) -> int:
    """Dynamic shared memory of attn_decode_mma_t<G, w, ns, MINB> (ADT_SMEM): Q as fp16 [8][264], then each warp's ns
    raw int8 stages."""
    return 8 * 264 * 2 + w * ns * (2 * 16 * 256 + 2 * 16 * 8)


def attn_mma_form(kv8: bool, limit: int, pick: int = -1):
    """(W, NS) of the attn_decode_mma form to run with `limit` bytes of shared memory a block (the first
    ATTN_MMA_AUTO entries of ATTN_MMA_FORMS; `pick` >= 0: only that entry), or None when none fits."""
    if pick >= len(ATTN_MMA_FORMS[kv8]):
        raise ValueError(f"NINFER_ATTN_MMA_FORM={pick}: the forms are 0..{len(ATTN_MMA_FORMS[kv8]) - 1} (-1: automatic)")
    forms = ATTN_MMA_FORMS[kv8][:ATTN_MMA_AUTO] if pick < 0 else ATTN_MMA_FORMS[kv8][pick:pick + 1]
    return next(((w, ns) for w, ns in forms if attn_mma_smem(kv8, w, ns) <= limit), None)


# the chunked GDN prefill's dynamic shared memory (GDN_PREP_SMEM in cuda/gdn_tc.cu; gdn_scan_smem: GDN_SCAN_TC_SMEM in
# cuda/gdn_tc_scan.cu, GDN_SCAN_SMEM in cuda/gdn_chunked.cu)
GDN_PREP_SMEM = 4 * (2 * 64 * 132 + 64 * 68 + 3 * 64 + 3 * 256)


def gdn_scan_smem(rb: int, tc: bool = False) -> int:
    if tc:  # gdn_chunk_scan_tc (GDN_SCAN_TC_SMEM)
        return 4 * (rb * 132 + 2 * 64 * 132 + 64 * 136 + 64 * 68 + 2 * 64 * (rb + 8) + 2 * 64)
    return 4 * (rb * 129 + 3 * 64 * 129 + 64 * 65 + 64 * (rb + 1) + 3 * 64)


WARPS = 8  # every kernel runs 256-thread blocks
# Programmatic dependent launch: each kernel may start while the one before it finishes (its blocks
# wait at griddepcontrol.wait before reading what that kernel wrote; GEMVs prefetch weights first).
# NINFER_PDL=0 launches plainly. Read at each launch (a graph keeps what it was captured with).
PDL = os.environ.get("NINFER_PDL", "1") != "0"
# GEMV L2 prefetch distance in loop iterations (0: off); a plan's `pf` overrides it.
GEMV_PF = int(os.environ.get("NINFER_GEMV_PF", "0"))
# NINFER_COOP_PDL: the persistent MLP / MoE kernels' launches (read when a Launch is built). 0: cooperative, after the
# kernel before them has ended; 1: cooperative and programmatic; 2: programmatic without the cooperative attribute
# (their grids are sized to be resident). -1 (the default): each launch's own mode (`Launch(coop_pdl=)`): moe_fused 2,
# mlp_fused 0. Measured (H200, one process, two passes): session 20 (s20b) 1: 27B 149.1 against 160.0 tok/s, 35B-A3B
# 518.7 against 517.2; session 21 (s21a) 1 / 2: 27B 160.0 / 161.9 against 162.5 (with GEMV_PAIR, 2 153.0 against
# 163.7), 35B-A3B 510.1 / 527.0 against 517.0.
COOP_PDL = int(os.environ.get("NINFER_COOP_PDL", "-1"))


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
def cluster_capable() -> bool:
    """sm_90 or newer: thread block clusters and distributed shared memory (residual_rmsnorm_cl)."""
    return _compute_capability() >= 90


@functools.cache
def tma_capable() -> bool:
    """sm_90 or newer: cp.async.bulk and mbarrier transaction counts (gemv_tma)."""
    return _compute_capability() >= 90


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


LDG_PREFIX = "ldg:"


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
    """CUlaunchAttribute: an id, 4 bytes of padding, a 64-byte union whose first word is the int that the
    cooperative and programmatic-serialization attributes take. (Until session 20 the union was a c_char array,
    whose field access returns a copy: the 1 written there never reached the struct, so no launch was ever
    programmatic or cooperative.)"""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


def launch_attr_ids(cooperative: bool, pdl: bool, coop_pdl: int = 0) -> list[int]:
    """The launch attributes of a kernel launch: programmatic serialization under PDL (for a cooperative kernel only with
    mode 1 or 2), the cooperative attribute for a cooperative kernel (not with mode 2 under PDL). The mode: COOP_PDL,
    or where that is -1 the launch's own `coop_pdl`."""
    mode = coop_pdl if COOP_PDL < 0 else COOP_PDL
    ids = [_CU_LAUNCH_ATTRIBUTE_COOPERATIVE] if cooperative and not (pdl and mode == 2) else []
    if pdl and (mode or not cooperative):
        ids.append(_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    return ids


def launch_attrs(ids) -> ctypes.Array:
    """An array of CUlaunchAttribute, each of `ids` set to 1."""
    arr = (_LaunchAttr * len(ids))()
    for a, i in zip(arr, ids):
        a.id, a.value = int(i), 1
    return arr


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
    the kernel overlaps the tail of the one before it (see NI_PDL_ENTRY in cuda/common.cuh), except right after a
    join (`wait_join`): that launch is plain. `cooperative` (a kernel with grid barriers: mlp_fused, moe_fused):
    always through cuLaunchKernelEx with the cooperative attribute instead, so that a grid whose blocks cannot all be
    resident is refused at launch rather than waiting; `coop_pdl` (see launch_attr_ids): its mode under PDL."""

    def __init__(self, fn, grid, block: int, args: tuple, smem: int = 0, name: str = "", cooperative: bool = False,
                 coop_pdl: int = 0):
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
        g = self.grid + (1,) * (3 - len(self.grid))
        # the attribute sets: [0] under PDL, [1] plain (cooperative kernels keep theirs either way)
        sets = []
        for pdl in (True, False):
            ids = launch_attr_ids(cooperative, pdl, coop_pdl)
            attrs = launch_attrs(ids) if ids else None
            cfg = _LaunchConfig(g[0], g[1], g[2], self.block, 1, 1, int(smem), None, attrs, len(ids))
            sets.append((cfg, attrs))
        self._ex = (launch_ex, sets, fptr, params, vals)

    def __call__(self):
        if (PDL or self.cooperative) and self._ex is not None:
            launch_ex, sets, fptr, params, _vals = self._ex
            stream = cupy_or_none().cuda.get_current_stream().ptr
            cfg = sets[0 if PDL and not _JOINED.pop(stream, False) else 1][0]
            cfg.hStream = stream
            rc = launch_ex(ctypes.byref(cfg), fptr, params, None)
            if rc != 0 and self.cooperative:
                raise RuntimeError(f"{self.name}: the GPU refused its cooperative launch ({rc}: another process or MPS may "
                                   "hold part of it); run with NINFER_MLP_FUSED=0")
            if rc != 0:
                raise RuntimeError(f"cuLaunchKernelEx failed ({rc}) for {self.name or 'a kernel'}")
            return
        self.fn(self.grid, (self.block,), self.args, shared_mem=self.smem)


# Streams whose next launch follows a join (wait_join): that launch goes without programmatic serialization. Measured
# (s20b): a programmatic launch right after a join does not wait for the other stream's kernel (its griddepcontrol.wait
# covers the launch's own stream), so what the kernel after it reads from the joined branch can be stale (the MoE
# engine test with moe_down: the shared expert's SwiGLU row of the previous layer).
_JOINED: dict[int, bool] = {}


def wait_join(stream, event) -> None:
    """`stream` waits for `event` (recorded on another stream), and its next Launch is a plain one."""
    stream.wait_event(event)
    _JOINED[stream.ptr] = True


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
        wait_join(cur, self.done)


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


def prepared(name: str, grid, args, block: int = WARPS * 32, smem: int = 0, cooperative: bool = False,
             coop_pdl: int = 0):
    """A launch with its arguments converted once (and `smem` bytes of dynamic shared memory; `cooperative`,
    `coop_pdl`: see Launch and launch_attr_ids); call the result to launch."""
    fn = kernel(name)
    _allow_smem(fn, name, smem)
    return Launch(fn, grid, block, tuple(_arg(a) for a in args), smem=smem, name=name, cooperative=cooperative,
                  coop_pdl=coop_pdl)
