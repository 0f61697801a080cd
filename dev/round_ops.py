"""The ops of a speculative round one by one, the parts of each concurrent group apart (GPU machine only):

    python dev/round_ops.py [--geometry qwen3.8-27b] [-k 3] [--layers 2]

For the first `--layers` layers of the verification (and the MTP's round ops): each op replayed alone
(bench/gpu_decode.py's time_graph), a concurrent group's main and side ops each alone and in order, and the
layer's ops as one graph against their sum (what the launches between them cost). Then the whole verification as one
graph, its GEMVs alone as one graph (every other op left out: what the GEMVs cost back to back) and the other ops alone
as one graph (the inputs are stale, so these time the launches, not a result).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.8-27b")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args(argv)
    from gpu_decode import time_graph

    from engine.gpu import launch as K
    from engine.synthetic import build_engine

    eng = build_engine(a.geometry, max_context=2048)
    sp = eng.speculator(a.k)
    v = sp.verify
    ops = v.ops

    def each(op, pad="  "):
        if isinstance(op, K.Concurrent):
            parts = [(K.op_name(o), time_graph(o)) for o in op.main + op.side]
            seq = time_graph(lambda: [o() for o in op.main + op.side])
            whole = time_graph(op)
            print(f"{pad}{op.name}: {whole * 1e3:.2f} us at once, {seq * 1e3:.2f} in order; "
                  + ", ".join(f"{n} {t * 1e3:.2f}" for n, t in parts))
            return whole
        t = time_graph(op)
        print(f"{pad}{K.op_name(op)}: {t * 1e3:.2f} us")
        return t

    # the layers' ops: norm op first (residual_rmsnorm_cl); a layer ends before the next norm of an input
    starts = [i for i, op in enumerate(ops) if K.op_name(op).startswith("residual_rmsnorm")]
    # (two norms a layer: the input norm and the post-attention norm)
    for li in range(a.layers):
        i0, i1 = starts[2 * li], starts[2 * li + 2] if 2 * li + 2 < len(starts) else len(ops)
        kind = v.layers[li]["kind"]
        print(f"layer {li} ({kind}): ops {i0}..{i1 - 1}")
        total = sum(each(op) for op in ops[i0:i1])
        graph = time_graph(lambda: [op() for op in ops[i0:i1]])
        print(f"  sum {total * 1e3:.2f} us, as one graph {graph * 1e3:.2f} us")
    full = time_graph(lambda: [op() for op in ops], reps=3)
    is_gemv = [K.op_name(op).startswith(("gemv", "concurrent gemv")) for op in ops]
    gemv = [op for op, g in zip(ops, is_gemv) if g]
    rest = [op for op, g in zip(ops, is_gemv) if not g]
    t_gemv = time_graph(lambda: [op() for op in gemv], reps=3)
    t_rest = time_graph(lambda: [op() for op in rest], reps=3)
    print(f"verification: {full:.3f} ms as one graph; its {len(gemv)} GEMV ops alone {t_gemv:.3f} ms, "
          f"the other {len(rest)} alone {t_rest:.3f} ms")
    mtp = sp.mtp.round_ops()
    print("mtp:")
    total = sum(each(op) for op in mtp)
    print(f"  sum {total:.3f} ms, as one graph {time_graph(lambda: [op() for op in mtp], reps=3):.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
