// Whole rows from the packed planes, element by element (not the GEMVs' decode): the embedding gather
// and the tensor-core prefill's dequantization to fp16. The format ids (FMT_*) are gemv.cu's.
#include "common.cuh"

// Code k of row `row` of a row-split object, times its group scale (the reference: formats.decode).
template <int FMT>
__device__ __forceinline__ float rs_value(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                                          const __half* __restrict__ scales, int gpr, size_t row, int k) {
  const int g = k / (FMT == FMT_W8 ? 32 : 64), lanei = k % (FMT == FMT_W8 ? 32 : 64);
  const size_t rg = row * gpr + g;
  const float s = __half2float(scales[rg]);
  int code;
  if constexpr (FMT == FMT_W8) {
    code = (int)(signed char)base[rg * 32 + lanei];
  } else {
    const unsigned int b = base[rg * 32 + (lanei >> 1)];
    unsigned int u = (lanei & 1) ? (b >> 4) : (b & 15u);
    int bits = 4;
    if constexpr (FMT == FMT_Q5) {
      u |= ((high[rg * 8 + (lanei >> 3)] >> (lanei & 7)) & 1u) << 4;
      bits = 5;
    } else if constexpr (FMT == FMT_Q6) {
      const int t = 2 * lanei;
      u |= ((high[rg * 16 + (t >> 3)] >> (t & 7)) & 3u) << 4;
      bits = 6;
    }
    code = (int)(u << (32 - bits)) >> (32 - bits);
  }
  return s * (float)code;
}

// Embedding gather: x[m][:] = dequantized row tokens[m] of a row-split table [R, K].
template <int FMT>
__global__ void embed_rs(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                         const __half* __restrict__ scales, int gpr, int K,
                         const int* __restrict__ tokens, float* __restrict__ x, int ldx) {
  NI_PDL_ENTRY();
  const int m = blockIdx.x;
  const int row = tokens[m];
  for (int k = threadIdx.x; k < K; k += blockDim.x) x[(size_t)m * ldx + k] = rs_value<FMT>(base, high, scales, gpr, row, k);
}

// Prefill: rows [0, N) of a row-split object dequantized to fp16 [N, ldo] (the tensor-core GEMM's input).
// grid (N), block 256. fp16 holds code x scale to 11 bits, as the GEMVs' decode does.
template <int FMT>
__global__ void dequant_rs(const unsigned char* __restrict__ base, const unsigned char* __restrict__ high,
                           const __half* __restrict__ scales, int gpr, int K, __half* __restrict__ out, int ldo) {
  NI_PDL_ENTRY();
  const size_t row = blockIdx.x;
  for (int k = threadIdx.x; k < K; k += blockDim.x)
    out[row * ldo + k] = __float2half_rn(rs_value<FMT>(base, high, scales, gpr, row, k));
}

// bf16 embedding gather.
extern "C" __global__ void embed_bf16(const unsigned short* __restrict__ table, int K, const int* __restrict__ tokens,
                           float* __restrict__ x, int ldx) {
  NI_PDL_ENTRY();
  const int m = blockIdx.x;
  const unsigned short* r = table + (size_t)tokens[m] * K;
  for (int k = threadIdx.x; k < K; k += blockDim.x) x[(size_t)m * ldx + k] = __uint_as_float(((unsigned int)r[k]) << 16);
}

// L2 warm-up: while the light kernels between two GEMVs run (norms, stagings, the GDN and attention
// cores: DRAM otherwise idle), the next GEMV's first rows are asked into L2, so the GEMV starts on
// cache hits. d: n descriptors of 4 int64 (address, bytes a row, row stride, rows), a strided block of
// rows (one row for a contiguous range). mode 0: prefetch.global.L2 per 128-byte line; 1: the same with
// the evict_last priority; 2: cp.async.bulk.prefetch.L2 (sm_90) per 16 KiB piece of a row. Prefetches
// are fire and forget: the kernel ends once they are issued. No PDL wait: it reads only its table and
// the weights, which no kernel writes.
extern "C" __global__ void l2_prefetch(const long long* __restrict__ d, int n, int mode) {
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, nt = (long long)gridDim.x * blockDim.x;
  for (int i = 0; i < n; ++i) {
    const unsigned long long a0 = (unsigned long long)d[4 * i];
    const long long rb = d[4 * i + 1], st = d[4 * i + 2], nr = d[4 * i + 3];
    if (rb <= 0 || nr <= 0) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (mode == 2) {
      constexpr long long PIECE = 16 * 1024;
      const long long ppr = (rb + 15 + 15) / PIECE + 1;  // pieces a row (16-byte aligned ends)
      for (long long t = tid; t < nr * ppr; t += nt) {
        const long long r = t / ppr, p = t - r * ppr;
        const unsigned long long a = a0 + (unsigned long long)(r * st);
        const unsigned long long s = (a & ~15ull) + (unsigned long long)(p * PIECE);
        const unsigned long long e = (a + (unsigned long long)rb + 15) & ~15ull;
        if (s < e) {
          const unsigned int sz = (unsigned int)min((unsigned long long)PIECE, e - s);
          asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(s), "r"(sz) : "memory");
        }
      }
      continue;
    }
#endif
    const long long lpr = (rb + 127) / 128 + 1;  // lines a row, whatever its alignment
    for (long long t = tid; t < nr * lpr; t += nt) {
      const long long r = t / lpr, l = t - r * lpr;
      const unsigned long long a = a0 + (unsigned long long)(r * st);
      const unsigned long long p = (a & ~127ull) + (unsigned long long)(l * 128);
      if (p < a + (unsigned long long)rb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        if (mode == 1) {
          asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(p));
          continue;
        }
#endif
        asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
      }
    }
  }
}
