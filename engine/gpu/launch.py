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
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np

from engine.backend import cupy_or_none
from engine.gpu.kernel_names import (  # noqa: F401  (the variant tables: kernels.X reads them)
    ATTN_GROUPS, ATTN_GSPLIT, FMT_IDS, ATTN_MMA_FORMS, ATTN_MMA_G, ATTN_MMA_VRAW_FORM, GDN_PREP_SMEM, GDN_SCAN_TC_RB,
    GEMV_CONV_ROWS, GEMV_PAIR_NAMES, GEMV_PRE_MAIN, GEMV_PRE_XS_NAMES, MLP_FUSED_CHUNKS, MLP_FUSED_NAMES,
    MLP_FUSED_VPT, MOE_DOWN_NAMES, MOE_FUSED_CHUNKS, MOE_FUSED_NAMES, MOE_FUSED_OPTS, MOE_FUSED_OT, MOE_FUSED_VPT,
    XPAD, all_names, attn_mma_form, attn_mma_smem, attn_mma_vraw_name, flash_smem, gdn_scan_smem, moe_down_name)

SOURCES = ("common.cuh", "gemv_decode.cu", "gemv.cu", "gemv_tc.cu", "gemv_variants.cu", "rows.cu", "norm.cu", "norm_cluster.cu",
           "attention.cu", "attn_combine.cu", "gdn.cu", "gdn_cluster.cu", "sample.cu", "sampler.cu", "sample_topk.cu", "moe.cu",
           "attn_prefill.cu", "attn_decode_mma.cu", "persistent.cu", "mlp_fused.cu", "moe_fused.cu", "spec.cu")
EPI = {"store": 0, "partial": 1, "swiglu": 2, "add": 3, "conv": 4}
WARPS = 8  # every kernel runs 256-thread blocks
# Programmatic dependent launch: each kernel may start while the one before it finishes (its blocks
# wait at griddepcontrol.wait before reading what that kernel wrote; GEMVs prefetch weights first).
# The plan's `pdl` sets it when an executor is built; read at each launch (a graph keeps what it was
# captured with).
PDL = True


def cuda_source_dir() -> Path:
    """The CUDA sources: shipped in the wheel as engine/_cuda, or the repository's cuda/ in a checkout."""
    try:
        shipped = importlib.resources.files("engine") / "_cuda"
        if shipped.is_dir():
            return Path(str(shipped))
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[2] / "cuda"


# The chunked GDN's tensor-core kernels (inline-PTX mma.sync), a module of their own compiled on first use:
# common.cuh + these. gdn_chunk_prep (pass 1) lives there too.
TC_SOURCES = ("gdn_tc.cu", "gdn_tc_scan.cu")
TC_KERNELS = ("gdn_chunk_prep", "gdn_chunk_scan_tc<")


def _source(files=None) -> str:
    """The module's source: common.cuh, then `files` (every SOURCES file by default) without their includes."""
    root = cuda_source_dir()
    parts = [(root / "common.cuh").read_text()]
    for name in SOURCES[1:] if files is None else files:
        text = (root / name).read_text()
        parts.append(re.sub(r'#include "(common.cuh|persistent.cu)"\n', "", text))
    return "\n".join(p.replace("#pragma once\n", "") for p in parts)


@functools.cache
def cluster_capable() -> bool:
    """sm_90 or newer: thread block clusters and distributed shared memory (residual_rmsnorm_cl)."""
    return compute_capability() >= 90


# The template instantiations the executors' plans asked for (engine.gpu.plan.DecodePlan.kernels), in order.
# The first kernel looked up compiles one module with all of them (CuPy caches the cubin on disk, keyed by
# source, options and names); a name no plan asked for compiles a module of every instantiation not yet
# compiled that some plan can take (kernel_names.all_names), and that name.
_REQUIRED: dict[str, None] = {}
_MODULES: list = []  # [(names, module)]


def require(names) -> None:
    """Ask for these template instantiations in the next module compiled (a plan's kernels)."""
    for n in names:
        _REQUIRED.setdefault(n)


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# Where the compile notice goes (the CLI and the TUI may replace it); NOTICE_AFTER: a module that takes longer
# than this to come back (CuPy's disk cache answers in well under it) is being compiled, and says so.
compile_notice = _say
NOTICE_AFTER = 0.5


def _compiled(build, count: int, what: str):
    """build() (a module's first get_function, where NVRTC runs or CuPy's cache answers), saying on one line that
    a compile is under way when it takes more than NOTICE_AFTER, and how long it took."""
    t0 = time.perf_counter()
    said = threading.Event()

    def notice():
        said.set()
        compile_notice(f"compiling the CUDA kernels of this model's plan ({count} instantiations) for sm_{compute_capability()} {what}"
                       f"(first run only: CuPy caches them) ...")

    timer = threading.Timer(NOTICE_AFTER, notice)
    timer.daemon = True
    timer.start()
    try:
        return build()
    finally:
        timer.cancel()
        if said.is_set():
            compile_notice(f"compiled in {time.perf_counter() - t0:.1f} s")


def compiled_names() -> list[str]:
    """The template instantiations compiled so far, module by module."""
    return [n for names, _ in _MODULES for n in names]


@functools.cache
def module(names: tuple = ()):
    """A compiled RawModule of every source with these name expressions (one a name set a process)."""
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError("CUDA kernels need CuPy and a GPU")
    return cp.RawModule(code=_source(), options=("-std=c++17",), name_expressions=list(names))


@functools.cache
def module_tc(names: tuple):
    """The chunked GDN's tensor-core module (TC_SOURCES) with these gdn_chunk_scan_tc instantiations."""
    cp = cupy_or_none()
    if cp is None:
        raise RuntimeError("CUDA kernels need CuPy and a GPU")
    return cp.RawModule(code=_source(TC_SOURCES), options=("-std=c++17",), name_expressions=list(names))


@functools.cache
def kernel(name: str):
    """The compiled kernel `name` (an extern "C" name or a template instantiation)."""
    if name.startswith(TC_KERNELS):
        tc = tuple(n for n in _REQUIRED if n.startswith(TC_KERNELS[1]))
        if name.startswith(TC_KERNELS[1]) and name not in tc:
            tc += (name,)
        return _compiled(lambda: module_tc(tc).get_function(name), len(tc), "(chunked GDN) ")
    for names, mod in _MODULES:
        if "<" not in name or name in names:
            return mod.get_function(name)
    done = set(compiled_names())
    pending = tuple(n for n in _REQUIRED if n not in done and not n.startswith(TC_KERNELS))
    if "<" in name and name not in pending:  # (asked for by no plan: a kernel test, a sweep) every instantiation
        pending = tuple(dict.fromkeys(pending + tuple(n for n in all_names() if n not in done and
                                                      not n.startswith(TC_KERNELS)) + (name,)))
    _MODULES.append((pending, module(pending)))
    return _compiled(lambda: _MODULES[-1][1].get_function(name), len(pending), "")


def reset_modules() -> None:
    """Forget the compiled modules and the names asked for (tests that swap the CuPy stand-in)."""
    _REQUIRED.clear()
    _MODULES.clear()
    for fn in (module, module_tc, kernel):
        fn.cache_clear()


@functools.cache
def compute_capability() -> int:
    return int(getattr(cupy_or_none().cuda.Device(), "compute_capability", "90"))


@functools.cache
def device_name() -> str:
    cp = cupy_or_none()
    try:
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    except Exception:  # noqa: BLE001 - a stand-in without properties
        return ""
    return name.decode() if isinstance(name, bytes) else str(name)


@functools.cache
def pdl_capable() -> bool:
    """sm_90 or newer: programmatic dependent launch (griddepcontrol); older GPUs launch plainly and
    their builds of NI_PDL_ENTRY are empty."""
    return compute_capability() >= 90


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
    cooperative and programmatic-serialization attributes take (an int field: a c_char array's field access
    returns a copy, and the value written there would never reach the struct)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


def launch_attr_ids(cooperative: bool, pdl: bool, mode: int = 0) -> list[int]:
    """The launch attributes of a kernel launch: programmatic serialization under PDL (for a cooperative kernel only with
    mode 1 or 2), the cooperative attribute for a cooperative kernel (not with mode 2 under PDL). A cooperative
    launch's mode (`Launch(coop_pdl=)`): 0 cooperative, after the kernel before it has ended (mlp_fused: programmatic,
    27B 149.1 against 160.0 tok/s on the H200); 2 programmatic without the cooperative attribute, its grid sized to be
    resident (moe_fused: 35B-A3B 527.0 against 517.0)."""
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
                                   "hold part of it); run it alone on the GPU")
            if rc != 0:
                raise RuntimeError(f"cuLaunchKernelEx failed ({rc}) for {self.name or 'a kernel'}")
            return
        self.fn(self.grid, (self.block,), self.args, shared_mem=self.smem)


# Streams whose next launch follows a join (wait_join): that launch goes without programmatic serialization. Measured:
# a programmatic launch right after a join does not wait for the other stream's kernel (its griddepcontrol.wait
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


def or_null(a):
    """A device array, or the null pointer for None (an optional kernel argument)."""
    return np.uint64(0) if a is None else a


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


def now(name: str, grid, args, block: int = WARPS * 32) -> None:
    """Launch kernel `name` at once with `args` as given (typed already; a plain launch, no programmatic
    serialization): the eager prefill's kernels whose arguments change every chunk."""
    kernel(name)(tuple(grid), (block,), args)
