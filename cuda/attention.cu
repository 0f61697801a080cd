// Gated full attention, decode: q/k norm + partial RoPE + KV write, then split-K attention over a
// paged bf16 KV cache with GQA, then a combine that applies the sigmoid output gate.
//
// KV pool per layer: [pages, PAGE=64, Hkv, D] bf16 (as uint16), one page table row per lane; or int8-g64:
// int8 codes in the same shape plus fp16 scales [pages, PAGE, Hkv, D/64], scale = fp16(amax/127),
// codes = clamp(rint(x * (1/scale)), -127, 127) (spec/container.md §5.5).
// Position of token m: pos[m]; it attends to positions [0, pos[m]].
#include "common.cuh"

#define KV_PAGE 64

// int8-g64 codes of one 256-wide head held strided (element i of lane l is d = l + 32 i, so the
// 64-dim group g is e[2g], e[2g+1] of every lane).
__device__ __forceinline__ void quant_g64(const float (&e)[8], signed char* codes, __half* scales, int lane) {
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    const float amax = warp_max(fmaxf(fabsf(e[2 * g]), fabsf(e[2 * g + 1])));
    __half s16 = __float2half_rn(amax / 127.f);
    if (__half2float(s16) == 0.f && amax > 0.f) s16 = __ushort_as_half((unsigned short)1);
    const float sf = __half2float(s16);
    const float inv = sf > 0.f ? 1.f / sf : 0.f;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const float c = fminf(fmaxf(rintf(e[2 * g + t] * inv), -127.f), 127.f);
      codes[lane + 32 * (2 * g + t)] = (signed char)(int)c;
    }
    if (lane == 0) scales[g] = s16;
  }
}

// q: [M, Hq, D] query rows (raw projection), k/v: [M, Hkv, D]; one warp per head (D == 256, 8 per lane,
// element i of lane l is d = l + 32 i so that the rotated pairs (d, d + 32) of RoPE sit in one lane).
extern "C" __global__ void qk_norm_rope_kv(const float* __restrict__ q, int ldq, const float* __restrict__ k, int ldk,
                                const float* __restrict__ v, int ldv,
                                const float* __restrict__ qnw, const float* __restrict__ knw,
                                const int* __restrict__ pos, const int* __restrict__ page_table, int pt_stride,
                                unsigned short* __restrict__ kc, unsigned short* __restrict__ vc,
                                float* __restrict__ qout, int Hq, int Hkv, int rot, float log2_theta, float eps,
                                __half* __restrict__ ks, __half* __restrict__ vs8) {
  NI_PDL_ENTRY();
  const int lane = threadIdx.x & 31;
  const int h = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int m = blockIdx.y;
  if (h >= Hq + Hkv) return;
  const bool isq = h < Hq;
  const int hh = isq ? h : h - Hq;
  const float* src = isq ? q + (size_t)m * ldq + hh * 256 : k + (size_t)m * ldk + hh * 256;
  const float* nw = isq ? qnw : knw;
  float e[8];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    e[i] = src[lane + 32 * i];
    ss += e[i] * e[i];
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / 256.f + eps);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = e[i] * r * (1.f + nw[lane + 32 * i]);
  const int p = pos[m];
  const int half = rot / 2;  // rot == 64: pairs (d, d + 32) for d < 32 live in e[0], e[1] of lane d
  if (lane < half) {
    const float inv_freq = exp2f(-(2.f * lane / rot) * log2_theta);
    float sn, cs;
    sincosf((float)p * inv_freq, &sn, &cs);
    const float a = e[0], b = e[1];
    e[0] = a * cs - b * sn;
    e[1] = b * cs + a * sn;
  }
  if (isq) {
    float* dst = qout + ((size_t)m * Hq + hh) * 256;
#pragma unroll
    for (int i = 0; i < 8; ++i) dst[lane + 32 * i] = e[i];
  } else {
    const int page = page_table[(size_t)m * pt_stride + p / KV_PAGE];
    const size_t off = (((size_t)page * KV_PAGE + p % KV_PAGE) * Hkv + hh) * 256;
    const float* vs = v + (size_t)m * ldv + hh * 256;
    if (ks == nullptr) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        kc[off + lane + 32 * i] = __bfloat16_as_ushort(__float2bfloat16_rn(e[i]));
        vc[off + lane + 32 * i] = __bfloat16_as_ushort(__float2bfloat16_rn(vs[lane + 32 * i]));
      }
    } else {
      float ve[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) ve[i] = vs[lane + 32 * i];
      const size_t soff = (((size_t)page * KV_PAGE + p % KV_PAGE) * Hkv + hh) * 4;
      quant_g64(e, reinterpret_cast<signed char*>(kc) + off, ks + soff, lane);
      quant_g64(ve, reinterpret_cast<signed char*>(vc) + off, vs8 + soff, lane);
    }
  }
}

// The split-K decode attention kernels' parameters (attn_decode_split, attn_decode_tt).
#define ATTN_DECODE_PARAMS                                                                                  \
  const float* __restrict__ q, const unsigned short* __restrict__ kc, const unsigned short* __restrict__ vc, \
      const int* __restrict__ pos, const int* __restrict__ page_table, int pt_stride, int Hkv, int chunk,  \
      float scale, float* __restrict__ part_ml, float* __restrict__ part_acc, int nsplit,                  \
      const __half* __restrict__ ks, const __half* __restrict__ vsc

// Their first statements: block coordinates, the split's token range and the per-head registers (begin).
// GS: blocks a KV head's query group is cut into (blockIdx.x = vh, its G query heads vh G.., KV head vh / GS):
// fewer registers a thread (G heads, not G GS), more blocks an SM; each block reads the KV head's rows.
#define ATTN_DECODE_BEGIN(G, GS)                                                                           \
  NI_PDL_ENTRY();                                                                                          \
  const int vh = blockIdx.x, kvh = vh / (GS), split = blockIdx.y, m = blockIdx.z;                          \
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;                                              \
  const int Hq = Hkv * G * (GS);                                                                           \
  int t0, t1;                                                                                              \
  float qr[G][8], mx[G], ls[G], acc[G][8];                                                                 \
  attn_decode_begin<G>(q, pos, chunk, scale, nsplit, Hq, vh, split, m, lane, t0, t1, qr, mx, ls, acc)

// The split-K decode attention kernels' common parts. begin: the split's token range [t0, t1) of the
// tokens there are now (not the maximum context: every block has work at any depth; `chunk` caps a split's
// share so that nsplit * chunk always covers the context), the G query rows (scaled, 8 dims a lane) and the
// running max / sum / accumulator. merge: the 8 warps' partial results of each head into the split's
// (max, sum, accumulator), thread d handling dimension d.
template <int G>
__device__ __forceinline__ void attn_decode_begin(const float* __restrict__ q, const int* __restrict__ pos, int chunk,
                                                  float scale, int nsplit, int Hq, int kvh, int split, int m, int lane,
                                                  int& t0, int& t1, float (&qr)[G][8], float (&mx)[G], float (&ls)[G],
                                                  float (&acc)[G][8]) {
  const int L = pos[m] + 1;
  const int per = min(chunk, (L + nsplit - 1) / nsplit);
  t0 = split * per;
  t1 = min(t0 + per, L);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float* qh = q + ((size_t)m * Hq + kvh * G + g) * 256 + lane * 8;
    const float4 a = reinterpret_cast<const float4*>(qh)[0], b = reinterpret_cast<const float4*>(qh)[1];
    qr[g][0] = a.x * scale; qr[g][1] = a.y * scale; qr[g][2] = a.z * scale; qr[g][3] = a.w * scale;
    qr[g][4] = b.x * scale; qr[g][5] = b.y * scale; qr[g][6] = b.z * scale; qr[g][7] = b.w * scale;
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    mx[g] = -INFINITY; ls[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }
}

template <int G>
__device__ __forceinline__ void attn_decode_merge(const float (&mx)[G], const float (&ls)[G], const float (&acc)[G][8],
                                                  float* __restrict__ part_ml, float* __restrict__ part_acc, int nsplit,
                                                  int Hq, int kvh, int split, int m, int lane, int warp) {
  __shared__ float sm_m[8][G], sm_l[8][G];
  __shared__ float sm_acc[8][256];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) { sm_m[warp][g] = mx[g]; sm_l[warp][g] = ls[g]; }
#pragma unroll
    for (int i = 0; i < 8; ++i) sm_acc[warp][lane * 8 + i] = acc[g][i];
    __syncthreads();
    // Merge the 8 warps: thread d handles dimension d.
    const int d = threadIdx.x;
    float M_ = -INFINITY;
    for (int w = 0; w < 8; ++w) M_ = fmaxf(M_, sm_m[w][g]);
    float Ls = 0.f, A = 0.f;
    if (M_ > -INFINITY) {
      for (int w = 0; w < 8; ++w) {
        const float c = sm_m[w][g] > -INFINITY ? __expf(sm_m[w][g] - M_) : 0.f;
        Ls += sm_l[w][g] * c;
        A += sm_acc[w][d] * c;
      }
    }
    const size_t hs = ((size_t)m * Hq + kvh * G + g) * nsplit + split;
    part_acc[hs * 256 + d] = A;
    if (d == 0) { part_ml[hs * 2] = M_; part_ml[hs * 2 + 1] = Ls; }
    __syncthreads();
  }
}

// Split-K decode attention. grid (Hkv GS, nsplit, M), block 256 (8 warps). Each warp walks tokens of
// this split, lane l holding dims [8l, 8l+8) (16-byte loads of a 512-byte bf16 row), G query heads.
// Writes per (m, q head, split): running max, sum and the unnormalised accumulator.
template <int G, bool KV8, int GS = 1>
__global__ void __launch_bounds__(256) attn_decode_split(ATTN_DECODE_PARAMS) {
  ATTN_DECODE_BEGIN(G, GS);
  for (int t = t0 + warp; t < t1; t += 8) {
    const int page = page_table[(size_t)m * pt_stride + t / KV_PAGE];
    const size_t row = ((size_t)page * KV_PAGE + t % KV_PAGE) * Hkv + kvh;
    const size_t off = row * 256 + lane * 8;
    float kf[8], vf[8];
    if constexpr (KV8) {
      const uint2 kv = __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const signed char*>(kc) + off));
      const uint2 vv = __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const signed char*>(vc) + off));
      const float sk = __half2float(ks[row * 4 + (lane >> 3)]), sv = __half2float(vsc[row * 4 + (lane >> 3)]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        kf[i] = sk * (float)(signed char)(kv.x >> (8 * i));
        kf[i + 4] = sk * (float)(signed char)(kv.y >> (8 * i));
        vf[i] = sv * (float)(signed char)(vv.x >> (8 * i));
        vf[i + 4] = sv * (float)(signed char)(vv.y >> (8 * i));
      }
    } else {
      const uint4 kv = __ldg(reinterpret_cast<const uint4*>(kc + off));
      const uint4 vv = __ldg(reinterpret_cast<const uint4*>(vc + off));
      const unsigned int kw[4] = {kv.x, kv.y, kv.z, kv.w}, vw[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        kf[2 * i] = bf16_lo(kw[i]); kf[2 * i + 1] = bf16_hi(kw[i]);
        vf[2 * i] = bf16_lo(vw[i]); vf[2 * i + 1] = bf16_hi(vw[i]);
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) s += qr[g][i] * kf[i];
      s = warp_sum(s);
      const float nm = fmaxf(mx[g], s);
      const float c = __expf(mx[g] - nm), pexp = __expf(s - nm);
      ls[g] = ls[g] * c + pexp;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * c + pexp * vf[i];
      mx[g] = nm;
    }
  }
  attn_decode_merge<G>(mx, ls, acc, part_ml, part_acc, nsplit, Hq, vh, split, m, lane, warp);
}

// Prefill attention's softmax over fp32 scores [rows, n] (rows = query heads x T of a query block, the
// query index t = row % T at position q_start + t sees keys 0..q_start + t): p = softmax as fp16 [rows, n],
// zero past the causal limit. One block per row; one pass for the running max and sum, one to write.
extern "C" __global__ void causal_softmax_f16(const float* __restrict__ s, __half* __restrict__ p, int n, int T,
                                              int q_start) {
  NI_PDL_ENTRY();
  __shared__ float rm[32], rl[32];
  const size_t r = blockIdx.x;
  const int lim = min(n, q_start + (int)(r % T) + 1);
  const float* sr = s + r * n;
  __half* pr = p + r * n;
  float m = -INFINITY, l = 0.f;
  for (int j = threadIdx.x; j < lim; j += blockDim.x) {
    const float v = sr[j];
    if (v > m) {
      l = l * __expf(m - v) + 1.f;
      m = v;
    } else {
      l += __expf(v - m);
    }
  }
  // combine the (max, sum) pairs: within the warp, then across warps
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    const float mm = fmaxf(m, m2);
    l = (m == -INFINITY ? 0.f : l * __expf(m - mm)) + (m2 == -INFINITY ? 0.f : l2 * __expf(m2 - mm));
    m = mm;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) { rm[warp] = m; rl[warp] = l; }
  __syncthreads();
  float mb = -INFINITY;
  for (int i = 0; i < nw; ++i) mb = fmaxf(mb, rm[i]);
  float lb = 0.f;
  for (int i = 0; i < nw; ++i) lb += rm[i] == -INFINITY ? 0.f : rl[i] * __expf(rm[i] - mb);
  const float inv = 1.f / lb;
  for (int j = threadIdx.x; j < n; j += blockDim.x) pr[j] = __float2half_rn(j < lim ? __expf(sr[j] - mb) * inv : 0.f);
}

// Prefill SwiGLU over a chunk, in one pass: out[t][i] = fp16(silu(gu[t][i]) * gu[t][n + i]) for the T
// rows of the gate|up GEMM output (row stride ldgu), written as the down projection's fp16 GEMM input (the
// cast the GEMM's input takes anyway). n % 4 == 0 and ldgu % 4 == 0. swiglu_rows_f16 reads an fp32 product
// (float4 reads), swiglu_rows_h an fp16 one (the GEMM writing half the bytes: silu(gate) * up in fp32 of the
// fp16 gate and up); load4(p) gives the 4 values at p as a float4.
template <typename T, typename Load4>
__device__ __forceinline__ void swiglu_rows_body(const T* __restrict__ gu, long long ldgu, int n, int rows,
                                                 __half* __restrict__ out, Load4 load4) {
  const int n4 = n >> 2;
  const long long total = (long long)rows * n4;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long t = i / n4;
    const int c = (int)(i - t * n4) * 4;
    const float4 g = load4(gu + t * ldgu + c);
    const float4 u = load4(gu + t * ldgu + n + c);
    const __half2 a = __floats2half2_rn(silu(g.x) * u.x, silu(g.y) * u.y);
    const __half2 b = __floats2half2_rn(silu(g.z) * u.z, silu(g.w) * u.w);
    uint2 o;
    o.x = *reinterpret_cast<const unsigned int*>(&a);
    o.y = *reinterpret_cast<const unsigned int*>(&b);
    *reinterpret_cast<uint2*>(out + t * n + c) = o;
  }
}

extern "C" __global__ void swiglu_rows_f16(const float* __restrict__ gu, long long ldgu, int n, int rows,
                                           __half* __restrict__ out) {
  NI_PDL_ENTRY();
  swiglu_rows_body(gu, ldgu, n, rows, out, [](const float* p) { return *reinterpret_cast<const float4*>(p); });
}

extern "C" __global__ void swiglu_rows_h(const __half* __restrict__ gu, long long ldgu, int n, int rows,
                                         __half* __restrict__ out) {
  NI_PDL_ENTRY();
  swiglu_rows_body(gu, ldgu, n, rows, out, [](const __half* p) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    const float2 lo = __half22float2(u32_as_half2(w.x)), hi = __half22float2(u32_as_half2(w.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  });
}

// The prefill attention's output gate: out[t][h*D + j] = o[h][t][j] * sigmoid(gate[t][h*D + j]) for
// the per-head outputs o [H, T, D] (the GEMMs' layout) into token rows (row strides ldg, ldo).
extern "C" __global__ void gate_heads(const float* __restrict__ o, int T, int H, int D,
                                      const float* __restrict__ gate, int ldg, float* __restrict__ out, int ldo) {
  NI_PDL_ENTRY();
  const int w = H * D;
  const long long total = (long long)T * w;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long t = i / w;
    const int c = (int)(i - t * w), h = c / D, j = c - h * D;
    out[t * ldo + c] = o[((long long)h * T + t) * D + j] * sigmoidf_(gate[t * ldg + c]);
  }
}
