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
