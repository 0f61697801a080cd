// Speculative decoding on the device (engine/gpu/verify.py; the semantics: spec/runtime.md §3.5-3.6).
//
// A round verifies T = K + 1 columns [t, d_1..d_K] through the target in one columns step whose GDN layers
// read the committed state and record what a replay needs (ReplaySSM): each column's conv input, and its
// normed key, value, g and beta. The accept finds m (the columns to commit: t and the drafts that
// match the target's picks); the next round's verification folds those m columns into each GDN layer's state in
// place before it reads it (its gdn_prep_verify shifts them into the conv history, its gdn_delta_verify runs
// them through the delta rule), and the position moves by m at the round's start. The round's control words
// `ctl`: [0] columns to fold, [1] MTP rows to catch up, [2] the verified round's first position, [3] the half of
// the layers' records the next verification writes (each record is [2, T, ...]: a verification writes one half
// while its fold reads the other, the last verification's; the accept flips it).
#include "common.cuh"

// A record plane's half h: base + h * (T rows of `row` floats).
__device__ __forceinline__ size_t rec_half(int h, int T, int row) { return (size_t)h * T * row; }

// The verification's conv, SiLU, norms and gates, a warp a (channel group of 128, column): the 8 warps of a block
// take 8 / T groups x T columns (T <= 8), so no warp walks the columns in order (a column's conv reads only inputs).
// The fold's conv half first: each warp's window before its column comes from the history as the fold leaves it (the
// last three inputs of [history, the last verification's first ctl[0] columns], half 1 - ctl[3] of conv_rec [2, T,
// C]); column t's conv inputs are recorded into half ctl[3] of conv_rec, its key, value, g and beta into half ctl[3]
// of theirs (prep_store); after the block's warps have read the history, column 0's warps write the folded one.
extern "C" __global__ void __launch_bounds__(256) gdn_prep_verify(GDN_PREP_COLS_PARAMS, float* __restrict__ conv_rec,
                                                                  const int* __restrict__ ctl) {
  NI_PDL_ENTRY();
  const int w = ctl[3], n = ctl[0];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hpb = max(1, (blockDim.x >> 5) / T);
  const int head = blockIdx.x * hpb + warp / T, t = warp % T, nheads = 2 * Hk + Hv, C = nheads * 128;
  const bool live = warp / T < hpb && head < nheads;
  const int c0 = head * 128 + lane * 4;
  const float* prev = conv_rec + rec_half(1 - w, T, C);
  auto ld4 = [](const float* p) { return *reinterpret_cast<const float4*>(p); };
  // input s of this round (s >= 0), else entry 3 + s of the folded history
  auto input = [&](int s) {
    if (s >= 0) return ld4(conv_src(qk, ldqk, vv, ldv, Hk, s, c0));
    const int u = n + s;  // (entry 3 + s of the folded history is element n + 3 + s of [history, prev[0..n)])
    return ld4(u < 0 ? conv_state + (size_t)(3 + u) * C + c0 : prev + (size_t)u * C + c0);
  };
  float4 hist[3];
  if (live) {
    float4 xs[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) xs[i] = input(t - 3 + i);
    if (t == 0)
#pragma unroll
      for (int i = 0; i < 3; ++i) hist[i] = xs[i];
    *reinterpret_cast<float4*>(conv_rec + rec_half(w, T, C) + (size_t)t * C + c0) = xs[3];
    auto ch = [](const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; };
    float y[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      y[i] = silu(conv_w[c0 + i] * ch(xs[0], i) + conv_w[C + c0 + i] * ch(xs[1], i) +
                  conv_w[2 * C + c0 + i] * ch(xs[2], i) + conv_w[3 * C + c0 + i] * ch(xs[3], i));
    prep_store(y, head, t, lane, Hk, Hv, q_scale, ab, ldab, a_log, dt_bias, qn, kn + rec_half(w, T, Hk * 128),
               vo + rec_half(w, T, Hv * 128), g + rec_half(w, T, Hv), beta + rec_half(w, T, Hv));
  }
  __syncthreads();  // (every warp of the block has read the history its columns need)
  if (live && t == 0 && n > 0)
#pragma unroll
    for (int i = 0; i < 3; ++i) *reinterpret_cast<float4*>(conv_state + (size_t)i * C + c0) = hist[i];
}

// The fold of the last verification's first ctl[0] columns (half 1 - ctl[3] of the records) into the state row in
// place, then this verification's T columns (half ctl[3]) from that state, which they do not write. A state row a
// warp, in registers throughout. The fold runs before the PDL wait: what it reads (the state, the last verification's
// records, ctl) was written by earlier graph launches, and this kernel is the only one of a round that writes the
// layer's state, so the fold and its write overlap the kernels ahead of it (gdn_prep_verify writes the other half of
// the records). At most 40 registers, so that the warps of all Hv x 128 rows are resident at once (6 blocks an SM).
extern "C" __global__ void __launch_bounds__(256, 6) gdn_delta_verify(GDN_DELTA_COLS_PARAMS, const int* __restrict__ ctl) {
  NI_PDL_TRIGGER();
  const int lane = threadIdx.x & 31;
  const int rowid = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (rowid >= Hv * 128) return;
  const int h = rowid >> 7, dv = rowid & 127, kh = tiled ? h % Hk : h / (Hv / Hk);
  const int w = ctl[3], n = ctl[0];
  float4* sp = reinterpret_cast<float4*>(state + ((size_t)h * 128 + dv) * 128) + lane;
  float4 s = *sp;
  if (n > 0) {  // (the key stands in for the query: the fold's outputs are dropped)
    const float* kp = kn + rec_half(1 - w, T, Hk * 128);
    gdn_delta_cols_row(s, kp, kp, vo + rec_half(1 - w, T, Hv * 128), g + rec_half(1 - w, T, Hv),
                       beta + rec_half(1 - w, T, Hv), nullptr, Hk, Hv, h, dv, kh, lane, n);
    *sp = s;
  }
  NI_PDL_WAIT();
  gdn_delta_cols_row(s, qn, kn + rec_half(w, T, Hk * 128), vo + rec_half(w, T, Hv * 128), g + rec_half(w, T, Hv),
                     beta + rec_half(w, T, Hv), o, Hk, Hv, h, dv, kh, lane, T);
}

// The fold alone (a consumer stopped inside a round, or the stream's end): the delta rule over the first ctl[0]
// columns of the last verification's records (half 1 - ctl[3] of [2, T, ...]), into the state in place. grid:
// Hv * 128 / 8 blocks of 256.
extern "C" __global__ void __launch_bounds__(256) gdn_fold(const float* __restrict__ kn, const float* __restrict__ vo,
                                                          const float* __restrict__ g, const float* __restrict__ beta,
                                                          float* __restrict__ state, int Hk, int Hv, int tiled, int T,
                                                          const int* __restrict__ ctl) {
  NI_PDL_ENTRY();
  const int h = 1 - ctl[3];
  const float* kp = kn + rec_half(h, T, Hk * 128);
  gdn_delta_cols_body(kp, kp, vo + rec_half(h, T, Hv * 128), g + rec_half(h, T, Hv), beta + rec_half(h, T, Hv), state,
                      nullptr, Hk, Hv, tiled, ctl[0], true);
}

// The conv history after the fold alone: the last three inputs of [history, the first ctl[0] columns of the last
// verification's conv_rec half]. One thread a channel of C.
extern "C" __global__ void gdn_conv_fold(const float* __restrict__ conv_rec, float* __restrict__ conv_state, int C,
                                         int T, const int* __restrict__ ctl) {
  NI_PDL_ENTRY();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int n = ctl[0];
  if (c >= C || n <= 0) return;
  conv_rec += rec_half(1 - ctl[3], T, C);
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

// pos[0] += ctl[0] (the folded columns join the sequence); settle (the fold alone): ctl[0] = 0, nothing left to fold.
extern "C" __global__ void spec_advance(int* __restrict__ pos, int* __restrict__ ctl, int settle) {
  NI_PDL_ENTRY();
  if (threadIdx.x != 0) return;
  pos[0] += ctl[0];
  if (settle) ctl[0] = 0;
}

// The accept. am [T]: the target's pick after each verified column (its argmax, or its draw with the coin plain
// decode takes at that position); ids [T]: the verified inputs. m = 1 + the leading drafts equal to the target's
// pick before them; the tokens emitted are am[0..m) (the last: the correction, or the bonus when every draft
// stood). out = [m, am[0..T)]; the next round verifies from am[m-1] (ids[0]); ctl = [m, m, pos[0], the other half].
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
  ctl[3] ^= 1;
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
// blockIdx.y of e [., H], h [., H] into out [., 2H]; where xh != nullptr, the row also staged as the GEMVs' int16
// pairs (xh [., kpad / 2], its inverse scale xinv [.]: stage_pairs' bits), so that the input projection reads it
// pre-staged rather than each of its blocks staging the 2H values again. Blocks of 1,024 threads, grid (nb, rows):
// every block of a row takes its norms and largest |value| over the whole row (from L2), then writes and stages only
// its slice of the row's 32-value chunks.
extern "C" __global__ void __launch_bounds__(1024) mtp_input(const float* __restrict__ e, const float* __restrict__ h,
                                                             const float* __restrict__ we, const float* __restrict__ wh,
                                                             int H, float eps, float* __restrict__ out,
                                                             __half2* __restrict__ xh, float* __restrict__ xinv,
                                                             int kpad) {
  NI_PDL_ENTRY();
  __shared__ float red[32];
  const int r = blockIdx.y;
  e += (size_t)r * H;
  h += (size_t)r * H;
  out += (size_t)r * 2 * H;
  float inv[2];
  for (int half = 0; half < 2; ++half) {
    const float* x = half ? h : e;
    float ss = 0.f;
    for (int k = threadIdx.x; k < H; k += blockDim.x) ss += x[k] * x[k];
    inv[half] = rsqrtf(block_sum(ss, red) / (float)H + eps);
  }
  auto val = [&](int k) {
    const bool hh = k >= H;
    const int j = hh ? k - H : k;
    return (hh ? h : e)[j] * inv[hh] * (1.f + (hh ? wh : we)[j]);
  };
  const int nch = (xh != nullptr ? kpad : 2 * H) / 32, per = (nch + gridDim.x - 1) / gridDim.x;
  const int c0 = blockIdx.x * per, c1 = min(c0 + per, nch);
  for (int k = c0 * 32 + threadIdx.x; k < min(c1 * 32, 2 * H); k += blockDim.x) out[k] = val(k);
  if (xh == nullptr) return;
  float mx = 0.f;
  for (int k = threadIdx.x; k < 2 * H; k += blockDim.x) mx = fmaxf(mx, fabsf(val(k)));
  const float sc = pow2_scale(block_max(mx, red));  // (its barriers also publish the slice of out written above)
  stage_slice(out, 2 * H, c0, c1, xh + (size_t)r * (kpad / 2), sc);
  if (blockIdx.x == 0 && threadIdx.x == 0) xinv[r] = 1.f / sc;
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
