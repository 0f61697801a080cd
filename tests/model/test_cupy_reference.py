"""The reference ops and the Qwen3.5 model run unchanged on CuPy arrays (device="gpu")."""
import numpy as np
import pytest

from engine.ops import ref
from tests.model.conftest import load_golden, rel_l2
from tests.model.tolerance import check

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    from engine.backend import cupy_or_none

    mod = cupy_or_none()
    if mod is None:
        pytest.skip("needs CuPy and a GPU")
    return mod


def test_ref_ops_on_cupy_equal_numpy(cp):
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    t, hk, hv, dk, dv = 130, 2, 4, 16, 8
    q, k = ref.l2norm(r(t, hk, dk)), ref.l2norm(r(t, hk, dk))
    v = r(t, hv, dv)
    g, beta = ref.gdn_gates(r(t, hv), r(t, hv), r(hv), r(hv))
    s0 = r(hv, dv, dk)
    on_gpu = [cp.asarray(a) for a in (q, k, v, g, beta, s0)]
    for fn in (ref.gdn_recurrent, ref.gdn_chunked):
        o, s = fn(q, k, v, g, beta, s0)
        og, sg = fn(*on_gpu)
        assert isinstance(og, cp.ndarray)
        check(og.get(), o, "gdn_state_fp32")
        check(sg.get(), s, "gdn_state_fp32")
    x, w = r(9, 6, 32), r(32)
    check(ref.rmsnorm(cp.asarray(x), cp.asarray(w), 1e-6).get(), ref.rmsnorm(x, w, 1e-6), "fp32_transcendental")
    check(ref.rope(cp.asarray(x), np.arange(9), 16, 1e7).get(), ref.rope(x, np.arange(9), 16, 1e7), "fp32_transcendental")
    qa, ka, va = r(5, 6, 32), r(11, 2, 32), r(11, 2, 32)
    check(ref.attention(cp.asarray(qa), cp.asarray(ka), cp.asarray(va), 0.2, 6).get(),
          ref.attention(qa, ka, va, 0.2, 6), "fp32_transcendental")
    xc, wc, sc = r(7, 12), r(4, 12), r(12, 3)
    y, st = ref.causal_conv1d(cp.asarray(xc), cp.asarray(sc), cp.asarray(wc))
    y0, st0 = ref.causal_conv1d(xc, sc, wc)
    check(y.get(), y0, "fp32_transcendental")
    idx, wt = ref.moe_route(cp.asarray(r(3, 10)), 4)
    assert idx.shape == (3, 4) and abs(float(wt.sum()) - 3.0) < 1e-5


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_golden_on_cupy(cp, kind):
    import engine
    from engine.models.qwen3_5 import hf_to_logical

    cfg, hf, tokens, logits = load_golden(kind)
    weights = {n: a for key, val in hf.items() for n, a in hf_to_logical(key, val, cfg)}
    e = engine.load({"config": cfg, "weights": weights}, device="gpu", prefill_chunk=16)
    assert e.device == "gpu"
    assert rel_l2(e.logits(tokens), logits) < 1e-4
    e.prefill(tokens[:20])
    rows = [e.decode_step(int(t_)) for t_ in tokens[20:]]
    assert rel_l2(np.stack(rows), logits[20:]) < 1e-4
