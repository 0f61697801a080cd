"""Every launch the CUDA executors build and run, on the CPU (tests/fake_cupy.py), as text: the check that a
refactoring of engine/gpu/ keeps the kernels, their grids and their arguments exactly as they were.

For the tiny dense and MoE models (tests/cuda_smoke.py), the sm_90 and sm_86 plans and both KV formats, it builds
the engine (decode step, sampled and top-k graphs, columns step, tensor-core prefill executors), writes each graph's
op list as built (a Launch: kernel, grid, block, shared memory, cooperative mode, arguments; a Concurrent: its main
and side ops), then runs every executor once (twice for a prefill chunk: the first run records its weight order)
and writes every kernel, cuBLAS and memset call in order, with the stream it went to. A device pointer is written
as the allocation it falls in (numbered by first appearance in the dump, with its dtype and shape) and the offset
into it, so two dumps are equal exactly when the launches are, whatever the addresses and allocation order.

    python dev/oplist_dump.py OUT.txt        # then: diff BEFORE.txt OUT.txt
"""
from __future__ import annotations

import bisect
import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

import fake_cupy  # noqa: E402


class Registry:
    """The fake device's allocations by address (kept alive so that no address is reused)."""

    def __init__(self):
        self.starts, self.arrays, self.ids = [], [], {}

    def add(self, a):
        base = a
        while isinstance(getattr(base, "base", None), np.ndarray):
            base = base.base
        start = int(base.__array_interface__["data"][0])
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and self.starts[i] == start and self.arrays[i] is base:
            return
        self.starts.insert(i, start)
        self.arrays.insert(i, base)

    def label(self, p: int) -> str | None:
        i = bisect.bisect_right(self.starts, p) - 1
        if i < 0:
            return None
        a = self.arrays[i]
        if p > self.starts[i] + a.nbytes:
            return None
        if id(a) not in self.ids:
            self.ids[id(a)] = len(self.ids)
        return f"A{self.ids[id(a)]}[{a.dtype}{tuple(a.shape)}]+{p - self.starts[i]}"


REG = Registry()
STREAMS: dict[int, int] = {}


def _wrap(a):
    out = np.asarray(a).view(fake_cupy.FakeArray)
    REG.add(out)
    return out


def arg(a) -> str:
    if hasattr(a, "data") and hasattr(a, "dtype") and isinstance(a, np.ndarray) and a.ndim >= 0 and \
            isinstance(a, fake_cupy.FakeArray):
        return "&" + (REG.label(int(a.data.ptr)) or "?unregistered")
    if isinstance(a, np.ndarray):  # (a host array: cuBLAS's alpha and beta)
        return f"host{a.dtype}{a.tolist()}"
    if isinstance(a, (np.uint64, np.int64)) or (isinstance(a, int) and not isinstance(a, bool) and a > 1 << 32):
        lab = REG.label(int(a)) if int(a) > 1 << 16 else None
        if lab is not None:
            return "&" + lab
        if int(a) > 1 << 32:
            return "hostptr"
        return f"{type(a).__name__}({int(a)})"
    if isinstance(a, np.generic):
        return f"{type(a).__name__}({a.item()!r})"
    return f"{type(a).__name__}({a!r})"


def gemm_arg(a) -> str:
    """A cuBLAS argument: device pointers as arg() writes them, alpha and beta (host fp32 pointers) by value."""
    out = arg(a)
    return f"host({ctypes.c_float.from_address(int(a)).value})" if out == "hostptr" else out


def stream_label() -> str:
    cur = fake_cupy._Stream.current
    s = cur[-1] if cur else None
    if s is None:
        return "s-"
    return f"s{STREAMS.setdefault(id(s), len(STREAMS))}"


def describe(op, depth: int = 0) -> list[str]:
    from engine.gpu import launch as K

    pad = "  " * depth
    if isinstance(op, K.Concurrent):
        out = [pad + "concurrent main:"]
        for o in op.main:
            out += describe(o, depth + 1)
        out.append(pad + "concurrent side:")
        for o in op.side:
            out += describe(o, depth + 1)
        return out
    target = getattr(getattr(op, "__self__", None), "_go", op)
    if isinstance(target, K.Launch):
        head = "gemv " if target is not op else ""
        return [pad + f"{head}{target.name} grid={target.grid} block={target.block} smem={target.smem} "
                f"coop={target.cooperative} args=({', '.join(arg(a) for a in target.args)})"]
    return [pad + f"op {K.op_name(op)}"]


def main(out_path: str) -> None:
    lines: list[str] = []

    def calls_into(log):
        def kernel_call(self, grid, block, args, shared_mem=0):
            log.append(f"{stream_label()} kernel {self.name} grid={tuple(int(g) for g in grid)} "
                       f"block={tuple(int(b) for b in block)} smem={shared_mem} args=({', '.join(arg(a) for a in args)})")
        return kernel_call

    cases = []
    for gpu in ("sm_90", "sm_86"):
        for kv in ("bf16", "int8"):
            cases.append(("dense", gpu, kv, {}))
    cases.append(("dense-share", "sm_90", "int8", {}))  # (a 256-row prefill executor and a 64-row one sharing it)
    for gpu in ("sm_90", "sm_86"):
        for kv in ("bf16", "int8"):
            cases.append(("moe256", gpu, kv, {}))
    cases.append(("moe256", "sm_90", "bf16", {"moe_fused": False}))
    cases.append(("moe128", "sm_90", "bf16", {"moe_fused": False}))
    for gpu in ("sm_90", "sm_86"):  # (the speculation graphs: verify columns, fold, the MTP head's rounds)
        cases.append(("dense-mtp", gpu, "bf16", {}))
    for model, gpu, kv, override in cases:
        with pytest.MonkeyPatch.context() as mp:
            REG.__init__()
            STREAMS.clear()
            mp.setattr(fake_cupy, "_wrap", _wrap)
            fake_cupy.install(mp)
            log: list[str] = []
            mp.setattr(fake_cupy._Kernel, "__call__", calls_into(log))
            from cupy_backends.cuda.libs import cublas  # the fake's

            for fn in ("gemmEx", "gemmStridedBatchedEx"):
                mp.setattr(cublas, fn, lambda *a, fn=fn: log.append(
                    f"{stream_label()} cublas {fn} ({', '.join(gemm_arg(x) for x in a)})"))
            import cupy as cp

            mp.setattr(cp.cuda.runtime, "memsetAsync", lambda *a: log.append(
                f"{stream_label()} memset ({', '.join(arg(x) for x in a[:-1])})"))
            import cuda_smoke
            from engine.gpu_engine import build_engine

            cuda_smoke.on_gpu(mp, gpu, **override)
            cfg = cuda_smoke.CFG if model.startswith("dense") else cuda_smoke.moe_cfg(int(model[3:]))
            if model == "dense-mtp":
                cfg = dict(cfg, mtp_num_hidden_layers=1)
            args, w = cuda_smoke.weights(cfg)
            if model == "dense-mtp":  # (as tests/test_cuda_spec_smoke.py builds it: the MTP head's weights kept)
                from engine.config import ModelArgs
                from engine.gpu import weights as gpu_weights
                from engine.models.qwen3_5 import random_weights

                args = ModelArgs.from_config(cfg)
                w = gpu_weights.from_logical(args, random_weights(args, seed=1, mtp=True))
                eng = build_engine(args, w, cfg, max_context=256, kv=kv, prefill_cols=8, prefill_gemm=0)
            elif model == "dense":
                eng = build_engine(args, w, cfg, max_context=512, kv=kv, prefill_cols=8, prefill_gemm=64)
            elif model == "dense-share":
                eng = build_engine(args, w, cfg, max_context=1024, kv=kv, prefill_cols=8, prefill_gemm=256)
            else:
                eng = build_engine(args, w, cfg, max_context=512, kv=kv, prefill_gemm=128)
            m = eng.model
            lines.append(f"=== {model} {gpu} {kv} {override}")
            ex = m.executor
            graphs = [("decode", ex.ops), ("sampled", ex.ops_sampled), ("topk", getattr(ex, "ops_topk", []))]
            if m.cols is not None:
                graphs.append(("columns", m.cols.ops))
            spec = eng.speculator(3) if model == "dense-mtp" else None
            if spec is not None:
                graphs += [("spec fold", spec.verify.fold_ops()), ("spec mtp", spec.mtp.round_ops()),
                           ("spec verify", spec.verify.ops)]
            graphs += [(f"prefill{g.M}", g.ops) for g in m.gemms]
            for name, ops in graphs:
                lines.append(f"--- {name} ops ({len(ops)})")
                for op in ops:
                    lines += describe(op)
            with ex.stream:
                for name, ops in graphs[:3]:
                    lines.append(f"--- {name} run")
                    log.clear()
                    for op in ops:
                        op()
                    lines += log
                if m.cols is not None:
                    lines.append("--- columns run")
                    log.clear()
                    m.cols.run_eager()
                    lines += log
                for name, ops in graphs[-3:] if spec is not None else []:
                    lines.append(f"--- {name} run")
                    log.clear()
                    for op in ops:
                        op()
                    lines += log
            for g in m.gemms:
                if args.is_moe:  # (the stand-in's kernels write nothing: distinct experts, as top-k gives)
                    g.eidx[...] = np.arange(args.num_experts_per_tok, dtype=np.int32)
                for run in (1, 2):
                    lines.append(f"--- prefill{g.M} run {run}")
                    log.clear()
                    g.run_chunk(list(range(1, g.M + 1)), 0)
                    lines += log
                lines.append(f"--- prefill{g.M} run padded")
                log.clear()
                g.run_chunk(list(range(1, g.M + 1)), 64, valid=g.M - 5)
                lines += log
    Path(out_path).write_text("\n".join(lines) + "\n")
    print(f"{out_path}: {len(lines)} lines")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "oplist.txt")
