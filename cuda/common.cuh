// Shared helpers for ninfer's CUDA kernels: warp reductions, fp16 magic-number decoding.
//
// All kernels are compiled together as one NVRTC module (engine/gpu/launch.py inlines this file).
// Activations between kernels are fp32; quantized weights stay in their row-split planes.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define NI_WARP 32

// Programmatic dependent launch (sm_90; engine/gpu/launch.py launches with the attribute where the plan's pdl is on).
// Every kernel calls NI_PDL_ENTRY() before touching memory another kernel writes: the next kernel in the
// stream may then start (and, in the GEMVs, prefetch its weights) while this one finishes. Both are
// no-ops for a launch without the attribute, so the same code runs either way.
// (griddepcontrol is sm_90: older builds compile them to nothing; kernels.pdl_capable launches plainly there.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NI_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define NI_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define NI_PDL_TRIGGER() do { } while (0)
#define NI_PDL_WAIT() do { } while (0)
#endif
#define NI_PDL_ENTRY() do { NI_PDL_TRIGGER(); NI_PDL_WAIT(); } while (0)

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of up to 1024 threads; `scratch` holds 32 floats. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarp ? scratch[lane] : 0.f;
  return warp_sum(t);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nwarp ? scratch[lane] : 0.f;
  return warp_max(t);
}

// The staged GEMV input of the q4/q5/q6 formats (x "pairs", written once by the producing kernel, see gemv.cu):
// int16 pairs (x0, x2), (x4, x6), (x1, x3), (x5, x7) of each 8 values, scaled so that |x| <= STAGE_MAX, for the dp2a
// decode (gemv_decode.cu dot_i16). STAGE_MAX = 127 x 256 + 127: every x is 256 hi + lo with both signed bytes (the
// packed twin below).
#define STAGE_MAX 32639.f
// Values (a, a + STAGE_GAP) of pair jp (0..3) among the 8 values of a slot: a = stage_a(jp).
#define STAGE_GAP 2
__device__ __forceinline__ int stage_a(int jp) { return ((jp & 1) << 2) | (jp >> 1); }

// One staged pair from two scaled values.
__device__ __forceinline__ unsigned int stage_pack(float a, float b) {
  return ((unsigned int)__float2int_rn(a) & 0xffffu) | ((unsigned int)__float2int_rn(b) << 16);
}

// The packed twin of up to 4 staged rows (gemv_tc's one-MMA form for q4-q6, tc_run_pk): for each 64-value group G,
// 32 lanes x 16 bytes at (32 G + lane) x 16, lane 4 g + t holding the B fragment of its two MMA steps: column g's
// signed high bytes (g < 4) or column g - 4's signed low bytes (x = 256 hi + lo, lo in -128..127). Value p (0..7) of
// slot c of chunk j, as the pairs hold them (words x, y, z, w, two values each), is byte 8 (c & 1) + p of lane
// t = 2 (j & 1) + (c >> 1) of group j >> 1. Columns past the rows staged stay zero; so do the groups past kpad.
// pk_word: pair word jp of slot c of chunk j of row m, in the twin pk (its caller skips a null twin); pk_slot: a whole
// slot, nothing for a null twin.
__device__ __forceinline__ unsigned int pk_hi2(unsigned int w) {  // the high bytes of the word's two values
  const int a = (int)(w << 16) >> 16, b = (int)w >> 16;
  return (((a + 128) >> 8) & 0xffu) | ((((b + 128) >> 8) & 0xffu) << 8);
}
__device__ __forceinline__ size_t pk_at(int m, int j, int c) {  // byte 0 of slot c of chunk j, row m's high lane
  return ((size_t)(j >> 1) * 32 + 4 * m + 2 * (j & 1) + (c >> 1)) * 16 + (c & 1) * 8;
}
__device__ __forceinline__ void pk_word(unsigned char* pk, int m, int j, int c, int jp, unsigned int w) {
  unsigned char* p = pk + pk_at(m, j, c) + 2 * jp;
  *reinterpret_cast<unsigned short*>(p) = (unsigned short)pk_hi2(w);
  *reinterpret_cast<unsigned short*>(p + 256) = (unsigned short)__byte_perm(w, 0u, 0x0020u);  // (lane 4 (m + 4) + t)
}
// (the uint4 of words x, y, z, w)
__device__ __forceinline__ void pk_slot(unsigned char* pk, int m, int j, int c, uint4 w) {
  if (pk == nullptr) return;
  unsigned char* p = pk + pk_at(m, j, c);
  *reinterpret_cast<uint2*>(p) = make_uint2(pk_hi2(w.x) | (pk_hi2(w.y) << 16), pk_hi2(w.z) | (pk_hi2(w.w) << 16));
  *reinterpret_cast<uint2*>(p + 256) = make_uint2(__byte_perm(w.x, w.y, 0x6420u), __byte_perm(w.z, w.w, 0x6420u));
}

// The power of two that scales a row whose largest |value| is mx to at most `target` (STAGE_MAX: the
// staged GEMV input).
__device__ __forceinline__ float pow2_scale(float mx, float target = STAGE_MAX) {
  float sc = 1.f;
  if (mx > 0.f) {
    int e;
    frexpf(target / mx, &e);
    sc = ldexpf(1.f, e - 1);
  }
  return sc;
}

__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + __expf(-x)); }

// Code that needs sm_80 (mma.sync on bf16/fp16/tf32, cp.async) compiles to a trap below it; the engine
// refuses those GPUs (engine.gpu.plan.build_plan).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define NI_PRE_SM80 1
#else
#define NI_PRE_SM80 0
#endif

// Weight streams of the GEMVs: each 16-byte chunk is read once a step, so it should not push out of L1
// what is read again (a GEMV's x pairs, re-read for every row): ld.global.nc with L1::no_allocate.
__device__ __forceinline__ uint4 ldw(const uint4* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
__device__ __forceinline__ uint2 ldw(const uint2* p) {
  uint2 r;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}
__device__ __forceinline__ unsigned int ldw(const unsigned int* p) {
  unsigned int r;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
}

// Asynchronous global -> shared copies (sm_80 and newer; empty below, see NI_PRE_SM80): 16 bytes through L2 only,
// 4 bytes through L1, to dst a shared-window offset (__cvta_generic_to_shared of the destination: a caller that
// copies into fixed stages computes it once); a thread's copies since the last commit form one group, wait<N>
// leaves N groups in flight.
__device__ __forceinline__ void ni_cp16(unsigned dst, const void* src) {
#if !NI_PRE_SM80
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void ni_cp4(unsigned dst, const void* src) {
#if !NI_PRE_SM80
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
#endif
}
__device__ __forceinline__ void ni_cp_commit() {
#if !NI_PRE_SM80
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void ni_cp_wait() {
#if !NI_PRE_SM80
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ __half2 u32_as_half2(unsigned int u) {
  return *reinterpret_cast<__half2*>(&u);
}

__device__ __forceinline__ unsigned int half2_as_u32(__half2 h) {
  return *reinterpret_cast<unsigned int*>(&h);
}

// Row y[0, K) (fp32, written by other blocks of the same kernel: read through L2 only) staged by one block as
// the GEMV's pairs of kpad values, scaled by sc: the same values as stage_slice (norm.cu), laid out
// by octets: 8 consecutive values k = 8o.. are the 4 pairs (stage_pack) of slot o & 3 of chunk o >> 2,
// one 16-byte store at uint4 (j >> 5) * 128 + c * 32 + (j & 31). Four octets' loads in flight a thread
// (a single block walking the row one dependent L2 round per pair took ~20 us for 17,408 values).
__device__ __forceinline__ void stage_row_cg(const float* __restrict__ y, int K, int kpad, uint4* __restrict__ dst,
                                             float sc, unsigned char* pk = nullptr, int pm = 0) {
  const int nocts = kpad / 8;
  const bool vec = ((size_t)y & 15) == 0;
  for (int o0 = threadIdx.x; o0 < nocts; o0 += 4 * blockDim.x) {
    float v[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int o = o0 + i * blockDim.x, k0 = o * 8;
      if (vec && o < nocts && k0 + 8 <= K) {
        const float4 a = __ldcg(reinterpret_cast<const float4*>(y + k0));
        const float4 b = __ldcg(reinterpret_cast<const float4*>(y + k0 + 4));
        v[i][0] = a.x; v[i][1] = a.y; v[i][2] = a.z; v[i][3] = a.w;
        v[i][4] = b.x; v[i][5] = b.y; v[i][6] = b.z; v[i][7] = b.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[i][e] = (o < nocts && k0 + e < K) ? __ldcg(y + k0 + e) : 0.f;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int o = o0 + i * blockDim.x;
      if (o < nocts) {
        const int j = o >> 2, c = o & 3;
        uint4 w;
        w.x = stage_pack(v[i][stage_a(0)] * sc, v[i][stage_a(0) + STAGE_GAP] * sc);
        w.y = stage_pack(v[i][stage_a(1)] * sc, v[i][stage_a(1) + STAGE_GAP] * sc);
        w.z = stage_pack(v[i][stage_a(2)] * sc, v[i][stage_a(2) + STAGE_GAP] * sc);
        w.w = stage_pack(v[i][stage_a(3)] * sc, v[i][stage_a(3) + STAGE_GAP] * sc);
        dst[(j >> 5) * 128 + c * 32 + (j & 31)] = w;
        pk_slot(pk, pm, j, c, w);
      }
    }
  }
}

// Row [0, K) of `row` staged by the block that finishes last among `nblocks`: every block folds the largest
// |value| it wrote (mx, read in thread 0; the values fenced by the threads that wrote them, then a
// __syncthreads, before the call) into *amax (atomicMax on the bits: values >= 0 order as unsigned) and
// takes a ticket; the block with the last one stages the row (stage_row_cg, the scale of the exact max)
// and resets both words for the next use. Called by every thread of every block.
__device__ __forceinline__ void stage_row_by_last_block(float mx, unsigned int* amax, unsigned int* ticket,
                                                        unsigned int nblocks, const float* row, int K, int kpad,
                                                        uint4* dst, float* xinv, unsigned char* pk = nullptr,
                                                        int pm = 0) {
  __shared__ int last;
  __shared__ float gmax;
  if (threadIdx.x == 0) {
    atomicMax(amax, __float_as_uint(mx));
    __threadfence();
    last = atomicAdd(ticket, 1u) == nblocks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) gmax = __uint_as_float(atomicAdd(amax, 0u));
  __syncthreads();
  const float sc = pow2_scale(gmax);
  stage_row_cg(row, K, kpad, dst, sc, pk, pm);
  if (threadIdx.x == 0) {
    *xinv = 1.f / sc;
    *amax = 0u;
    *ticket = 0u;
  }
}

__device__ __forceinline__ float bf16_lo(unsigned int u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }

// The chunked GDN prefill's in-order pass (gdn_chunk_scan in gdn_chunked.cu, gdn_chunk_scan_tc in gdn_tc.cu): one
// 64-token piece into shared memory: W (pass 1's), K and Q of key head kh (rows of stride KS, zero past
// the n valid tokens), M (stride MS), this block's RB columns of U' (stride US), the cumulative log decay
// G with e^G and e^(G_L - G). 256 threads; the caller synchronizes.
template <int RB, int KS, int MS, int US>
__device__ __forceinline__ void gdn_piece_load(const float* __restrict__ qn, const float* __restrict__ kn,
                                               const float* __restrict__ Wg, const float* __restrict__ Ug,
                                               const float* __restrict__ Mg, const float* __restrict__ Gg, int Hk,
                                               int kh, int dv0, int c0, int n, size_t ph, float* Ws, float* Ks,
                                               float* Qs, float* Ms, float* Us, float* Gs, float* EG, float* TL) {
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * 128; i += 256) {
    const int t = i >> 7, d = i & 127;
    const size_t src = ((size_t)(c0 + t) * Hk + kh) * 128 + d;
    Ws[t * KS + d] = Wg[ph * 64 * 128 + i];
    Ks[t * KS + d] = t < n ? kn[src] : 0.f;
    Qs[t * KS + d] = t < n ? qn[src] : 0.f;
  }
  for (int i = tid; i < 64 * 64; i += 256) Ms[(i >> 6) * MS + (i & 63)] = Mg[ph * 64 * 64 + i];
  for (int i = tid; i < 64 * RB; i += 256) {
    const int t = i / RB, j = i % RB;
    Us[t * US + j] = Ug[(ph * 64 + t) * 128 + dv0 + j];
  }
  if (tid < 64) {
    const float gt = Gg[ph * 64 + tid], gl = Gg[ph * 64 + n - 1];
    Gs[tid] = gt;
    EG[tid] = expf(gt);
    TL[tid] = expf(gl - gt);
  }
}
