"""gated_rmsnorm_chunks (cuda/norm.cu, GdnOps.GATED_CHUNK): the GDN gated norm staging the o-projection's input a
32-value chunk at a time with a scale each, and gemv_rs_pre<..., XS> multiplying the scales in: the fp32 output
bit-identical to gated_rmsnorm_stage's, the o-projection within the GEMV tolerances of the float reference."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from engine.artifact import formats  # noqa: E402
from engine.ops import ref  # noqa: E402
from engine.ops.gemv_plan import GemvPlan  # noqa: E402

from kernel_checks import LINEAR, RNG, check, poisoned  # noqa: E402  (tests/gpu is on sys.path)


@pytest.mark.parametrize("hv,n", [(48, 5120), (16, 1024)], ids=["27b", "small"])
def test_gated_chunks_and_the_chunk_scaled_gemv(cp, hv, n):
    from engine.gpu_weights import upload_matrix
    from engine.ops import kernels as K

    if not K.XI16:
        pytest.skip("chunk scales ride on the int16 pairs")
    k = hv * 128
    kpad = -(-k // K.XPAD) * K.XPAD
    o = cp.asarray(RNG.standard_normal((1, hv, 128)).astype(np.float32))
    z = cp.asarray(RNG.standard_normal((1, k)).astype(np.float32))
    w = cp.asarray((1 + 0.1 * RNG.standard_normal(128)).astype(np.float32))
    wo = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    dev = upload_matrix(cp, "q5_g64_fp16", wo)
    outs = {}
    for name in ("gated_rmsnorm_stage", "gated_rmsnorm_chunks"):
        out, xinv = poisoned(cp, (1, k)), poisoned(cp, (1,))
        xh = cp.asarray(np.zeros((1, kpad // 2), np.uint32))
        xsc = poisoned(cp, (kpad // 32,))
        chunk = name == "gated_rmsnorm_chunks"
        args = (o, z, k, w, out, k, hv, 1e-6, k, kpad, xh, xinv) + ((xsc,) if chunk else ())
        K.prepared(name, ((-(-hv // 8)) if chunk else 1, 1), args, block=256 if chunk else 1024)()
        y = poisoned(cp, (1, n))
        plan = GemvPlan(dev, out, k, y, n, epi="store", rows=2, unroll=2, xpre=(xh, xinv), pre2=True,
                        xs=xsc if chunk else None)
        assert plan.xs == chunk and plan.fn is not None
        plan.launch()
        cp.cuda.Device().synchronize()
        outs[name] = (out.get(), y.get(), xinv.get())
    assert np.array_equal(outs["gated_rmsnorm_chunks"][0], outs["gated_rmsnorm_stage"][0])
    assert outs["gated_rmsnorm_chunks"][2].tolist() == [1.0]
    dq = formats.decode("q5_g64_fp16", "row_split_k128_v1", (n, k), cp.asnumpy(dev.buf))
    for name, (out, y, _) in outs.items():
        check(f"o-projection after {name}", y, ref.linear(out, dq), **LINEAR)
