"""moe_down's forms over the verified columns' (K + 1) x top-k routed slots (GPU machine only):

    python dev/moe_down_cols.py [--geometry qwen3.6-35b-a3b] [-k 3]

Each form of the first MoE layer's routed down (rows a half-warp, int16 pairs or fp32 products) timed alone in
the verification's buffers, and its planes against the plan's form (max |difference| over max |value|).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--geometry", default="qwen3.6-35b-a3b")
    ap.add_argument("-k", type=int, default=3)
    a = ap.parse_args(argv)
    import cupy as cp
    from gpu_decode import time_graph

    from engine.gpu import launch as K
    from engine.gpu.moe import moe_down
    from engine.synthetic import build_engine

    eng = build_engine(a.geometry, max_context=2048)
    sp = eng.speculator(a.k)
    for what, ex in (("verification", sp.verify), ("MTP catch-up", sp.mtp.cols)):
        c, moe = ex.ctx, ex.moe
        if moe is None:
            continue
        L = next(L for L in ex.layers if "experts_down" in L)
        M, k = c.M, moe.topk
        for op in ex.ops:  # (a round's routing: the first MoE layer's slots are then set)
            op()
        cp.cuda.Device().synchronize()
        dn, sd = L["experts_down"], L["shared_down"]
        fr, fs = K.FMT_IDS[dn.fmt], K.FMT_IDS[sd.fmt]
        forms = [f"moe_down<{fr},{fs},{r},{i16}>" for i16 in ("false", "true") for r in (3, 4, 6, 8, 12)]
        K.require(forms)
        moe.act_e[...] = cp.random.standard_normal(moe.act_e.shape, dtype=cp.float32) * 0.05
        ref = None
        base = K.moe_down_name(fr, fs)
        print(f"{what}: {M * k} slots, {dn.fmt} routed")
        for name in [base] + [f for f in forms if f != base]:
            op = moe_down(dn, sd, eidx=moe.eidx_t, act_routed=moe.act_e, act_shared=c.act, planes=c.part,
                          plane_stride=c.H, ewts=moe.ewts_t, topk=M * k, with_shared=False, name=name)
            c.part.fill(0)
            op()
            out = c.part.reshape(-1)[: M * k * c.H].copy()
            if ref is None:
                ref = out
            err = float(cp.abs(out - ref).max() / cp.abs(ref).max())
            print(f"  {name}: {time_graph(op) * 1e3:.2f} us; against {base}: {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
