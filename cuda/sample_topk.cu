#include "common.cuh"

// Top-k sampling on the device with presence / frequency penalties, for 1 <= top_k <= TOPK_MAX: what the
// recommended settings of every model we run use (Qwen: top-k 20; ollama, llama.cpp, LM Studio: 40). One launch a
// step, whatever the shape of the row: a flat row (synthetic weights, ties) costs what a peaked one costs.
//
// engine.sampling.candidates for top_k > 0 reduces to: x = logit - presence * (count > 0) - frequency * count in
// double; the first L = min(top_k, |{x >= max - 30 T}|) ids in the order (x desc, id asc); weights
// w = exp((x - x_0) / T); min_p keeps the prefix with w >= min_p; top_p keeps the shortest prefix whose cumulative
// weight over the kept ones reaches top_p; the draw takes the first id whose cumulative probability exceeds
// u = counter_uniform(seed, position, purpose). The arithmetic here is the host's (double, the same operands); only
// the order of a few additions differs (a sum of at most TOPK_MAX weights), so a token can differ from the host's
// only when u or top_p lies within an ulp of a cumulative boundary.
//
// Every block sorts a slice of TOPK_TILE ids in shared memory (bitonic, by (x desc, id asc)) and leaves its best K;
// the last block to finish (a ticket per row) folds the blocks' lists tile by tile through the same sort and draws.
// The step's bookkeeping is argmax_commit's (sample.cu), and the drawn token's count goes up by one.
#define TOPK_MAX 64
#define TOPK_TILE 2048
#define TOPK_THREADS 1024

// order-preserving map of a double to 64 bits (larger x, larger key); 0 sorts below every real value
__device__ __forceinline__ unsigned long long topk_key(double x) {
  const unsigned long long b = (unsigned long long)__double_as_longlong(x);
  return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ double topk_val(unsigned long long k) {
  return __longlong_as_double((long long)((k & 0x8000000000000000ull) ? (k & 0x7fffffffffffffffull) : ~k));
}
__device__ __forceinline__ bool topk_before(unsigned long long ka, int ia, unsigned long long kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// the tile in (key, id) shared memory, sorted best first; TOPK_TILE entries, blockDim.x == TOPK_TILE / 2
__device__ void topk_sort(unsigned long long* key, int* id) {
  const int t = threadIdx.x;
  for (int k = 2; k <= TOPK_TILE; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      const int lo = 2 * j * (t / j) + (t % j), hi = lo + j;
      const bool best_first = (lo & k) == 0;
      const unsigned long long kl = key[lo], kh = key[hi];
      const int il = id[lo], ih = id[hi];
      if (topk_before(kh, ih, kl, il) == best_first) {
        key[lo] = kh; key[hi] = kl;
        id[lo] = ih; id[hi] = il;
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ double topk_penalized(float logit, const int* counts, int i, double presence,
                                                 double frequency) {
  const double x = (double)logit;
  if (counts == nullptr) return x;
  const int c = counts[i];
  if (c == 0) return x;
  return x - (presence * 1.0 + frequency * (double)c);  // the host's x - (presence * (c > 0) + frequency * c)
}

// logits [M, ldl]; params [M, SAMPLE_PARAMS] (T, top_p, min_p, top_k, seed, purpose, presence, frequency);
// counts [M, V] (generated-token counts); cand_key / cand_id [M, gridDim.x, TOPK_MAX]; ticket [M] zero between
// launches. Grid (ceil(D / TOPK_TILE), M), TOPK_THREADS threads. temperature must be > 0 (greedy takes the argmax).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
sample_topk_mb(const float* __restrict__ logits, int ldl, int D, const unsigned long long* __restrict__ params,
               int* __restrict__ counts, int V, unsigned long long* __restrict__ cand_key, int* __restrict__ cand_id,
               unsigned int* __restrict__ ticket, int* __restrict__ tokens, int* __restrict__ pos,
               int* __restrict__ history, int* __restrict__ step, int hist_len) {
  NI_PDL_ENTRY();
  __shared__ unsigned long long key[TOPK_TILE];
  __shared__ int id[TOPK_TILE];
  __shared__ bool last;
  const int m = blockIdx.y, nb = gridDim.x, b = blockIdx.x, t = threadIdx.x, nt = blockDim.x;
  const unsigned long long* p = params + (size_t)m * SAMPLE_PARAMS;
  const double T = __longlong_as_double((long long)p[0]);
  const double top_p = __longlong_as_double((long long)p[1]);
  const double min_p = __longlong_as_double((long long)p[2]);
  const int K = (int)min((long long)TOPK_MAX, max(1ll, (long long)p[3]));
  const double presence = __longlong_as_double((long long)p[6]);
  const double frequency = __longlong_as_double((long long)p[7]);
  const float* l = logits + (size_t)m * ldl;
  const int* cnt = (presence != 0.0 || frequency != 0.0) ? counts + (size_t)m * V : nullptr;

  const int i0 = b * TOPK_TILE;
  for (int j = t; j < TOPK_TILE; j += nt) {
    const int i = i0 + j;
    const bool in = i < D;
    key[j] = in ? topk_key(topk_penalized(l[i], cnt, i, presence, frequency)) : 0ull;
    id[j] = in ? i : 0x7fffffff;
  }
  __syncthreads();
  topk_sort(key, id);
  const size_t c0 = ((size_t)m * nb + b) * TOPK_MAX;
  for (int j = t; j < K; j += nt) { cand_key[c0 + j] = key[j]; cand_id[c0 + j] = id[j]; }
  __threadfence();
  __syncthreads();
  if (t == 0) last = atomicAdd(ticket + m, 1u) == (unsigned)(nb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();

  // fold the blocks' lists: the best K so far stay at the front of the tile, the rest of it takes the next lists
  const int total = nb * K;
  const size_t r0 = (size_t)m * nb * TOPK_MAX;
  int next = 0;
  bool first = true;
  while (next < total) {
    const int keep = first ? 0 : K, room = TOPK_TILE - keep;
    for (int j = t; j < room; j += nt) {
      const int c = next + j;
      const bool in = c < total;
      const size_t at = r0 + (size_t)(c / K) * TOPK_MAX + (c % K);
      key[keep + j] = in ? __ldcg(cand_key + at) : 0ull;
      id[keep + j] = in ? __ldcg(cand_id + at) : 0x7fffffff;
    }
    __syncthreads();
    topk_sort(key, id);
    next += room;
    first = false;
  }

  if (t == 0) {
    const double x0 = topk_val(key[0]), thr = x0 - 30.0 * T;  // sampling.MARGIN_TEMPERATURES
    int L = 0;
    while (L < K && id[L] != 0x7fffffff && topk_val(key[L]) >= thr) ++L;
    double w[TOPK_MAX];
    for (int j = 0; j < L; ++j) w[j] = exp((topk_val(key[j]) - x0) / T);
    int keep = L;
    if (min_p > 0.0) {
      keep = 0;
      while (keep < L && w[keep] >= min_p * w[0]) ++keep;
    }
    if (top_p < 1.0) {
      double s = 0.0;
      for (int j = 0; j < keep; ++j) s += w[j];
      double cum = 0.0;
      int below = 0;  // searchsorted(cumsum / s, top_p, side="left")
      for (int j = 0; j < keep; ++j) {
        cum += w[j];
        if (cum / s < top_p) ++below;
      }
      keep = min(keep, below + 1);
    }
    keep = max(keep, 1);
    double s = 0.0;
    for (int j = 0; j < keep; ++j) s += w[j];
    const double u = counter_uniform(p[4], (long long)pos[m] + 1, p[5]);
    double cum = 0.0;
    int pick = 0;  // searchsorted(cumsum(w / s), u, side="right"), clamped to the last kept id
    for (int j = 0; j < keep; ++j) {
      cum += w[j] / s;
      if (cum <= u) pick = j + 1;
    }
    const int token = id[min(pick, keep - 1)];
    counts[(size_t)m * V + token] += 1;
    argmax_commit(m, token, tokens, pos, history, step, hist_len);
    ticket[m] = 0u;
  }
}
