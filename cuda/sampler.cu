#include "common.cuh"

// Sampling on the device: temperature, top-k, top-p, min-p, drawn with engine/sampling.py's counter RNG. It
// commits its token with sample.cu's argmax_commit (and merges maxima with argmax_merge / argmax_block), so it
// follows sample.cu in kernels.SOURCES.
//
// The same token as engine.sampling.Sampler for the same (seed, position): the sampler's universe U is the ids
// of [0, D) within 30 temperatures of the row max (and with weight >= min_p when min_p > 0), ordered by
// (logit desc, id asc); top-k keeps the first K1 = min(top_k, |U|); top-p keeps the first K2 whose cumulative
// weight over the K1's reaches top_p; the draw takes the first id whose cumulative weight over the K2's
// exceeds u = counter_uniform(seed, position, purpose). Weights are exp((x - max) / T) in double, as on the host.
//
// Two launches a step. sample_max_mb: the row max (per-block partials). sample_step_mb: every block sorts the
// ids of its slice that are in U into SAMPLE_Q buckets of 1/SAMPLE_R temperature below the max (a count and a
// double weight sum per bucket) and appends the ids of the top SAMPLE_QTOP buckets to a candidate list; the
// last block (ticket) merges the bucket histograms, finds the bucket where each cut falls (K1 by counts, K2
// and the draw by cumulative weight), and resolves only those buckets id by id: their ids come from the
// candidate list (or a rescan of the row when the bucket is deeper or the list overflowed), sorted in
// shared memory by (logit desc, id asc) with an inclusive double scan of their weights. A bucket of more
// than SAMPLE_CAP ids (a flat row: ties) is resolved exactly by bisection over the 64-bit sort key instead
// (one row scan a step; slow, but no id is dropped). Nothing is capped: every id of U counts.
//
// Floating point: every membership test, weight and bucket index is the host's double arithmetic
// (x - max) / T and exp; only the order of the additions differs (bucket sums, a parallel scan, and the
// shared-memory atomics of the histogram, whose order varies run to run), so a token can differ from the
// host's only when u (or top_p) lies within a few ulps of a cumulative boundary, or an id's weight sits
// within an ulp of min_p (double exp here vs NumPy's).
#define SAMPLE_R 16                   // buckets per temperature
#define SAMPLE_Q (30 * SAMPLE_R + 1)  // buckets over the 30-temperature margin (the last holds its edge)
#define SAMPLE_QTOP (4 * SAMPLE_R)    // buckets (4 temperatures) whose ids go to the candidate list
#define SAMPLE_CAP 2048               // ids of one bucket sorted in shared memory (2 a thread)
#define SAMPLE_THREADS 1024
#define SAMPLE_PARAMS 8               // u64 a row: T, top_p, min_p (double bits), top_k, seed, purpose

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// engine.sampling.counter_uniform
__device__ __forceinline__ double counter_uniform(unsigned long long seed, long long position, unsigned long long purpose) {
  const unsigned long long z = splitmix64(splitmix64(splitmix64(seed) ^ (unsigned long long)position) ^ purpose);
  return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

// the sort key: larger logit first, then lower id
__device__ __forceinline__ unsigned long long sample_key(float x, int id) {
  const unsigned int b = __float_as_uint(x);
  const unsigned int o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((unsigned long long)o << 32) | (0xffffffffu - (unsigned int)id);
}
__device__ __forceinline__ float key_logit(unsigned long long k) {
  const unsigned int o = (unsigned int)(k >> 32);
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}
__device__ __forceinline__ int key_id(unsigned long long k) { return (int)(0xffffffffu - (unsigned int)k); }

struct SampleCtx {
  double M, T, thr, min_p;  // row max, temperature, margin edge max - 30 T, min_p
};

// The id's bucket (-1: not in U) and, when wanted (q == want or want < 0), its weight. t is the host's
// (x - max) / T; the bucket needs no exp, so scans for one bucket take exp only of that bucket's ids.
__device__ __forceinline__ int sample_q(double t) { return min(SAMPLE_Q - 1, (int)(-t * SAMPLE_R)); }

__device__ __forceinline__ int sample_bucket(float xf, const SampleCtx& c, int want, double& w) {
  const double x = (double)xf;
  if (!(x >= c.thr)) return -1;
  const double t = (x - c.M) / c.T;
  const int q = sample_q(t);
  if (want >= 0 && q != want) return q;
  w = exp(t);
  if (c.min_p > 0.0 && !(w >= c.min_p)) return -1;
  return q;
}

__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// max (is_max) or min of a u64 over the block, in every thread
__device__ __forceinline__ unsigned long long block_ext_u64(unsigned long long v, bool is_max, unsigned long long* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? max(v, u) : min(v, u);
  }
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : (is_max ? 0ull : ~0ull);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? max(v, u) : min(v, u);
  }
  return v;
}

enum { CUT_RANK = 0, CUT_GE = 1, CUT_GT = 2 };

// A cut: the first id (in sampler order) whose rank reaches `cap`, or, before that, whose cumulative weight
// over `denom` is >= (CUT_GE: top-p) or > (CUT_GT: the draw) `target`.
struct SampleCut {
  int mode;
  long long cap;
  double target, denom;
  __device__ __forceinline__ bool ok(long long rank, double cum) const {
    if (rank >= cap) return true;
    if (mode == CUT_GE) return cum / denom >= target;
    if (mode == CUT_GT) return cum / denom > target;
    return false;
  }
};

struct SampleHit {
  int found, id;
  long long rank;
  double cum, sum;  // sum: the bucket's weight when not found
};

// Shared state of the last block.
struct SampleSmem {
  int cnt[SAMPLE_Q + 1];
  int cb[SAMPLE_Q + 1];  // exclusive prefix of cnt (cb[Q]: |U|)
  double mass[SAMPLE_Q + 1];
  double wb[SAMPLE_Q + 1];  // exclusive prefix of mass
  unsigned long long key[SAMPLE_CAP];
  double pre[SAMPLE_CAP];
  double red_d[32];
  unsigned long long red_u[32];
  int n, first;
};

// The bucket's ids, sorted by key (descending) with inclusive weight sums, tested against the cut; the
// ids come from the candidate list when it holds the bucket, else from the row.
__device__ SampleHit sample_bucket_sorted(int q, long long rank0, double cum0, const SampleCut& cut, const float* l, int D,
                                          const SampleCtx& c, const unsigned long long* cand, int ncand, bool from_cand,
                                          SampleSmem& s) {
  const int tid = threadIdx.x, nt = blockDim.x;
  const int n = s.cnt[q];
  if (tid == 0) s.n = 0;
  __syncthreads();
  if (from_cand) {
    for (int i = tid; i < ncand; i += nt) {
      const unsigned long long k = __ldcg(cand + i);
      if (sample_q(((double)key_logit(k) - c.M) / c.T) == q) {  // (in U: tested when it was listed)
        const int slot = atomicAdd(&s.n, 1);
        if (slot < SAMPLE_CAP) s.key[slot] = k;
      }
    }
  } else {
    for (int i = tid; i < D; i += nt) {
      const float x = l[i];
      double w;
      if (sample_bucket(x, c, q, w) == q) {
        const int slot = atomicAdd(&s.n, 1);
        if (slot < SAMPLE_CAP) s.key[slot] = sample_key(x, i);
      }
    }
  }
  __syncthreads();
  int npad = 1;
  while (npad < n) npad <<= 1;
  for (int i = n + tid; i < npad; i += nt) s.key[i] = 0ull;  // pads sort last
  __syncthreads();
  for (int k = 2; k <= npad; k <<= 1) {  // bitonic sort, descending
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < npad; i += nt) {
        const int p = i ^ j;
        if (p > i) {
          const unsigned long long a = s.key[i], b = s.key[p];
          if (((i & k) == 0) ? (a < b) : (a > b)) { s.key[i] = b; s.key[p] = a; }
        }
      }
      __syncthreads();
    }
  }
  // inclusive scan of the weights, two consecutive ids a thread (SAMPLE_CAP == 2 * SAMPLE_THREADS)
  const int i0 = 2 * tid;
  double a = 0.0, b = 0.0;
  if (i0 < n) a = exp(((double)key_logit(s.key[i0]) - c.M) / c.T);
  if (i0 + 1 < n) b = exp(((double)key_logit(s.key[i0 + 1]) - c.M) / c.T);
  const double tot = a + b;
  const int lane = tid & 31, warp = tid >> 5;
  double incl = tot;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  if (lane == 31) s.red_d[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    double v = lane < (nt >> 5) ? s.red_d[lane] : 0.0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += u;
    }
    s.red_d[lane] = v;  // inclusive over warps
  }
  __syncthreads();
  const double off = (warp ? s.red_d[warp - 1] : 0.0) + (incl - tot);
  if (i0 < n) s.pre[i0] = off + a;
  if (i0 + 1 < n) s.pre[i0 + 1] = off + a + b;
  if (tid == 0) s.first = 0x7fffffff;
  __syncthreads();
  for (int i = i0; i < min(i0 + 2, n); ++i)
    if (cut.ok(rank0 + i + 1, cum0 + s.pre[i])) atomicMin(&s.first, i);
  __syncthreads();
  SampleHit h;
  const int f = s.first;
  h.found = f < n;
  h.id = h.found ? key_id(s.key[f]) : -1;
  h.rank = rank0 + (h.found ? f + 1 : n);
  h.cum = cum0 + (h.found ? s.pre[f] : 0.0);
  h.sum = n > 0 ? s.pre[n - 1] : 0.0;
  __syncthreads();
  return h;
}

// count and weight of the bucket's ids with key >= k (a row scan)
__device__ __forceinline__ void sample_stats(int q, unsigned long long k, const float* l, int D, const SampleCtx& c,
                                             SampleSmem& s, long long& cnt, double& sum) {
  double w, acc = 0.0, n = 0.0;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float x = l[i];
    if (sample_bucket(x, c, q, w) == q && sample_key(x, i) >= k) { acc += w; n += 1.0; }
  }
  sum = block_sum_d(acc, s.red_d);
  cnt = (long long)block_sum_d(n, s.red_d);  // exact: counts < 2^53
}

// The same for a bucket of more than SAMPLE_CAP ids: the first id satisfying the cut is the largest key k
// with cut(stats(k)) (stats only grow as k falls), found by bisection over the keys of the bucket.
__device__ SampleHit sample_bucket_bisect(int q, long long rank0, double cum0, const SampleCut& cut, const float* l, int D,
                                          const SampleCtx& c, SampleSmem& s) {
  unsigned long long lo = ~0ull, hi = 0ull;
  double w;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float x = l[i];
    if (sample_bucket(x, c, q, w) == q) {
      const unsigned long long k = sample_key(x, i);
      lo = min(lo, k);
      hi = max(hi, k);
    }
  }
  lo = block_ext_u64(lo, false, s.red_u);
  hi = block_ext_u64(hi, true, s.red_u);
  long long n;
  double sum;
  sample_stats(q, lo, l, D, c, s, n, sum);
  SampleHit h;
  h.sum = sum;
  if (!cut.ok(rank0 + n, cum0 + sum)) {
    h.found = 0; h.id = -1; h.rank = rank0 + n; h.cum = cum0 + sum;
    return h;
  }
  while (lo < hi) {
    const unsigned long long mid = lo + (hi - lo) / 2 + 1;
    sample_stats(q, mid, l, D, c, s, n, sum);
    if (cut.ok(rank0 + n, cum0 + sum)) lo = mid; else hi = mid - 1;
  }
  sample_stats(q, lo, l, D, c, s, n, sum);
  h.found = 1; h.id = key_id(lo); h.rank = rank0 + n; h.cum = cum0 + sum;
  return h;
}

// Walk the buckets from qs: the first id satisfying the cut (the cap's rank always does, by the bucket
// holding it). Ranks are exact counts; weights before qs are the bucket sums, after it the id-by-id sums.
__device__ SampleHit sample_find(int qs, const SampleCut& cut, const float* l, int D, const SampleCtx& c,
                                 const unsigned long long* cand, int ncand, bool cand_ok, SampleSmem& s) {
  long long rank0 = s.cb[qs];
  double cum0 = s.wb[qs];
  SampleHit h;
  h.found = 0; h.id = -1; h.rank = 0; h.cum = 0.0; h.sum = 0.0;
  for (int q = qs; q < SAMPLE_Q; ++q) {
    if (s.cnt[q] == 0) continue;
    if (s.cnt[q] <= SAMPLE_CAP)
      h = sample_bucket_sorted(q, rank0, cum0, cut, l, D, c, cand, ncand, cand_ok && q < SAMPLE_QTOP, s);
    else
      h = sample_bucket_bisect(q, rank0, cum0, cut, l, D, c, s);
    if (h.found) return h;
    rank0 += s.cnt[q];
    cum0 += h.sum;
  }
  return h;
}

// The first bucket below qmax whose cumulative weight (bucket sums) satisfies the cut, else qmax.
__device__ int sample_first_bucket(int qmax, const SampleCut& cut, SampleSmem& s) {
  if (threadIdx.x == 0) s.first = qmax;
  __syncthreads();
  for (int q = threadIdx.x; q < qmax; q += blockDim.x)
    if (s.cnt[q] > 0 && cut.ok(0, s.wb[q] + s.mass[q])) atomicMin(&s.first, q);
  __syncthreads();
  const int r = s.first;
  __syncthreads();
  return r;
}

// logits [M, V] (row stride ldl), ids [0, D); params [M, SAMPLE_PARAMS]; part_v / part_i: [M, gridDim.x]
extern "C" __global__ void sample_max_mb(const float* __restrict__ logits, int ldl, int D, float* __restrict__ part_v,
                                         int* __restrict__ part_i) {
  NI_PDL_ENTRY();
  __shared__ float bv[32];
  __shared__ int bi[32];
  float best;
  int idx;
  argmax_slice(logits + (size_t)blockIdx.y * ldl, D, part_v, part_i, best, idx, bv, bi);
}

// After sample_max_mb (same grid). hist_c / hist_w: [M, gridDim.x, SAMPLE_Q]; cand: [M, cap_g] with cand_n [M]
// and ticket [M] zero between launches. Commits the token as argmax_step_mb does. 1024 threads a block.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_step_mb(const float* __restrict__ logits, int ldl, int D, const unsigned long long* __restrict__ params,
               const float* __restrict__ part_v, const int* __restrict__ part_i, int* __restrict__ hist_c,
               double* __restrict__ hist_w, unsigned long long* __restrict__ cand, unsigned int* __restrict__ cand_n,
               int cap_g, unsigned int* __restrict__ ticket, int* __restrict__ tokens, int* __restrict__ pos,
               int* __restrict__ history, int* __restrict__ step, int hist_len) {
  NI_PDL_ENTRY();
  __shared__ SampleSmem s;
  __shared__ float bv[32];
  __shared__ int bi[32];
  __shared__ bool last;
  const int m = blockIdx.y, nb = gridDim.x, b = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
  const float* l = logits + (size_t)m * ldl;
  const unsigned long long* p = params + (size_t)m * SAMPLE_PARAMS;
  SampleCtx c;
  c.T = __longlong_as_double((long long)p[0]);
  const double top_p = __longlong_as_double((long long)p[1]);
  c.min_p = __longlong_as_double((long long)p[2]);
  const long long top_k = (long long)p[3];
  const bool greedy = !(c.T > 0.0);  // Sampler.is_greedy: temperature <= 0
  float best = -INFINITY;
  int idx = 0x7fffffff;
  for (int j = tid; j < nb; j += nt)
    argmax_merge(best, idx, __ldcg(part_v + (size_t)m * nb + j), __ldcg(part_i + (size_t)m * nb + j));
  argmax_block(best, idx, bv, bi);
  c.M = (double)best;
  c.thr = c.M - 30.0 * c.T;  // sampling.MARGIN_TEMPERATURES
  unsigned long long* row_cand = cand + (size_t)m * cap_g;
  if (!greedy) {
    for (int q = tid; q < SAMPLE_Q; q += nt) { s.cnt[q] = 0; s.mass[q] = 0.0; }
    __syncthreads();
    const int per = (D + nb - 1) / nb, i0 = b * per, i1 = min(D, i0 + per);
    for (int i = i0 + tid; i < i1; i += nt) {
      const float x = l[i];
      double w;
      const int q = sample_bucket(x, c, -1, w);
      if (q >= 0) {
        atomicAdd(&s.cnt[q], 1);
        atomicAdd(&s.mass[q], w);
        if (q < SAMPLE_QTOP) {
          const unsigned int slot = atomicAdd(cand_n + m, 1u);
          if (slot < (unsigned)cap_g) row_cand[slot] = sample_key(x, i);
        }
      }
    }
    __syncthreads();
    const size_t h0 = ((size_t)m * nb + b) * SAMPLE_Q;
    for (int q = tid; q < SAMPLE_Q; q += nt) { hist_c[h0 + q] = s.cnt[q]; hist_w[h0 + q] = s.mass[q]; }
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(ticket + m, 1u) == (unsigned)(nb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  int token = idx;  // greedy, and min_p > 1 (U empty: the host keeps its top id)
  if (!greedy) {
    for (int q = tid; q < SAMPLE_Q; q += nt) {  // the blocks' histograms, summed in block order
      int n = 0;
      double w = 0.0;
      for (int j = 0; j < nb; ++j) {
        n += __ldcg(hist_c + ((size_t)m * nb + j) * SAMPLE_Q + q);
        w += __ldcg(hist_w + ((size_t)m * nb + j) * SAMPLE_Q + q);
      }
      s.cnt[q] = n;
      s.mass[q] = w;
    }
    __syncthreads();
    if (tid < 32) {  // exclusive prefixes over the buckets: 16 consecutive buckets a lane
      const int q0 = tid * 16;
      int n = 0;
      double w = 0.0;
      for (int q = q0; q < min(q0 + 16, SAMPLE_Q); ++q) { n += s.cnt[q]; w += s.mass[q]; }
      int ni = n;
      double wi = w;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int nu = __shfl_up_sync(0xffffffffu, ni, o);
        const double wu = __shfl_up_sync(0xffffffffu, wi, o);
        if (tid >= o) { ni += nu; wi += wu; }
      }
      int rn = ni - n;
      double rw = wi - w;
      for (int q = q0; q < min(q0 + 16, SAMPLE_Q + 1); ++q) {
        s.cb[q] = rn;
        s.wb[q] = rw;
        if (q < SAMPLE_Q) { rn += s.cnt[q]; rw += s.mass[q]; }
      }
    }
    __syncthreads();
    const long long N = s.cb[SAMPLE_Q];
    const unsigned int nc = __ldcg(cand_n + m);
    const bool cand_ok = nc <= (unsigned)cap_g;
    const int ncand = (int)min(nc, (unsigned)cap_g);
    if (N > 0) {
      int qlast = 0;  // the deepest non-empty bucket
      if (tid == 0) s.first = 0;
      __syncthreads();
      for (int q = tid; q < SAMPLE_Q; q += nt)
        if (s.cnt[q] > 0) atomicMax(&s.first, q);
      __syncthreads();
      qlast = s.first;
      __syncthreads();
      // top-k: the K1-th id and the weight through it (top-p's denominator)
      const long long K1 = (top_k > 0 && top_k < N) ? top_k : N;
      double D1 = s.wb[SAMPLE_Q];
      int q1 = qlast;
      SampleCut cut;
      if (K1 < N) {
        if (tid == 0) s.first = SAMPLE_Q;
        __syncthreads();
        for (int q = tid; q < SAMPLE_Q; q += nt)
          if (s.cnt[q] > 0 && s.cb[q] < K1 && K1 <= s.cb[q] + s.cnt[q]) s.first = q;  // exactly one bucket
        __syncthreads();
        q1 = s.first;
        __syncthreads();
        cut.mode = CUT_RANK; cut.cap = K1; cut.target = 0.0; cut.denom = 1.0;
        const SampleHit h = sample_find(q1, cut, l, D, c, row_cand, ncand, cand_ok, s);
        D1 = h.cum;
      }
      // top-p: the K2-th id and the weight through it (the draw's denominator)
      long long K2 = K1;
      double S = D1;
      int q2 = q1;
      if (top_p < 1.0) {
        cut.mode = CUT_GE; cut.cap = K1; cut.target = top_p; cut.denom = D1;
        const int qs = sample_first_bucket(q1, cut, s);
        const SampleHit h = sample_find(qs, cut, l, D, c, row_cand, ncand, cand_ok, s);
        K2 = h.rank;
        S = h.cum;
        q2 = 0;  // the bucket holding the K2-th id
        if (tid == 0) s.first = 0;
        __syncthreads();
        for (int q = tid; q < SAMPLE_Q; q += nt)
          if (s.cnt[q] > 0 && s.cb[q] < K2 && K2 <= s.cb[q] + s.cnt[q]) s.first = q;
        __syncthreads();
        q2 = s.first;
        __syncthreads();
      }
      // the draw: the first id whose cumulative weight over S exceeds u
      const double u = counter_uniform(p[4], (long long)pos[m] + 1, p[5]);
      cut.mode = CUT_GT; cut.cap = K2; cut.target = u; cut.denom = S;
      const int qs = sample_first_bucket(q2, cut, s);
      const SampleHit h = sample_find(qs, cut, l, D, c, row_cand, ncand, cand_ok, s);
      if (h.found) token = h.id;
    }
  }
  if (tid == 0) {
    argmax_commit(m, token, tokens, pos, history, step, hist_len);
    ticket[m] = 0u;
    cand_n[m] = 0u;
  }
}
