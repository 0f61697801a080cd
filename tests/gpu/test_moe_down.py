"""moe_down (cuda/moe.cu): the MoE decode's routed down-projections (grid.z = slot, the expert id read on the
device) and the shared expert's in one launch, each slot's weighted output in its own partial plane, against
the exact decode of the same codes in float64 (the LINEAR preset of spec/testing.md); fp32 products and int16
pairs with dp2a (a scale per chunk of x), rows 2-4 a half-warp, rows past N (200) in the last block."""
import numpy as np
import pytest

from engine.artifact import formats

pytestmark = pytest.mark.gpu

from kernel_checks import LINEAR, QFMTS, RNG, check, poisoned  # noqa: E402  (tests/gpu is on sys.path)


@pytest.mark.parametrize("n,k,sk", [(2048, 512, 512), (200, 128, 256)])
@pytest.mark.parametrize("fr,fs,rows", [(f, "q8_g32_fp16", 4) for f in QFMTS]
                         + [("q5_g64_fp16", "q5_g64_fp16", 4), ("q5_g64_fp16", "q8_g32_fp16", 3)])
def test_moe_down(cp, fr, fs, n, k, sk, rows):
    from engine.gpu.weights import upload_matrix
    from engine.gpu import launch as K
    from engine.gpu.moe import moe_down

    experts, slots = 6, 3
    wr = (RNG.standard_normal((experts * n, k)) / np.sqrt(k)).astype(np.float32)
    ws = (RNG.standard_normal((n, sk)) / np.sqrt(sk)).astype(np.float32)
    dr, ds = upload_matrix(cp, fr, wr), upload_matrix(cp, fs, ws)
    qr = formats.decode(fr, "row_split_k128_v1", (experts * n, k), cp.asnumpy(dr.buf)).astype(np.float64)
    qs = formats.decode(fs, "row_split_k128_v1", (n, sk), cp.asnumpy(ds.buf)).astype(np.float64)
    eidx = np.array([[4, 0, 2]], dtype=np.int32)
    wts = RNG.uniform(0.1, 1.0, (1, slots + 1)).astype(np.float32)
    act_e = (RNG.standard_normal((slots, k)) * 3).astype(np.float32)
    ld = max(k, sk) + 8  # the shared expert's row is a prefix of a wider buffer, as in the executor
    act = (RNG.standard_normal((1, ld)) * 3).astype(np.float32)
    part = poisoned(cp, (slots + 2, 1, n))
    name = f"moe_down<{K.FMT_IDS[fr]},{K.FMT_IDS[fs]},{rows},false>"
    assert name in K.MOE_DOWN_NAMES
    moe_down(dr, ds, eidx=cp.asarray(eidx), act_routed=cp.asarray(act_e), act_shared=cp.asarray(act), planes=part,
             plane_stride=n, ewts=cp.asarray(wts), topk=slots, name=name)()
    got = part.get()
    for z in range(slots):
        e = int(eidx[0, z])
        want = wts[0, z] * (qr[e * n:(e + 1) * n] @ act_e[z].astype(np.float64))
        check(f"{fr} slot {z}", got[z, 0], want, **LINEAR)
    check(f"{fs} shared", got[slots, 0], wts[0, slots] * (qs @ act[0, :sk].astype(np.float64)), **LINEAR)
    assert np.isnan(got[slots + 1]).all()  # nothing past the shared plane
