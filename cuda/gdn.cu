// Gated DeltaNet, decode (one token per lane row m).
//
// gdn_prep: causal depthwise conv (kernel 4) over the q|k|v channels with its 3-token history, SiLU,
//   L2 norm of each 128-wide q and k head (q also takes the 1/sqrt(Dk) output scale), and the gates
//   g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b). One warp per 128-channel head.
// gdn_delta: the delta rule on the fp32 state S[h][dv][dk], one warp per (value head, dv row):
//   S' = e^g S;  u = beta (v - S' k);  S = S' + u k^T;  o = S q = S' q + u (k . q).
#include "common.cuh"

// Where channel c (of C = (2*Hk + Hv) * 128) of token row m is read: q and k from qk, v from vv.
__device__ __forceinline__ const float* conv_src(const float* qk, int ldqk, const float* vv, int ldv, int Hk,
                                                 size_t m, int c) {
  return c < 2 * Hk * 128 ? qk + m * ldqk + c : vv + m * ldv + (c - 2 * Hk * 128);
}

// One head's conv outputs y (4 channels a lane) of token row m: q and k heads L2-normed (q also scaled),
// v heads stored with the row's gates g and beta.
__device__ __forceinline__ void prep_store(const float (&y)[4], int head, size_t m, int lane, int Hk, int Hv,
                                           float q_scale, const float* __restrict__ ab, int ldab,
                                           const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                           float* __restrict__ qn, float* __restrict__ kn, float* __restrict__ vo,
                                           float* __restrict__ g, float* __restrict__ beta) {
  if (head < 2 * Hk) {
    const float ss = warp_sum(y[0] * y[0] + y[1] * y[1] + y[2] * y[2] + y[3] * y[3]);
    float r = rsqrtf(ss + 1e-6f);
    float* dst;
    if (head < Hk) { r *= q_scale; dst = qn + (m * Hk + head) * 128; }
    else dst = kn + (m * Hk + head - Hk) * 128;
    *reinterpret_cast<float4*>(dst + lane * 4) = make_float4(y[0] * r, y[1] * r, y[2] * r, y[3] * r);
  } else {
    const int hv = head - 2 * Hk;
    *reinterpret_cast<float4*>(vo + (m * Hv + hv) * 128 + lane * 4) = make_float4(y[0], y[1], y[2], y[3]);
    if (lane == 0) {
      const float a = ab[m * ldab + hv] + dt_bias[hv];
      const float sp = a > 20.f ? a : log1pf(__expf(a));
      g[m * Hv + hv] = -__expf(a_log[hv]) * sp;
      beta[m * Hv + hv] = sigmoidf_(ab[m * ldab + Hv + hv]);
    }
  }
}

// qk: [M, 2*Hk*128] (q then k), vv: [M, Hv*128] with row stride ldv, ab: [M, 2*Hv] (a then b).
// conv_state: [M, 3, C] oldest first; conv_w: [4, C] tap-major; C = (2*Hk + Hv) * 128.
// Outputs: qn, kn [M, Hk, 128], vo [M, Hv, 128], g, beta [M, Hv].
extern "C" __global__ void gdn_prep(const float* __restrict__ qk, int ldqk, const float* __restrict__ vv, int ldv,
                         const float* __restrict__ ab, int ldab, float* __restrict__ conv_state,
                         const float* __restrict__ conv_w, const float* __restrict__ a_log,
                         const float* __restrict__ dt_bias, float* __restrict__ qn, float* __restrict__ kn,
                         float* __restrict__ vo, float* __restrict__ g, float* __restrict__ beta, int Hk, int Hv,
                         float q_scale) {
  NI_PDL_ENTRY();
  const int lane = threadIdx.x & 31;
  const int head = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int m = blockIdx.y;
  const int nheads = 2 * Hk + Hv;
  if (head >= nheads) return;
  const int C = nheads * 128;
  const int c0 = head * 128 + lane * 4;
  const float4 xin = *reinterpret_cast<const float4*>(conv_src(qk, ldqk, vv, ldv, Hk, m, c0));
  const float xi[4] = {xin.x, xin.y, xin.z, xin.w};
  float* st = conv_state + (size_t)m * 3 * C;
  float y[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int c = c0 + i;
    const float s0 = st[c], s1 = st[C + c], s2 = st[2 * C + c];
    const float acc = conv_w[c] * s0 + conv_w[C + c] * s1 + conv_w[2 * C + c] * s2 + conv_w[3 * C + c] * xi[i];
    st[c] = s1;
    st[C + c] = s2;
    st[2 * C + c] = xi[i];
    y[i] = silu(acc);
  }
  prep_store(y, head, m, lane, Hk, Hv, q_scale, ab, ldab, a_log, dt_bias, qn, kn, vo, g, beta);
}

// The delta rule on one state row (4 dk a lane at sp) given the normed q and k, the decay alpha = e^g,
// beta and the row's v; returns the row's output (in every lane).
// (delta_reg: the row s held in registers.)
__device__ __forceinline__ float delta_reg(float4& s, float4 q, float4 k, float alpha, float beta, float v) {
  s.x *= alpha; s.y *= alpha; s.z *= alpha; s.w *= alpha;
  const float sk = warp_sum(s.x * k.x + s.y * k.y + s.z * k.z + s.w * k.w);
  const float sq = warp_sum(s.x * q.x + s.y * q.y + s.z * q.z + s.w * q.w);
  const float kq = warp_sum(k.x * q.x + k.y * q.y + k.z * q.z + k.w * q.w);
  const float u = beta * (v - sk);
  s.x += u * k.x; s.y += u * k.y; s.z += u * k.z; s.w += u * k.w;
  return sq + u * kq;
}

__device__ __forceinline__ float delta_step(float4 q, float4 k, float alpha, float beta, float v, float4* sp) {
  float4 s = *sp;
  const float o = delta_reg(s, q, k, alpha, beta, v);
  *sp = s;
  return o;
}

// The delta rule on state row dv of value head h, token row m (one warp, 4 dk a lane); returns the row's
// output o[h][dv] (in every lane).
__device__ __forceinline__ float gdn_delta_row(const float* __restrict__ qn, const float* __restrict__ kn,
                                               const float* __restrict__ vo, const float* __restrict__ g,
                                               const float* __restrict__ beta, float* __restrict__ state, int Hk,
                                               int Hv, int tiled, int m, int h, int dv, int lane) {
  const int kh = tiled ? h % Hk : h / (Hv / Hk);
  const float4 q = reinterpret_cast<const float4*>(qn + ((size_t)m * Hk + kh) * 128)[lane];
  const float4 k = reinterpret_cast<const float4*>(kn + ((size_t)m * Hk + kh) * 128)[lane];
  float4* sp = reinterpret_cast<float4*>(state + (((size_t)m * Hv + h) * 128 + dv) * 128) + lane;
  return delta_step(q, k, __expf(g[(size_t)m * Hv + h]), beta[(size_t)m * Hv + h],
                    vo[((size_t)m * Hv + h) * 128 + dv], sp);
}

// state: [M, Hv, 128 (dv), 128 (dk)] fp32. o: [M, Hv, 128]. tiled=1: value head h reads qk head h % Hk.
extern "C" __global__ void __launch_bounds__(256) gdn_delta(const float* __restrict__ qn, const float* __restrict__ kn,
                                                 const float* __restrict__ vo, const float* __restrict__ g,
                                                 const float* __restrict__ beta, float* __restrict__ state,
                                                 float* __restrict__ o, int Hk, int Hv, int tiled) {
  NI_PDL_ENTRY();
  const int lane = threadIdx.x & 31;
  const int rowid = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int m = blockIdx.y;
  if (rowid >= Hv * 128) return;
  const int h = rowid >> 7, dv = rowid & 127;
  const float ov = gdn_delta_row(qn, kn, vo, g, beta, state, Hk, Hv, tiled, m, h, dv, lane);
  if (lane == 0) o[((size_t)m * Hv + h) * 128 + dv] = ov;
}

// Value head h of token row m from the conv outputs (gdn_delta_raw's and gdn_delta_raw_rw's prologue, gdn_prep's
// arithmetic): its q and k lanes L2-normalized (q also scaled by q_scale) and its decay and update gates.
__device__ __forceinline__ void gdn_raw_head(const float* __restrict__ qk, int ldqk, const float* __restrict__ ab,
                                             int ldab, const float* __restrict__ a_log,
                                             const float* __restrict__ dt_bias, float q_scale, int Hk, int Hv,
                                             int tiled, int m, int h, int lane, float4& q, float4& k, float& alpha,
                                             float& beta, const float* abl = nullptr) {
  // abl != nullptr: the head's a and b projections already computed (abl[0], abl[1]; gdn_delta_gated_cl's GDN_AB_IN)
  const int kh = tiled ? h % Hk : h / (Hv / Hk);
  q = reinterpret_cast<const float4*>(qk + (size_t)m * ldqk + (size_t)kh * 128)[lane];
  k = reinterpret_cast<const float4*>(qk + (size_t)m * ldqk + (size_t)(Hk + kh) * 128)[lane];
  float rq = rsqrtf(warp_sum(q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w) + 1e-6f);
  rq *= q_scale;
  const float rk = rsqrtf(warp_sum(k.x * k.x + k.y * k.y + k.z * k.z + k.w * k.w) + 1e-6f);
  q = make_float4(q.x * rq, q.y * rq, q.z * rq, q.w * rq);
  k = make_float4(k.x * rk, k.y * rk, k.z * rk, k.w * rk);
  const float a = (abl != nullptr ? abl[0] : ab[(size_t)m * ldab + h]) + dt_bias[h];
  const float spl = a > 20.f ? a : log1pf(__expf(a));
  alpha = __expf(-__expf(a_log[h]) * spl);
  beta = sigmoidf_(abl != nullptr ? abl[1] : ab[(size_t)m * ldab + Hv + h]);
}

// The delta rule from the conv outputs themselves (the projections' EPI_CONV epilogue did the conv and SiLU;
// no gdn_prep launch): each warp L2-normalizes its q and k head (q also scaled) and computes its head's
// gates, with gdn_prep's arithmetic, so the state and output carry the arithmetic of gdn_prep + gdn_delta.
// qk: [M, ldqk] (q heads, then k heads), vv: [M, ldv] (v channels first), ab: [M, ldab] (a, then b).
// gdn_delta_raw_rw: RW state rows a warp (RW divides 128: the rows of one value head): the RW rows' state loads issued
// first, the head's q and k loaded, normed and its gates computed once for the RW rows. Grid (ceil(Hv * 128 / (8 RW)),
// M), 256 threads.
#define GDN_RAW_PARAMS                                                                                             \
  const float* __restrict__ qk, int ldqk, const float* __restrict__ vv, int ldv, const float* __restrict__ ab,       \
      int ldab, const float* __restrict__ a_log, const float* __restrict__ dt_bias, float q_scale,                  \
      float* __restrict__ state, float* __restrict__ o, int Hk, int Hv, int tiled
#define GDN_RAW_ARGS qk, ldqk, vv, ldv, ab, ldab, a_log, dt_bias, q_scale, state, o, Hk, Hv, tiled

// gdn_state_rows: the warp's RW state rows into s (lane: 4 columns a row); the pointer the rows go back to.
template <int RW>
__device__ __forceinline__ float4* gdn_state_rows(float* __restrict__ state, int Hv, int m, int row0, float4 (&s)[RW]) {
  const int lane = threadIdx.x & 31;
  float4* sp = reinterpret_cast<float4*>(state + (((size_t)m * Hv + (row0 >> 7)) * 128 + (row0 & 127)) * 128) + lane;
#pragma unroll
  for (int r = 0; r < RW; ++r) s[r] = sp[r * 32];
  return sp;
}

// gdn_delta_rw_rows with the rows already in s (from gdn_state_rows at sp)
template <int RW>
__device__ __forceinline__ void gdn_delta_rw_rows_from(GDN_RAW_PARAMS, int m, int row0, float4* sp, float4 (&s)[RW],
                                                       float (&ov)[RW], const float* abl = nullptr) {
  const int lane = threadIdx.x & 31;
  const int h = row0 >> 7, dv0 = row0 & 127;
  float vr[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) vr[r] = vv[(size_t)m * ldv + (size_t)h * 128 + dv0 + r];
  float4 q, k;
  float alpha, beta;
  gdn_raw_head(qk, ldqk, ab, ldab, a_log, dt_bias, q_scale, Hk, Hv, tiled, m, h, lane, q, k, alpha, beta, abl);
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    ov[r] = delta_reg(s[r], q, k, alpha, beta, vr[r]);
    sp[r * 32] = s[r];
    if (lane == 0) o[((size_t)m * Hv + h) * 128 + dv0 + r] = ov[r];
  }
}

// One warp: state rows row0 .. row0 + RW - 1 (of one value head) of token row m, as gdn_delta_raw_rw runs them; their
// outputs in ov (every lane) and in o (lane 0).
template <int RW>
__device__ __forceinline__ void gdn_delta_rw_rows(GDN_RAW_PARAMS, int m, int row0, float (&ov)[RW]) {
  float4 s[RW];
  float4* sp = gdn_state_rows<RW>(state, Hv, m, row0, s);
  gdn_delta_rw_rows_from<RW>(GDN_RAW_ARGS, m, row0, sp, s, ov);
}

template <int RW>
__global__ void __launch_bounds__(256) gdn_delta_raw_rw(GDN_RAW_PARAMS) {
  static_assert(128 % RW == 0, "a warp's rows in one head");
  NI_PDL_ENTRY();
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * RW;
  if (row0 >= Hv * 128) return;
  float ov[RW];
  gdn_delta_rw_rows<RW>(GDN_RAW_ARGS, blockIdx.y, row0, ov);
}

// Columns form: T consecutive tokens of one sequence (a prefill chunk, or the K+1 tokens a speculative
// verification checks). The conv window and the recurrent state row stay in registers across the T tokens,
// so the state is read and written once per chunk instead of once per token.
// Inputs are [T, ...] rows as in the lane form; conv_state [3, C] and state [Hv, 128, 128] of the sequence.
// conv_rec (speculative verification, cuda/spec.cu): each token's conv inputs are recorded into conv_rec [T, C] and
// the conv state is left as it was (the fold shifts the accepted ones in).
#define GDN_PREP_COLS_PARAMS                                                                                        \
  const float *__restrict__ qk, int ldqk, const float *__restrict__ vv, int ldv, const float *__restrict__ ab,     \
      int ldab, float *__restrict__ conv_state, const float *__restrict__ conv_w, const float *__restrict__ a_log, \
      const float *__restrict__ dt_bias, float *__restrict__ qn, float *__restrict__ kn, float *__restrict__ vo,    \
      float *__restrict__ g, float *__restrict__ beta, int Hk, int Hv, float q_scale, int T
#define GDN_PREP_COLS_ARGS qk, ldqk, vv, ldv, ab, ldab, conv_state, conv_w, a_log, dt_bias, qn, kn, vo, g, beta, Hk, Hv, q_scale, T
__device__ __forceinline__ void gdn_prep_cols_body(GDN_PREP_COLS_PARAMS, float* __restrict__ conv_rec) {
  const int lane = threadIdx.x & 31;
  const int head = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int nheads = 2 * Hk + Hv;
  if (head >= nheads) return;
  const int C = nheads * 128;
  const int c0 = head * 128 + lane * 4;
  // grid.y splits the T tokens (prefill chunks): a slice starts from the three inputs before it (the
  // conv state before token 0) and leaves the conv state to gdn_conv_tail; with one slice (the columns
  // step) the state is carried in registers and written back here.
  const int tper = (T + gridDim.y - 1) / gridDim.y;
  const int t0 = blockIdx.y * tper, t1 = min(T, t0 + tper);
  auto input = [&](int t) {  // token t's 4 conv inputs of this lane; t in [-3, 0) is the conv state
    return *reinterpret_cast<const float4*>(t < 0 ? conv_state + (3 + t) * C + c0
                                                  : conv_src(qk, ldqk, vv, ldv, Hk, t, c0));
  };
  float s0[4], s1[4], s2[4], w[4][4];
  {
    const float4 a = input(t0 - 3), b = input(t0 - 2), c = input(t0 - 1);
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w}, cv[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s0[i] = av[i]; s1[i] = bv[i]; s2[i] = cv[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j][i] = conv_w[j * C + c0 + i];
    }
  }
  // token t + 1's inputs asked for while token t is computed (a warp's loop is otherwise one load in flight)
  float4 xnext = t0 < t1 ? input(t0) : make_float4(0.f, 0.f, 0.f, 0.f);
  for (int t = t0; t < t1; ++t) {
    const float4 xin = xnext;
    if (t + 1 < t1) {
      xnext = input(t + 1);
      if (head >= 2 * Hk && lane < 2)  // (and the next row's gate inputs, read by prep_store's lane 0)
        asm volatile("prefetch.global.L1 [%0];" ::"l"(ab + (size_t)(t + 1) * ldab + lane * Hv + head - 2 * Hk));
    }
    const float xi[4] = {xin.x, xin.y, xin.z, xin.w};
    if (conv_rec != nullptr) *reinterpret_cast<float4*>(conv_rec + (size_t)t * C + c0) = xin;
    float y[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      y[i] = silu(w[0][i] * s0[i] + w[1][i] * s1[i] + w[2][i] * s2[i] + w[3][i] * xi[i]);
      s0[i] = s1[i]; s1[i] = s2[i]; s2[i] = xi[i];
    }
    prep_store(y, head, t, lane, Hk, Hv, q_scale, ab, ldab, a_log, dt_bias, qn, kn, vo, g, beta);
  }
  if (gridDim.y > 1 || conv_rec != nullptr) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    conv_state[c0 + i] = s0[i]; conv_state[C + c0 + i] = s1[i]; conv_state[2 * C + c0 + i] = s2[i];
  }
}

extern "C" __global__ void gdn_prep_cols(GDN_PREP_COLS_PARAMS) {
  NI_PDL_ENTRY();
  gdn_prep_cols_body(GDN_PREP_COLS_ARGS, nullptr);
}

// After a token-split gdn_prep_cols: the conv state becomes the last three inputs of [state, x_0..x_T-1].
// One thread per channel (C = (2 Hk + Hv) * 128 channels: q and k from qk, v from vv).
extern "C" __global__ void gdn_conv_tail(const float* __restrict__ qk, int ldqk, const float* __restrict__ vv, int ldv,
                                         float* __restrict__ conv_state, int Hk, int Hv, int T) {
  NI_PDL_ENTRY();
  const int C = (2 * Hk + Hv) * 128;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const float old[3] = {conv_state[c], conv_state[C + c], conv_state[2 * C + c]};
  float nw[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const int t = T - 3 + i;
    nw[i] = t < 0 ? old[3 + t] : *conv_src(qk, ldqk, vv, ldv, Hk, t, c);
  }
  conv_state[c] = nw[0]; conv_state[C + c] = nw[1]; conv_state[2 * C + c] = nw[2];
}

// write_state false (speculative verification): the state is read, never written; o may be null (the fold).
#define GDN_DELTA_COLS_PARAMS                                                                                     \
  const float *__restrict__ qn, const float *__restrict__ kn, const float *__restrict__ vo,                      \
      const float *__restrict__ g, const float *__restrict__ beta, float *__restrict__ state, float *__restrict__ o, \
      int Hk, int Hv, int tiled, int T
#define GDN_DELTA_COLS_ARGS qn, kn, vo, g, beta, state, o, Hk, Hv, tiled, T
// The delta rule of one state row over T consecutive columns, the row in registers (s: this lane's 4 of its 128
// values; row dv of value head h, which reads qk head kh): column t's inputs are row t of qn, kn [., Hk, 128], vo
// [., Hv, 128], g, beta [., Hv], its output goes to o (nullptr: dropped). Column t + 1's inputs are loaded while
// column t is computed (the loop is a chain of dependent steps).
__device__ __forceinline__ void gdn_delta_cols_row(float4& s, const float* __restrict__ qn, const float* __restrict__ kn,
                                                   const float* __restrict__ vo, const float* __restrict__ g,
                                                   const float* __restrict__ beta, float* __restrict__ o, int Hk,
                                                   int Hv, int h, int dv, int kh, int lane, int T) {
  auto ld = [&](int t, float4& q, float4& k, float& gt, float& bt, float& vt) {
    q = reinterpret_cast<const float4*>(qn + ((size_t)t * Hk + kh) * 128)[lane];
    k = reinterpret_cast<const float4*>(kn + ((size_t)t * Hk + kh) * 128)[lane];
    gt = g[(size_t)t * Hv + h];
    bt = beta[(size_t)t * Hv + h];
    vt = vo[((size_t)t * Hv + h) * 128 + dv];
  };
  float4 q, k;
  float gt, bt, vt;
  if (T > 0) ld(0, q, k, gt, bt, vt);
  for (int t = 0; t < T; ++t) {
    float4 q2, k2;
    float g2, b2, v2;
    ld(t + 1 < T ? t + 1 : t, q2, k2, g2, b2, v2);
    const float ov = delta_reg(s, q, k, __expf(gt), bt, vt);
    if (lane == 0 && o != nullptr) o[((size_t)t * Hv + h) * 128 + dv] = ov;
    q = q2; k = k2; gt = g2; bt = b2; vt = v2;
  }
}

// A state row a warp: row dv of value head h of state [Hv, 128, 128] through T columns (gdn_delta_cols_row), written
// back where write_state.
__device__ __forceinline__ void gdn_delta_cols_body(GDN_DELTA_COLS_PARAMS, bool write_state) {
  const int lane = threadIdx.x & 31;
  const int rowid = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (rowid >= Hv * 128) return;
  const int h = rowid >> 7, dv = rowid & 127;
  const int kh = tiled ? h % Hk : h / (Hv / Hk);
  float4* sp = reinterpret_cast<float4*>(state + ((size_t)h * 128 + dv) * 128) + lane;
  float4 s = *sp;
  gdn_delta_cols_row(s, qn, kn, vo, g, beta, o, Hk, Hv, h, dv, kh, lane, T);
  if (write_state) *sp = s;
}

extern "C" __global__ void __launch_bounds__(256) gdn_delta_cols(GDN_DELTA_COLS_PARAMS) {
  NI_PDL_ENTRY();
  gdn_delta_cols_body(GDN_DELTA_COLS_ARGS, true);
}

// gdn_delta_cols with R state rows a warp (32 / R lanes a row, 4R values a lane): the dot products over a
// row reduce in log2(32 / R) shuffle levels instead of 5, q and k are read once for R rows, and k.q is
// computed once a warp. For long prefill chunks, where the per-token chain (not the parallelism) bounds
// the time. grid: Hv * 128 / (8 R) blocks of 256 threads. Same arithmetic per row as gdn_delta_cols up
// to the order of the partial sums.
template <int R>
__global__ void __launch_bounds__(256) gdn_delta_rows(const float* __restrict__ qn, const float* __restrict__ kn,
                                                      const float* __restrict__ vo, const float* __restrict__ g,
                                                      const float* __restrict__ beta, float* __restrict__ state,
                                                      float* __restrict__ o, int Hk, int Hv, int tiled, int T) {
  NI_PDL_ENTRY();
  constexpr int LPR = 32 / R, V4 = R;  // lanes a row, float4 a lane
  const int lane = threadIdx.x & 31;
  const int wid = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int rowid = wid * R + lane / LPR, p = lane % LPR;
  if (wid * R >= Hv * 128) return;
  const int h = rowid >> 7, dv = rowid & 127;
  const int kh = tiled ? h % Hk : h / (Hv / Hk);
  float4* sp = reinterpret_cast<float4*>(state + ((size_t)h * 128 + dv) * 128) + p * V4;
  float4 s[V4];
#pragma unroll
  for (int i = 0; i < V4; ++i) s[i] = sp[i];
  auto red = [](float v) {
#pragma unroll
    for (int o2 = LPR / 2; o2 > 0; o2 >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o2);
    return v;
  };
  auto ld = [&](int t, float4 (&q)[V4], float4 (&k)[V4], float& gt, float& bt, float& vt) {
    const float4* qp = reinterpret_cast<const float4*>(qn + ((size_t)t * Hk + kh) * 128) + p * V4;
    const float4* kp = reinterpret_cast<const float4*>(kn + ((size_t)t * Hk + kh) * 128) + p * V4;
#pragma unroll
    for (int i = 0; i < V4; ++i) { q[i] = qp[i]; k[i] = kp[i]; }
    gt = g[(size_t)t * Hv + h];
    bt = beta[(size_t)t * Hv + h];
    vt = vo[((size_t)t * Hv + h) * 128 + dv];
  };
  float4 q[V4], k[V4];
  float gt = 0.f, bt = 0.f, vt = 0.f;
  if (T > 0) ld(0, q, k, gt, bt, vt);
  for (int t = 0; t < T; ++t) {
    float4 q2[V4], k2[V4];
    float g2, b2, v2;
    ld(t + 1 < T ? t + 1 : t, q2, k2, g2, b2, v2);
    const float alpha = __expf(gt);
    float sk = 0.f, sq = 0.f, kq = 0.f;
#pragma unroll
    for (int i = 0; i < V4; ++i) {
      s[i].x *= alpha; s[i].y *= alpha; s[i].z *= alpha; s[i].w *= alpha;
      sk += s[i].x * k[i].x + s[i].y * k[i].y + s[i].z * k[i].z + s[i].w * k[i].w;
      sq += s[i].x * q[i].x + s[i].y * q[i].y + s[i].z * q[i].z + s[i].w * q[i].w;
      kq += k[i].x * q[i].x + k[i].y * q[i].y + k[i].z * q[i].z + k[i].w * q[i].w;
    }
    sk = red(sk);
    sq = red(sq);
    kq = red(kq);
    const float u = bt * (vt - sk);
#pragma unroll
    for (int i = 0; i < V4; ++i) {
      s[i].x += u * k[i].x; s[i].y += u * k[i].y; s[i].z += u * k[i].z; s[i].w += u * k[i].w;
    }
    if (p == 0) o[((size_t)t * Hv + h) * 128 + dv] = sq + u * kq;
#pragma unroll
    for (int i = 0; i < V4; ++i) { q[i] = q2[i]; k[i] = k2[i]; }
    gt = g2; bt = b2; vt = v2;
  }
#pragma unroll
  for (int i = 0; i < V4; ++i) sp[i] = s[i];
}
