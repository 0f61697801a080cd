"""Where the columns step departs from token-by-token decode (tiny dense model, one 8-token chunk).

Prints, per layer, the relative difference of the GDN conv/recurrent state and the KV written, and per
column the final normed hidden state of the chunk against the same token run alone."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from engine.gpu import weights as gpu_weights  # noqa: E402
from engine.config import ModelArgs  # noqa: E402
from engine.gpu_engine import build_engine  # noqa: E402
from engine.synthetic import TINY_CUDA as CFG  # noqa: E402
from test_gpu_engine import quantized_weights  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


args = ModelArgs.from_config(CFG)
w = gpu_weights.from_logical(args, quantized_weights(args))
cols = build_engine(args, w, CFG, max_context=256, prefill_cols=8)
single = build_engine(args, w, CFG, max_context=256, prefill_cols=1)
prompt = [int(t) for t in np.random.default_rng(9).integers(0, CFG["vocab_size"], 8)]
a = cols.prefill(prompt)
xn_cols = cols.model.cols.xn.get()
xn_single = []
single.reset()
for t in prompt:
    single.model([t], single.cache)
    xn_single.append(single.model.executor.xn[0].get())
b = xn_single
print("logits rel", rel(a, single.model.executor.logits[0].get()))
for t in range(8):
    print(f"column {t}: final xn rel {rel(xn_cols[t], xn_single[t]):.3e}")
for i, (Lc, Ls) in enumerate(zip(cols.model.executor.layers, single.model.executor.layers)):
    for key in ("conv_state", "state", "kc", "vc"):
        if key in Lc:
            x, y = Lc[key].get().astype(np.float64), Ls[key].get().astype(np.float64)
            print(f"layer {i} {Lc['kind']:16s} {key:10s} rel {rel(x, y):.3e}")
ex = cols.model.cols
for name in ("buf_a", "buf_b", "ab", "gdn_q", "gdn_k", "gdn_v", "gdn_g", "gdn_beta", "att2", "att", "act", "x", "x2"):
    if hasattr(ex, name):
        v = getattr(ex, name).get()
        print(f"cols buffer {name:9s} shape {v.shape} finite {np.isfinite(v).all()} rows-norms {np.round(np.linalg.norm(v.reshape(v.shape[0], -1), axis=1), 3)[:8]}")
