"""`ninfer env`: what this machine offers ninfer (Python, NumPy, CuPy/CUDA, GPU, kernels, store)."""
from __future__ import annotations

from typing import Annotated

import typer

from ninfer_cli.options import JsonOut

PlanOf = Annotated[str | None, typer.Option("--plan", metavar="GEOMETRY",
                                            help="Print the CUDA decode plan of a geometry (qwen3.6-27b, "
                                                 "qwen3.8-27b, qwen3.6-35b-a3b) on this GPU or --gpu.")]
GpuClass = Annotated[str | None, typer.Option("--gpu", help="GPU class of --plan without a GPU: sm_90 (H100/H200), "
                                                            "sm_80 (A100), sm_86 (RTX 3090), sm_89 (RTX 4090).")]
KvFormat = Annotated[str, typer.Option("--kv", help="KV cache format of --plan: bf16 or int8.")]


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _nvidia_driver() -> str | None:
    """The kernel driver version (e.g. 570.86.15) from /proc, when the NVIDIA module is loaded."""
    import re  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return m.group(1) if m else None


def gpu_facts() -> dict:
    """CuPy and GPU facts; every CuPy call is guarded so a broken install reports instead of crashing."""
    facts: dict = {"cupy": None, "cuda_runtime": None, "cuda_driver": None, "driver": _nvidia_driver(), "gpus": []}
    try:
        import cupy  # noqa: PLC0415
    except Exception as e:  # ImportError, or a CuPy wheel for another CUDA
        facts["cupy_error"] = f"{type(e).__name__}: {e}" if not isinstance(e, ImportError) else "not installed"
        return facts
    facts["cupy"] = cupy.__version__
    rt = cupy.cuda.runtime
    for key, call in (("cuda_runtime", rt.runtimeGetVersion), ("cuda_driver", rt.driverGetVersion)):
        try:
            facts[key] = _cuda_version(call())
        except Exception as e:
            facts[key + "_error"] = str(e)
    try:
        count = rt.getDeviceCount()
    except Exception as e:
        facts["cupy_error"] = f"no usable GPU: {e}"
        return facts
    for i in range(count):
        gpu: dict = {"index": i}
        try:
            props = rt.getDeviceProperties(i)
            name = props["name"]
            gpu["name"] = name.decode() if isinstance(name, bytes) else str(name)
            gpu["compute_capability"] = f"{props['major']}.{props['minor']}"
            with cupy.cuda.Device(i):
                free, total = rt.memGetInfo()
            gpu["vram_free"], gpu["vram_total"] = int(free), int(total)
        except Exception as e:
            gpu["error"] = str(e)
        facts["gpus"].append(gpu)
    return facts


def kernel_path() -> str:
    """What `engine.ops.dispatch` chose, or the NumPy reference while that module does not exist."""
    try:
        from engine.ops import dispatch  # noqa: PLC0415
    except ImportError:
        return "numpy reference (engine.ops.dispatch not present)"
    try:
        described = dispatch.describe()
    except Exception as e:
        return f"unknown (dispatch.describe() failed: {type(e).__name__}: {e})"
    if isinstance(described, dict):
        return ", ".join(f"{k}={v}" for k, v in described.items())
    return str(described)


def collect() -> dict:
    """Everything `ninfer env` prints, as one JSON-ready dict."""
    import os  # noqa: PLC0415
    import platform  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from ninfer_cli.main import package_version  # noqa: PLC0415
    from ninfer_cli.store import Store  # noqa: PLC0415

    facts: dict = {
        "ninfer": package_version(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "os": platform.platform(),
        "machine": platform.machine(),
    }
    facts["cpu_cores"] = os.cpu_count()
    try:
        facts["ram_total"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not on every OS
        facts["ram_total"] = None
    facts["overrides"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NINFER_")}
    try:
        import numpy  # noqa: PLC0415

        facts["numpy"] = numpy.__version__
    except ImportError:
        facts["numpy"] = None
    facts.update(gpu_facts())
    try:
        from engine.backend import resolve_device  # noqa: PLC0415

        facts["device_auto"] = resolve_device("auto")
    except Exception as e:
        facts["device_auto"] = f"error: {e}"
    facts["kernels"] = kernel_path()
    store = Store()
    facts["store"] = str(store.root)
    try:
        facts["store_free_bytes"] = store.free_bytes()
        facts["store_models"] = len(store.refs())
    except OSError as e:
        facts["store_free_bytes"] = None
        facts["store_error"] = str(e)
    return facts


def decode_plan(geometry: str, gpu: str | None = None, kv: str = "bf16") -> dict:
    """The CUDA decode plan (engine.gpu.plan) of a synthetic geometry on GPU class `gpu` (default: this GPU, else
    sm_90), as printable fields; NINFER_PLAN applies as at a load."""
    from engine.config import ModelArgs  # noqa: PLC0415
    from engine.errors import NinferError  # noqa: PLC0415
    from engine.gpu import plan as gpu_plan  # noqa: PLC0415
    from engine.synthetic import GEOMETRIES  # noqa: PLC0415

    if geometry not in GEOMETRIES:
        raise NinferError(f"no geometry {geometry!r} to plan", f"use one of {', '.join(GEOMETRIES)}")
    if kv not in ("bf16", "int8"):
        raise NinferError(f"unknown KV format {kv!r}", "use bf16 or int8")
    cfg, recipe = GEOMETRIES[geometry]
    dev = gpu
    if dev is None:
        dev = gpu_plan.current_device() if gpu_facts()["gpus"] else "sm_90"
    plan = gpu_plan.plan_for_recipe(ModelArgs.from_config(cfg), recipe, kv, dev)
    return {"geometry": geometry, "recipe": recipe, **plan.describe()}


def env(json_out: JsonOut = False, plan: PlanOf = None, gpu: GpuClass = None, kv: KvFormat = "bf16") -> None:
    """Show Python, OS, NumPy, CuPy/CUDA versions, the GPU and its free VRAM, kernels and the model store; with a
    GPU (or --plan), the CUDA decode plan: the kernel and form of every op, chosen once at load."""
    from ninfer_cli import output  # noqa: PLC0415

    if plan is not None or gpu is not None:
        described = decode_plan(plan or "qwen3.6-27b", gpu, kv)
        if json_out:
            output.print_json(described)
        else:
            output.key_values([(k, "; ".join(map(str, v)) if isinstance(v, list) else str(v)) for k, v in described.items()])
        return
    facts = collect()
    if facts["gpus"] and "error" not in facts["gpus"][0]:
        try:
            facts["decode_plan"] = decode_plan("qwen3.6-27b", None, "bf16")
        except Exception as e:  # a broken toolchain must not break `ninfer env`
            facts["decode_plan"] = {"error": str(e)}
    if json_out:
        output.print_json(facts)
        return
    pairs = [
        ("ninfer", facts["ninfer"]),
        ("python", f"{facts['python']} ({facts['python_executable']})"),
        ("os", f"{facts['os']} {facts['machine']}"),
        ("cpu", f"{facts['cpu_cores']} cores, {output.human_gib(facts['ram_total'])} RAM"),
        ("numpy", facts["numpy"] or "not installed"),
        ("cupy", facts["cupy"] or facts.get("cupy_error", "not installed")),
    ]
    if facts["cupy"]:
        pairs.append(("cuda runtime", facts["cuda_runtime"] or facts.get("cuda_runtime_error", "?")))
        pairs.append(("cuda driver", facts["cuda_driver"] or facts.get("cuda_driver_error", "?")))
    if facts["driver"]:
        pairs.append(("nvidia driver", facts["driver"]))
    for gpu in facts["gpus"]:
        if "error" in gpu:
            pairs.append((f"gpu {gpu['index']}", f"error: {gpu['error']}"))
        else:
            vram = f"{output.human_gib(gpu['vram_free'])} free of {output.human_gib(gpu['vram_total'])}"
            pairs.append((f"gpu {gpu['index']}", f"{gpu['name']} (sm {gpu['compute_capability']}), {vram}"))
    if not facts["gpus"]:
        pairs.append(("gpu", "no GPU: NumPy backend"))
    pairs += [
        ("device (auto)", facts["device_auto"]),
        ("kernels", facts["kernels"]),
        ("model store", facts["store"]),
        ("store free disk", output.human_bytes(facts["store_free_bytes"])
         if facts["store_free_bytes"] is not None else facts.get("store_error")),
    ]
    if facts["overrides"]:
        pairs.append(("overrides", " ".join(f"{k}={v}" for k, v in facts["overrides"].items())))
    dp = facts.get("decode_plan")
    if dp:
        pairs.append(("decode plan", dp.get("error") or f"{dp['geometry']} on {dp['gpu']}: norm {dp['norm']}, attention "
                      f"{dp['attn']}, gdn {dp['gdn']}, {dp['kernels']} instantiations (ninfer env --plan GEOMETRY)"))
    output.key_values(pairs)
