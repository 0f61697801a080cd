"""What a benchmark runs on: the environment record and the roofline (copy bandwidth, matmul rate).

The roofline is measured once per device and kept in `roofline.json` under the cache directory
(`$NINFER_HOME/cache` when set, else platformdirs' user cache dir), keyed by the device's identity,
so the bound columns of every later run use the same reference numbers.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import numpy as np

ROOFLINE_FILE = "roofline.json"


# ---------------------------------------------------------------------------------- environment
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ninfer_version() -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("ninfer")
    except Exception:
        pass
    try:
        import tomllib  # noqa: PLC0415

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    except Exception:
        return "unknown"


def git_commit() -> str:
    """Short commit of the checkout this code runs from, `+dirty` when it has local changes; a copy of a checkout
    names its commit in NINFER_GIT_COMMIT (bench/gpu_check.sh sets it from the tree's `COMMIT` file: a copy's own
    `.git` may be another commit's) or, travelling without its `.git`, in a `COMMIT` file at its root."""
    if os.environ.get("NINFER_GIT_COMMIT", "").strip():
        return os.environ["NINFER_GIT_COMMIT"].strip()
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists() and (root / "COMMIT").is_file():
        return (root / "COMMIT").read_text().strip() or "unknown"
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _nvidia_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        return out.splitlines()[0] if out else None
    except Exception:
        return None


_USER_FACING = ("NINFER_HOME", "NINFER_DEVICE", "NINFER_DEBUG")  # (recorded elsewhere, or paths)


def environment(device: str) -> dict:
    """Versions and hardware of this run: backend, GPU name, driver, CUDA, CuPy, ninfer + commit."""
    env = {
        "ninfer_version": _ninfer_version(),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "backend": "numpy",
        "gpu": None,
        "driver": None,
        "cuda_runtime": None,
        "cupy": None,
        # the engine settings this run was given (the plan override NINFER_PLAN and the like): a figure is reproducible
        # with them
        "engine_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NINFER_") and k not in _USER_FACING},
    }
    if device == "gpu":
        from engine.backend import cupy_or_none  # noqa: PLC0415

        cp = cupy_or_none()
        if cp is not None:
            rt = cp.cuda.runtime
            props = rt.getDeviceProperties(cp.cuda.Device().id)
            name = props["name"]
            env.update(
                backend="cupy",
                gpu=name.decode() if isinstance(name, bytes) else str(name),
                gpu_memory_bytes=int(props["totalGlobalMem"]),
                driver=_nvidia_driver() or f"CUDA {_cuda_version(rt.driverGetVersion())}",
                cuda_driver_api=_cuda_version(rt.driverGetVersion()),
                cuda_runtime=_cuda_version(rt.runtimeGetVersion()),
                cupy=cp.__version__,
            )
    return env


def device_key(env: dict) -> str:
    """Identity a stored roofline belongs to."""
    if env.get("gpu"):
        return f"gpu:{env['gpu']}:{env.get('driver')}"
    return f"cpu:{env.get('cpu')}:{env.get('cpu_count')}"


# ---------------------------------------------------------------------------------- store
def cache_dir() -> Path:
    """`$NINFER_HOME/cache`, else the platform's user cache dir for ninfer."""
    home = os.environ.get("NINFER_HOME")
    if home:
        return Path(home) / "cache"
    try:
        import platformdirs  # noqa: PLC0415

        return Path(platformdirs.user_cache_dir("ninfer"))
    except ImportError:
        return Path.home() / ".cache" / "ninfer"


def load_roofline(env: dict) -> dict | None:
    """The stored roofline for this device, or None."""
    path = cache_dir() / ROOFLINE_FILE
    try:
        return json.loads(path.read_text()).get(device_key(env))
    except (OSError, ValueError, AttributeError):
        return None


def store_roofline(env: dict, roof: dict) -> Path:
    """Merge `roof` into the store under this device's key (temporary name, then rename)."""
    path = cache_dir() / ROOFLINE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            data = {}
    except (OSError, ValueError):
        data = {}
    data[device_key(env)] = roof
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------- measurement
def _best_rate(fn, work: float, reps: int, timer) -> float:
    """Best-of-`reps` rate of `fn` (work units per second) after one warm-up call."""
    fn()
    best = min(timer(fn) for _ in range(reps))
    return work / best


def _wall(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_cpu(copy_mib: int = 256, n: int = 1024, reps: int = 5) -> dict:
    """memcpy bandwidth (bytes read + written) and float32 matmul rate of this CPU."""
    count = copy_mib * (1 << 20) // 4
    src = np.ones(count, np.float32)
    dst = np.empty_like(src)
    copy = _best_rate(lambda: np.copyto(dst, src), 2.0 * src.nbytes, reps, _wall)
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    mm = _best_rate(lambda: a @ b, 2.0 * n**3, reps, _wall)
    return {
        "copy_gbps": copy / 1e9,
        "matmul_tflops": mm / 1e12,
        "matmul_dtype": "float32",
        "copy_bytes": int(src.nbytes),
        "matmul_shape": [n, n, n],
    }


def measure_gpu(copy_mib: int = 2048, n: int = 8192, reps: int = 10) -> dict:
    """Device-to-device copy bandwidth (read + written) and bf16 matmul rate, timed with CUDA events."""
    from engine.backend import cupy_or_none  # noqa: PLC0415

    cp = cupy_or_none()

    def timer(fn) -> float:
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3

    src = cp.ones(copy_mib * (1 << 20), cp.uint8)
    dst = cp.empty_like(src)
    copy = _best_rate(lambda: cp.copyto(dst, src), 2.0 * src.nbytes, reps, timer)
    del src, dst
    dtype, name = None, "bfloat16"
    try:
        import ml_dtypes  # noqa: PLC0415

        dtype = ml_dtypes.bfloat16
        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dtype)
    except Exception:  # CuPy without bf16: fall back to fp16, which runs at the same tensor-core rate
        dtype, name = cp.float16, "float16"
        a = cp.random.standard_normal((n, n), dtype=cp.float32).astype(dtype)
    b = a.copy()
    mm = _best_rate(lambda: cp.matmul(a, b), 2.0 * n**3, reps, timer)
    del a, b
    cp.get_default_memory_pool().free_all_blocks()
    return {
        "copy_gbps": copy / 1e9,
        "matmul_tflops": mm / 1e12,
        "matmul_dtype": name,
        "copy_bytes": copy_mib * (1 << 20),
        "matmul_shape": [n, n, n],
    }


def roofline(env: dict, *, remeasure: bool = False) -> tuple[dict, bool]:
    """The device's roofline: the stored one, else measured now and stored. Returns (roof, measured)."""
    if not remeasure:
        roof = load_roofline(env)
        if roof:
            return roof, False
    roof = measure_gpu() if env.get("gpu") else measure_cpu()
    roof.update(
        device=device_key(env),
        measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    if not env.get("gpu") and hasattr(os, "getloadavg"):
        roof["load_average"] = round(os.getloadavg()[0], 2)  # a busy CPU measures a low roofline
    store_roofline(env, roof)
    return roof, True
