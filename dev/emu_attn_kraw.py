"""Offline replay of attn_decode_mma's KRAW scores (cuda/attn_decode_mma.cu, int8 KV) in NumPy: Q staged with the
kernel's dim permutation, each m16n8k16 B fragment built from the raw codes as the kernel's lanes build it (quad
t4, k-step kk: the 4 codes at dim 64 (kk / 4) + 16 t4 + 4 (kk % 4), pairs PRMT-ed to 1152 + code), S summed a
64-dim group at a time and combined with the token's group scale and 1152 x the group's Q sum; compared with
Q . (codes x scales). Run: PYTHONPATH=. python dev/emu_attn_kraw.py (no GPU)."""
import numpy as np


def staged_q(q16):
    """Qs [16, 256] in fragment order: column (4 gq + j) * 16 + 2 t (+1) <- dims c, c + 1 and column + 8 (+1)
    <- dims c + 2, c + 3, for c = 64 gq + 16 t + 4 j (the kernel's staging loop)."""
    qs = np.zeros_like(q16)
    for c in range(0, 256, 4):
        gq, t, j = c >> 6, (c >> 4) & 3, (c >> 2) & 3
        col = (4 * gq + j) * 16 + 2 * t
        qs[:, col:col + 2] = q16[:, c:c + 2]
        qs[:, col + 8:col + 10] = q16[:, c + 2:c + 4]
    return qs


def kraw_scores(q16, codes, scales):
    """S [16 rows, 16 tokens] as the kernel computes it (float64 in place of the MMA's fp32)."""
    qs = staged_q(q16).astype(np.float64)
    s = np.zeros((16, 16))
    for gq in range(4):
        sg = np.zeros((16, 16))
        for j in range(4):
            kk = 4 * gq + j
            a = qs[:, kk * 16:(kk + 1) * 16]  # the A fragment's 16 columns
            b = np.zeros((16, 16))  # B[k][token]: what lane (g = token % 8, t4) holds for n-tile token // 8
            for tok in range(16):
                for t4 in range(4):
                    word = codes[tok, 64 * gq + 16 * t4 + 4 * j:64 * gq + 16 * t4 + 4 * j + 4].astype(np.int64)
                    half = 1152 + word  # (u ^ 0x80) into the mantissa of 1024: 1152 + code, exact in fp16
                    b[2 * t4, tok], b[2 * t4 + 1, tok] = half[0], half[1]
                    b[2 * t4 + 8, tok], b[2 * t4 + 9, tok] = half[2], half[3]
            sg += a @ b
        qsum = 1152.0 * qs[:, 64 * gq:64 * gq + 64].sum(1)
        s += scales[None, :, gq] * (sg - qsum[:, None])
    return s


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for trial in range(20):
        q = (rng.standard_normal((16, 256)) * 0.1).astype(np.float16).astype(np.float64)
        codes = rng.integers(-127, 128, (16, 256))
        scales = rng.uniform(0.001, 0.05, (16, 4)).astype(np.float16).astype(np.float64)
        want = q @ (codes * np.repeat(scales, 64, axis=1)).T  # [rows, tokens]
        got = kraw_scores(q, codes, scales)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-9, err
    print("KRAW scores: the permuted Q, raw-code fragments and group combine equal Q . K (20 tiles)")
