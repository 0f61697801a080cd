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
// Every block takes a slice of TOPK_TILE ids: each warp keeps the best 64 of its 256 (sorted in registers by warp
// shuffles, 2 a lane: a bitonic sort of each 64, merged into the running best), and warp 0 merges the 32 warps'
// lists into the block's best K. The last block to finish (a ticket per row) merges the blocks' lists the same
// way and draws. No loop waits on a block-wide barrier, so a step costs a few microseconds on any logits.
// The step's bookkeeping is argmax_commit's (sample.cu), and the drawn token's count goes up by one. Under a
// grammar (allow_on[m] != 0) only the ids whose bit is set in allow (the host's mask, engine.constraints) take part:
// the host's mask_logits sets the others to -inf before anything else.
#define TOPK_MAX 64
#define TOPK_TILE 8192  // ids a block (32 warps x 256); rows of up to 32 tiles (262,144 ids)
#define TOPK_THREADS 1024

struct TopkEntry {
  unsigned long long k;  // topk_key of the (penalized) logit
  int i;                 // the id; 0x7fffffff with k == 0 for an empty entry
};

// order-preserving map of a double to 64 bits (larger x, larger key); 0 sorts below every real value
__device__ __forceinline__ unsigned long long topk_key(double x) {
  const unsigned long long b = (unsigned long long)__double_as_longlong(x);
  return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ double topk_val(unsigned long long k) {
  return __longlong_as_double((long long)((k & 0x8000000000000000ull) ? (k & 0x7fffffffffffffffull) : ~k));
}
__device__ __forceinline__ bool topk_better(const TopkEntry& a, const TopkEntry& b) {
  return a.k > b.k || (a.k == b.k && a.i < b.i);
}
__device__ __forceinline__ TopkEntry topk_shfl_xor(TopkEntry e, int m) {
  e.k = __shfl_xor_sync(0xffffffffu, e.k, m);
  e.i = __shfl_xor_sync(0xffffffffu, e.i, m);
  return e;
}
__device__ __forceinline__ TopkEntry topk_empty() { return TopkEntry{0ull, 0x7fffffff}; }

// The half-cleaners of a bitonic network over 64 entries held 2 a lane (position 2 * lane + s), from distance j0
// down to 1; `k` is the segment size whose direction applies (best first where position & k == 0).
__device__ __forceinline__ void topk_warp_clean(TopkEntry e[2], int k, int j0) {
  const int lane = threadIdx.x & 31;
  for (int j = j0; j > 1; j >>= 1) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int pos = 2 * lane + s;
      const TopkEntry o = topk_shfl_xor(e[s], j >> 1);
      const bool keep_better = ((pos & j) == 0) == ((pos & k) == 0);
      if (keep_better == topk_better(o, e[s])) e[s] = o;
    }
  }
  const bool best_first = ((2 * lane) & k) == 0;
  if (best_first ? topk_better(e[1], e[0]) : topk_better(e[0], e[1])) {
    const TopkEntry t = e[0];
    e[0] = e[1];
    e[1] = t;
  }
}

// the warp's 64 entries sorted best first
__device__ __forceinline__ void topk_warp_sort(TopkEntry e[2]) {
#pragma unroll
  for (int k = 2; k <= 64; k <<= 1) topk_warp_clean(e, k, k >> 1);
}

// best := the best 64 of best and n (both sorted best first), sorted best first
__device__ __forceinline__ void topk_warp_merge(TopkEntry best[2], const TopkEntry n[2]) {
#pragma unroll
  for (int s = 0; s < 2; ++s) {  // position p against n's position 63 - p: lane ^ 31, the other slot
    const TopkEntry o = topk_shfl_xor(n[1 - s], 31);
    if (topk_better(o, best[s])) best[s] = o;
  }
  topk_warp_clean(best, 128, 32);  // the result is bitonic: sort it best first
}

// Warp 0: `nl` sorted lists (list l at lists[64 l], lens[l] entries; nl <= 32) merged into out[0..K), best first.
__device__ void topk_merge_lists(const TopkEntry* lists, const int* lens, int nl, int K, TopkEntry* out) {
  const int lane = threadIdx.x & 31;
  int head = 0;
  const int len = lane < nl ? lens[lane] : 0;
  TopkEntry cur = len > 0 ? lists[lane * 64] : topk_empty();
  for (int r = 0; r < K; ++r) {
    TopkEntry b = cur;
    int bl = lane;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
      const TopkEntry o = topk_shfl_xor(b, m);
      const int ol = __shfl_xor_sync(0xffffffffu, bl, m);
      if (topk_better(o, b) || (!topk_better(b, o) && ol < bl)) { b = o; bl = ol; }
    }
    if (lane == 0) out[r] = b;
    if (lane == bl) {
      ++head;
      cur = head < len ? lists[lane * 64 + head] : topk_empty();
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
// launches; allow [M, allow_words] (bit i % 32 of word i / 32 for id i), read where allow_on[m]. Grid
// (ceil(D / TOPK_TILE) <= 32, M), TOPK_THREADS threads. temperature must be > 0 (greedy takes the argmax, or top_k 1
// under a grammar).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
sample_topk_mb(const float* __restrict__ logits, int ldl, int D, const unsigned long long* __restrict__ params,
               int* __restrict__ counts, int V, unsigned long long* __restrict__ cand_key, int* __restrict__ cand_id,
               unsigned int* __restrict__ ticket, int* __restrict__ tokens, int* __restrict__ pos,
               int* __restrict__ history, int* __restrict__ step, int hist_len,
               const unsigned int* __restrict__ allow, const int* __restrict__ allow_on, int allow_words) {
  NI_PDL_ENTRY();
  __shared__ TopkEntry lists[32 * 64];
  __shared__ int lens[32];
  __shared__ TopkEntry best[TOPK_MAX];
  __shared__ bool last;
  const int m = blockIdx.y, nb = gridDim.x, b = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const unsigned long long* p = params + (size_t)m * SAMPLE_PARAMS;
  const double T = __longlong_as_double((long long)p[0]);
  const double top_p = __longlong_as_double((long long)p[1]);
  const double min_p = __longlong_as_double((long long)p[2]);
  const int K = (int)min((long long)TOPK_MAX, max(1ll, (long long)p[3]));
  const double presence = __longlong_as_double((long long)p[6]);
  const double frequency = __longlong_as_double((long long)p[7]);
  const float* l = logits + (size_t)m * ldl;
  const int* cnt = (presence != 0.0 || frequency != 0.0) ? counts + (size_t)m * V : nullptr;
  const unsigned int* mask = allow_on[m] ? allow + (size_t)m * allow_words : nullptr;

  // this warp's 256 ids in 4 chunks of 64: position 2 * lane + s of chunk c is id w0 + 64 c + 2 * lane + s
  const int w0 = b * TOPK_TILE + warp * 256;
  float x[8];
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // every load issued before the first compare
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int i = w0 + 64 * c + 2 * lane + s;
      x[2 * c + s] = i < D ? l[i] : 0.0f;
    }
  }
  TopkEntry run[2];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    TopkEntry e[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int i = w0 + 64 * c + 2 * lane + s;
      const bool in = i < D && (mask == nullptr || ((mask[i >> 5] >> (i & 31)) & 1u));
      e[s] = in ? TopkEntry{topk_key(topk_penalized(x[2 * c + s], cnt, i, presence, frequency)), i} : topk_empty();
    }
    topk_warp_sort(e);
    if (c == 0) {
      run[0] = e[0];
      run[1] = e[1];
    } else {
      topk_warp_merge(run, e);
    }
  }
  lists[warp * 64 + 2 * lane] = run[0];
  lists[warp * 64 + 2 * lane + 1] = run[1];
  if (lane == 0) lens[warp] = 64;
  __syncthreads();
  if (warp == 0) {
    topk_merge_lists(lists, lens, 32, K, best);
    __syncwarp();
    const size_t c0 = ((size_t)m * nb + b) * TOPK_MAX;
    for (int j = lane; j < K; j += 32) {
      cand_key[c0 + j] = best[j].k;
      cand_id[c0 + j] = best[j].i;
    }
  }
  __threadfence();
  __syncthreads();
  if (t == 0) last = atomicAdd(ticket + m, 1u) == (unsigned)(nb - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();

  // the blocks' lists (nb <= 32 of K each) into shared memory, then merged by warp 0
  for (int j = t; j < nb * K; j += blockDim.x) {
    const int bl = j / K, r = j % K;
    const size_t at = ((size_t)m * nb + bl) * TOPK_MAX + r;
    lists[bl * 64 + r] = TopkEntry{__ldcg(cand_key + at), __ldcg(cand_id + at)};
  }
  if (t < 32) lens[t] = t < nb ? K : 0;
  __syncthreads();
  if (warp == 0) topk_merge_lists(lists, lens, nb, K, best);
  __syncthreads();

  if (t == 0) {
    const double x0 = topk_val(best[0].k), thr = x0 - 30.0 * T;  // sampling.MARGIN_TEMPERATURES
    int L = 0;
    while (L < K && best[L].i != 0x7fffffff && topk_val(best[L].k) >= thr) ++L;
    double w[TOPK_MAX];
    for (int j = 0; j < L; ++j) w[j] = exp((topk_val(best[j].k) - x0) / T);
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
    const int token = best[min(pick, keep - 1)].i;
    counts[(size_t)m * V + token] += 1;
    argmax_commit(m, token, tokens, pos, history, step, hist_len);
    ticket[m] = 0u;
  }
}
