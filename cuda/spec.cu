// Speculative decoding on the device (engine/gpu/verify.py; the semantics: spec/runtime.md §3.5-3.6).
//
// A round verifies T = K + 1 columns [t, d_1..d_K] through the target in one columns step whose GDN layers
// read the committed state and record what a replay needs (ReplaySSM): each column's conv input, and its
// normed key, value, g and beta. The accept finds m (the columns to commit: t and the drafts that
// match the target's picks), and the next round starts by folding those m columns into the state in place
// and moving the position by m. The round's control words `ctl`: [0] columns to fold, [1] MTP rows to catch
// up, [2] the verified round's first position.
#include "common.cuh"

// gdn_prep_cols with each token's conv inputs recorded into conv_rec [T, C], the conv state untouched.
extern "C" __global__ void gdn_prep_verify(GDN_PREP_COLS_PARAMS, float* __restrict__ conv_rec) {
  NI_PDL_ENTRY();
  gdn_prep_cols_body(GDN_PREP_COLS_ARGS, conv_rec);
}

// gdn_delta_cols reading the recurrent state without writing it.
extern "C" __global__ void __launch_bounds__(256) gdn_delta_verify(GDN_DELTA_COLS_PARAMS) {
  NI_PDL_ENTRY();
  gdn_delta_cols_body(GDN_DELTA_COLS_ARGS, false);
}

// The fold: the delta rule over the first ctl[0] recorded columns, into the state in place (outputs dropped;
// the key stands in for the query, which only shapes outputs). grid: Hv * 128 / 8 blocks of 256.
extern "C" __global__ void __launch_bounds__(256) gdn_fold(const float* __restrict__ kn, const float* __restrict__ vo,
                                                          const float* __restrict__ g, const float* __restrict__ beta,
                                                          float* __restrict__ state, int Hk, int Hv, int tiled,
                                                          const int* __restrict__ ctl) {
  NI_PDL_ENTRY();
  gdn_delta_cols_body(kn, kn, vo, g, beta, state, nullptr, Hk, Hv, tiled, ctl[0], true);
}

// The conv history after the fold: the last three inputs of [history, the first ctl[0] recorded columns].
// One thread a channel of C.
extern "C" __global__ void gdn_conv_fold(const float* __restrict__ conv_rec, float* __restrict__ conv_state, int C,
                                         const int* __restrict__ ctl) {
  NI_PDL_ENTRY();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = ctl[0];
  if (c >= C || n <= 0) return;
  const float old[3] = {conv_state[c], conv_state[C + c], conv_state[2 * C + c]};
  float nw[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const int t = n - 3 + i;
    nw[i] = t < 0 ? old[3 + t] : conv_rec[(size_t)t * C + c];
  }
  conv_state[c] = nw[0];
  conv_state[C + c] = nw[1];
  conv_state[2 * C + c] = nw[2];
}

// pos[0] += ctl[0] (the folded columns join the sequence).
extern "C" __global__ void spec_advance(int* __restrict__ pos, const int* __restrict__ ctl) {
  NI_PDL_ENTRY();
  if (threadIdx.x == 0) pos[0] += ctl[0];
}

// The accept. am [T]: the target's pick after each verified column (its argmax, or its draw with the coin plain
// decode takes at that position); ids [T]: the verified inputs. m = 1 + the leading drafts equal to the target's
// pick before them; the tokens emitted are am[0..m) (the last: the correction, or the bonus when every draft
// stood). out = [m, am[0..T)]; the next round verifies from am[m-1] (ids[0]); ctl = [m, m, pos[0]].
extern "C" __global__ void spec_accept(const int* __restrict__ am, int* __restrict__ ids, int T,
                                              int* __restrict__ out, int* __restrict__ ctl, const int* __restrict__ pos) {
  NI_PDL_ENTRY();
  if (threadIdx.x != 0) return;
  int m = 1;
  while (m < T && ids[m] == am[m - 1]) ++m;
  out[0] = m;
  for (int t = 0; t < T; ++t) out[1 + t] = am[t];
  ids[0] = am[m - 1];
  ctl[0] = m;
  ctl[1] = m;
  ctl[2] = pos[0];
}

// The first round after a plain step (its final hidden row h, its argmax token): the MTP catches up one row, (h,
// the token), at the step's position; nothing to fold; the verification starts from that token.
extern "C" __global__ void spec_first(const float* __restrict__ h, float* __restrict__ row0, int H,
                                      const int* __restrict__ tok, int* __restrict__ am, int* __restrict__ ids,
                                      int* __restrict__ ctl, const int* __restrict__ pos) {
  NI_PDL_ENTRY();
  for (int k = threadIdx.x; k < H; k += blockDim.x) row0[k] = h[k];
  if (threadIdx.x == 0) {
    am[0] = tok[0];
    ids[0] = tok[0];
    ctl[0] = 0;
    ctl[1] = 1;
    ctl[2] = pos[0] - 1;
  }
}

// An MTP step's token and position: tok_dst[0] = tok_src[0] (tok_src null: kept), pos[0] = base[0] + off.
extern "C" __global__ void spec_mtp_setup(const int* __restrict__ tok_src, int* __restrict__ tok_dst,
                                          const int* __restrict__ base, int off, int* __restrict__ pos) {
  NI_PDL_ENTRY();
  if (threadIdx.x != 0) return;
  if (tok_src != nullptr) tok_dst[0] = tok_src[0];
  pos[0] = base[0] + off;
}

// The MTP head's input rows: [rmsnorm(e) (1 + we), rmsnorm(h) (1 + wh)] (2H values; the embedding half first), row
// r of e [., H], h [., H] into out [., 2H]. One block of 1,024 threads a row.
extern "C" __global__ void __launch_bounds__(1024) mtp_input(const float* __restrict__ e, const float* __restrict__ h,
                                                             const float* __restrict__ we, const float* __restrict__ wh,
                                                             int H, float eps, float* __restrict__ out) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  e += (size_t)blockIdx.x * H;
  h += (size_t)blockIdx.x * H;
  out += (size_t)blockIdx.x * 2 * H;
  const float* src[2] = {e, h};
  const float* w[2] = {we, wh};
  for (int half = 0; half < 2; ++half) {
    const float* x = src[half];
    float ss = 0.f;
    for (int k = threadIdx.x; k < H; k += blockDim.x) ss += x[k] * x[k];
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)H + eps);
    for (int k = threadIdx.x; k < H; k += blockDim.x) out[(size_t)half * H + k] = x[k] * inv * (1.f + w[half][k]);
    __syncthreads();
  }
}

// dst = row ctl[1] - 1 of src [rows, H] (the last MTP row caught up: the first draft's hidden).
extern "C" __global__ void spec_gather_row(const float* __restrict__ src, int H, const int* __restrict__ ctl,
                                           float* __restrict__ dst) {
  NI_PDL_ENTRY();
  const float* r = src + (size_t)max(ctl[1] - 1, 0) * H;
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < H; k += gridDim.x * blockDim.x) dst[k] = r[k];
}

// dst[k] = src[k] for k < n (rows of hidden states, a draft id into the verified ids).
extern "C" __global__ void spec_copy_f32(const float* __restrict__ src, float* __restrict__ dst, int n) {
  NI_PDL_ENTRY();
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) dst[k] = src[k];
}

extern "C" __global__ void spec_copy_i32(const int* __restrict__ src, int* __restrict__ dst, int n) {
  NI_PDL_ENTRY();
  for (int k = threadIdx.x; k < n; k += blockDim.x) dst[k] = src[k];
}

// Drafts given by the host (forced acceptance, oracle tests): when ovr[0] is set, ids[1..K] = ovr[1..K].
extern "C" __global__ void spec_override(const int* __restrict__ ovr, int* __restrict__ ids, int K) {
  NI_PDL_ENTRY();
  if (ovr[0] == 0) return;
  for (int k = threadIdx.x; k < K; k += blockDim.x) ids[1 + k] = ovr[1 + k];
}

// A proposal head's pick as a token id: row[0] (a row of the shortlist) mapped to ids[row[0]], into tok[0] (the next
// MTP step's input) and dst[0] (the verified ids).
extern "C" __global__ void spec_map_id(const int* __restrict__ row, const int* __restrict__ ids, int* __restrict__ tok,
                                       int* __restrict__ dst) {
  NI_PDL_ENTRY();
  if (threadIdx.x != 0) return;
  const int t = ids[row[0]];
  tok[0] = t;
  dst[0] = t;
}

// The penalties' generated-token counts of the verified columns, counts [T, V]: between rounds every row holds the
// counts of the tokens generated so far (the top-k sampler's input, cuda/sample_topk.cu). Before the columns' draws
// (fix 0), row i adds the drafts ids[1..i] (what plain decode would have generated before that column's draw); after
// the accept (fix 1), row i takes them back with its draw's own commit am[i], and adds the tokens the round emitted,
// am[0..out[0]): every row again the counts so far. A thread a row (its updates in order).
extern "C" __global__ void spec_counts(int* __restrict__ counts, int V, const int* __restrict__ ids,
                                       const int* __restrict__ am, const int* __restrict__ out, int T, int fix) {
  NI_PDL_ENTRY();
  const int i = threadIdx.x;
  if (i >= T) return;
  int* row = counts + (size_t)i * V;
  const int d = fix ? -1 : 1;
  for (int j = 1; j <= i; ++j) row[ids[j]] += d;
  if (!fix) return;
  row[am[i]] -= 1;
  for (int j = 0; j < out[0]; ++j) row[am[j]] += 1;
}
