"""A NumPy stand-in for the parts of CuPy the CUDA executors touch, so that CI (no GPU) builds their
whole op lists and runs them as no-op launches: it catches Python-level breakage of the GPU path (a
renamed buffer, a wrong argument count in a hook) before device time is spent. Kernels do nothing, so
no value computed through it means anything."""
from __future__ import annotations

import sys
import types

import numpy as np


class FakeArray(np.ndarray):
    """A host array that answers `.data.ptr`, `.get()` and `.set()` as a CuPy array does."""

    @property
    def data(self):  # noqa: D401  (shadows ndarray.data: CuPy's MemoryPointer)
        return types.SimpleNamespace(ptr=int(self.__array_interface__["data"][0]))

    def __getitem__(self, idx):  # CuPy indexing gives 0-d arrays, not scalars
        r = super().__getitem__(idx)
        return r if isinstance(r, np.ndarray) else np.asarray(r).view(FakeArray)

    def get(self, stream=None):
        return np.array(self)

    def set(self, arr, stream=None):
        self[...] = np.asarray(arr)


def _wrap(a):
    return np.asarray(a).view(FakeArray)


class _Kernel:
    def __init__(self, name):
        self.name = name
        self.kernel = types.SimpleNamespace(ptr=0)
        self.max_dynamic_shared_size_bytes = 0
        self.calls = 0

    def __call__(self, grid, block, args, shared_mem=0):
        self.calls += 1


class _Module:
    def __init__(self, *a, **k):
        self.kernels = {}

    def get_function(self, name):
        return self.kernels.setdefault(name, _Kernel(name))


class _Graph:
    def launch(self, stream=None):
        pass

    def upload(self, stream=None):
        pass


class _Event:
    def __init__(self, *a, **k):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class _Stream:
    ptr = 0
    current: list = []  # the streams entered with `with`, innermost last (get_current_stream)

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        _Stream.current.append(self)
        return self

    def __exit__(self, *exc):
        _Stream.current.pop()
        return False

    def synchronize(self):
        pass

    def wait_event(self, event):
        pass

    def begin_capture(self, *a, **k):
        pass

    def end_capture(self):
        return _Graph()


class _Pool:
    def free_all_blocks(self):
        pass

    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0


def make() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.__version__ = "0-fake"
    cp.ndarray = FakeArray
    for name in ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        setattr(cp, name, getattr(np, name))
    cp.zeros = lambda *a, **k: _wrap(np.zeros(*a, **k))
    cp.ones = lambda *a, **k: _wrap(np.ones(*a, **k))
    cp.empty = lambda *a, **k: _wrap(np.zeros(*a, **k))
    cp.full = lambda *a, **k: _wrap(np.full(*a, **k))
    cp.arange = lambda *a, **k: _wrap(np.arange(*a, **k))
    cp.asarray = lambda a, dtype=None: _wrap(np.asarray(a, dtype=dtype))
    cp.array = lambda a, dtype=None: _wrap(np.array(a, dtype=dtype))
    def asnumpy(a, stream=None, out=None, blocking=True):
        if out is None:
            return np.array(a)
        out[...] = np.asarray(a)
        return out
    cp.asnumpy = asnumpy
    cp.concatenate = lambda *a, **k: _wrap(np.concatenate(*a, **k))
    cp.flatnonzero = lambda a: _wrap(np.flatnonzero(a))
    cp.exp = np.exp
    cp.left_shift = lambda a, b: _wrap(np.left_shift(a, b))
    cp.add = lambda a, b, out=None: _wrap(np.add(a, b, out=out))
    cp.multiply = lambda a, b, out=None: _wrap(np.multiply(a, b, out=out))
    cp.subtract = lambda a, b: _wrap(np.subtract(a, b))
    cp.greater_equal = lambda a, b: _wrap(np.greater_equal(a, b))
    cp.float32 = np.float32
    cp.matmul = lambda a, b: _wrap(np.matmul(a, b))
    cp.where = lambda c, a, b: _wrap(np.where(c, a, b))
    cp.RawModule = _Module
    cuda = types.SimpleNamespace()
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 13020,
                                         driverGetVersion=lambda: 13000,
                                         memGetInfo=lambda: (100 << 30, 141 << 30),
                                         memsetAsync=lambda *a: None, memcpyAsync=lambda *a: None,
                                         memcpyDeviceToHost=2, memcpyDeviceToDevice=3)
    cuda.alloc_pinned_memory = lambda n: bytearray(n)
    cuda.Device = lambda *a: types.SimpleNamespace(attributes={"MultiProcessorCount": 132}, synchronize=lambda: None,
                                                   mem_info=(100 << 30, 141 << 30), id=0)
    null = _Stream()
    cuda.get_current_stream = lambda: _Stream.current[-1] if _Stream.current else null
    cuda.device = types.SimpleNamespace(get_cublas_handle=lambda: 0)
    cp.cuda = cuda
    cp.get_default_memory_pool = lambda: _Pool()
    return cp


def install(monkeypatch) -> types.ModuleType:
    """Put the fake in sys.modules as cupy (and cuBLAS's wrapper); clear the kernel caches."""
    cp = make()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    cublas = types.ModuleType("cupy_backends.cuda.libs.cublas")
    cublas.CUBLAS_POINTER_MODE_HOST = 0
    cublas.setPointerMode = lambda *a: None
    cublas.gemmEx = cublas.gemmStridedBatchedEx = lambda *a: None
    for name in ("cupy_backends", "cupy_backends.cuda", "cupy_backends.cuda.libs"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs.cublas", cublas)
    sys.modules["cupy_backends.cuda.libs"].cublas = cublas
    from engine.gpu import launch as K  # noqa: PLC0415

    K.reset_modules()
    for fn in (K.sm_count, K.smem_optin, K.compute_capability, K.cluster_capable, K.pdl_capable, K.device_name):
        fn.cache_clear()
    monkeypatch.setattr(K, "cupy_or_none", lambda: cp)
    import engine.backend as backend  # noqa: PLC0415

    monkeypatch.setattr(backend, "cupy_or_none", lambda: cp)
    return cp
