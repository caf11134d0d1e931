// The arithmetic of the fused CUDA kernels (trainer/model/kernels/cuda_kernels.cu), written once
// for the GPU and the CPU: every function here is `__host__ __device__` under nvcc and plain C++
// elsewhere, so tests/trainer/kernel_math_test.cpp drives the very same bodies with a host loop
// and checks them against the composite ATen formulation, on a machine without a GPU.
//
// The kernels keep their GPU-only parts small: a block of `nt` threads handles one row; thread
// `tid` visits elements tid, tid + nt, ... (the functions below take tid and nt, so the host
// driver exercises the same striding); a block-wide sum or max combines the threads' partials
// (cuda_kernels.cu's BlockReduce; the host driver combines them in thread order). Everything is
// computed in fp32 and rounded once on store (bf16: round to nearest even, as
// common/formats/safetensors.h and the CPU kernels in trainer/model/fused_ops.cpp round).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <cstring>

#include "trainer/model/kernels/cuda_kernels.h"

#if defined(__CUDACC__)
#define SFT_HD __host__ __device__ __forceinline__
#else
#define SFT_HD inline
#endif

namespace sftctl::trainer::kernels {

// bf16 as its bits: the same type on the host and the device (cuda_kernels.cu reinterprets
// __nv_bfloat16 pointers as Bf16 ones; both are 2 bytes).
struct Bf16 {
  uint16_t bits;
};

SFT_HD uint32_t BitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

SFT_HD float FloatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Calls f(T{}) with T the element type behind `t` (Bf16 or float): the one dtype dispatch of the
// CUDA launchers (cuda_kernels.cu) and their host reference (host_kernels.cpp). Host code only.
template <typename Fn>
void WithElementType(DType t, Fn&& f) {
  if (t == DType::kBFloat16) {
    f(Bf16{});
  } else {
    f(float{});
  }
}

SFT_HD float Load(float v) { return v; }
SFT_HD float Load(Bf16 v) { return FloatOf(static_cast<uint32_t>(v.bits) << 16); }

template <typename T>
SFT_HD T Store(float v);
template <>
SFT_HD float Store<float>(float v) {
  return v;
}
// Round to nearest even; a NaN stays a quiet NaN of its sign.
template <>
SFT_HD Bf16 Store<Bf16>(float v) {
  const uint32_t u = BitsOf(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  return Bf16{static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

// x rounded through T and back (the cast a composite formulation makes between two ops).
template <typename T>
SFT_HD float Through(float v) {
  return Load(Store<T>(v));
}

SFT_HD float Exp(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  return __builtin_expf(x);
#endif
}

SFT_HD float Log(float x) {
#if defined(__CUDA_ARCH__)
  return __logf(x);
#else
  return __builtin_logf(x);
#endif
}

SFT_HD float Rsqrt(float x) {
#if defined(__CUDA_ARCH__)
  return rsqrtf(x);
#else
  return 1.0f / __builtin_sqrtf(x);
#endif
}

SFT_HD float Sigmoid(float x) { return 1.0f / (1.0f + Exp(-x)); }

// n / d and n % d for n >= 0, d > 0, in 32-bit arithmetic when both fit. A GPU divides 64-bit
// integers in a long emulated sequence, which made the per-element kernels' flat-index split
// (row, column) cost more than their loads; a 32-bit division is a short one. Exact either way.
struct QuotRem {
  int64_t q, r;
};
SFT_HD QuotRem DivMod(int64_t n, int64_t d) {
  if (((static_cast<uint64_t>(n) | static_cast<uint64_t>(d)) >> 32) == 0) {
    const uint32_t n32 = static_cast<uint32_t>(n), d32 = static_cast<uint32_t>(d), q32 = n32 / d32;
    return {q32, n32 - q32 * d32};
  }
  const int64_t q = n / d;
  return {q, n - q * d};
}

constexpr float kNegInf = -__builtin_huge_valf();

// ---------------------------------------------------------------------------------------------
// Add + RMSNorm, one row of C: h = x + d (the residual stream, fp32; d absent: h = x), then
// y = w * Through<H>(h * rstd), rstd = 1 / sqrt(mean(h^2) + eps), stored as Out. H is the dtype
// of what is normalised (the fp32 residual, or bf16 q/k heads for Qwen3's q/k norm): transformers
// casts the normalised value back to it before the weight multiplies, so that rounding is kept;
// Out is the next matmul's dtype.

// Phase 1 of the forward (thread tid of nt): writes h's elements of this thread (when h_out is
// not null) and returns their sum of squares.
template <typename X, typename D>
SFT_HD float AddRmsNormSumSq(const X* x, const D* d, float* h_out, int64_t C, int tid, int nt) {
  float ss = 0.0f;
  for (int64_t i = tid; i < C; i += nt) {
    const float h = Load(x[i]) + (d ? Load(d[i]) : 0.0f);
    if (h_out) h_out[i] = h;
    ss += h * h;
  }
  return ss;
}

SFT_HD float RmsNormRstd(float sum_sq, int64_t C, float eps) {
  return Rsqrt(sum_sq / static_cast<float>(C) + eps);
}

// Phase 2: y from h (h_out of phase 1, or x itself when there is no d).
template <typename H, typename Out>
SFT_HD void RmsNormWrite(const H* h, const float* w, Out* y, float rstd, int64_t C, int tid, int nt) {
  for (int64_t i = tid; i < C; i += nt) y[i] = Store<Out>(w[i] * Through<H>(Load(h[i]) * rstd));
}

// Backward, phase 1: with n = h * rstd, the thread's part of sum_i dy_i w_i n_i.
template <typename H, typename Out>
SFT_HD float RmsNormBackwardDot(const H* h, const float* w, const Out* dy, float rstd, int64_t C, int tid,
                                int nt) {
  float s = 0.0f;
  for (int64_t i = tid; i < C; i += nt) s += Load(dy[i]) * w[i] * Load(h[i]) * rstd;
  return s;
}

// Phase 2: dh_i = dh_in_i + rstd * (dy_i w_i - n_i * dot / C), written to dx (as GX) and, when
// dd is not null, to dd (as GD: the residual add passes the same gradient to both summands).
// dh_in: the gradient reaching h from later layers (null: none).
template <typename H, typename Out, typename GX, typename GD>
SFT_HD void RmsNormBackwardWrite(const H* h, const float* w, const Out* dy, const float* dh_in, float rstd,
                                 float dot, GX* dx, GD* dd, int64_t C, int tid, int nt) {
  const float mean_dot = dot / static_cast<float>(C);
  for (int64_t i = tid; i < C; i += nt) {
    const float n = Load(h[i]) * rstd;
    const float g = (dh_in ? dh_in[i] : 0.0f) + rstd * (Load(dy[i]) * w[i] - n * mean_dot);
    dx[i] = Store<GX>(g);
    if (dd) dd[i] = Store<GD>(g);
  }
}

// The weight's gradient for column c over rows [r0, r1): sum_r dy[r, c] * Through<H>(n[r, c]).
// (The composite formulation multiplies w by the rounded n, so dw sees the rounded n.)
template <typename H, typename Out>
SFT_HD float RmsNormWeightGradPartial(const H* h, const Out* dy, const float* rstd, int64_t C, int64_t c,
                                      int64_t r0, int64_t r1) {
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += Load(dy[r * C + c]) * Through<H>(Load(h[r * C + c]) * rstd[r]);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Rotate-half RoPE of one head's D values at table row `cs` (cos and sin, fp32, D values each):
// out_i = x_i cos_i - x_{i+D/2} sin_i and out_{i+D/2} = x_{i+D/2} cos_{i+D/2} + x_i sin_{i+D/2}.
// One call per element pair i < D/2.
template <typename T>
SFT_HD void RopePair(const T* in, T* out, const float* cos, const float* sin, int64_t D, int64_t i) {
  const int64_t half = D / 2;
  const float x1 = Load(in[i]), x2 = Load(in[i + half]);
  out[i] = Store<T>(x1 * cos[i] - x2 * sin[i]);
  out[i + half] = Store<T>(x2 * cos[i + half] + x1 * sin[i + half]);
}

// Its transpose (the backward): g is the gradient of out, written back onto in's layout.
template <typename T>
SFT_HD void RopePairBackward(const T* g, T* out, const float* cos, const float* sin, int64_t D, int64_t i) {
  const int64_t half = D / 2;
  const float g1 = Load(g[i]), g2 = Load(g[i + half]);
  out[i] = Store<T>(g1 * cos[i] + g2 * sin[i + half]);
  out[i + half] = Store<T>(g2 * cos[i + half] - g1 * sin[i]);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: y = silu(g) * u, element-wise.
template <typename T>
SFT_HD T SwiGluForward(T g, T u) {
  const float gv = Load(g);
  return Store<T>(gv * Sigmoid(gv) * Load(u));
}

// Its gradients: dg = dy u s (1 + g (1 - s)), du = dy g s, with s = sigmoid(g).
template <typename T>
SFT_HD void SwiGluBackward(T g, T u, T dy, T* dg, T* du) {
  const float gv = Load(g), s = Sigmoid(gv), d = Load(dy);
  *dg = Store<T>(d * Load(u) * s * (1.0f + gv * (1.0f - s)));
  *du = Store<T>(d * gv * s);
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy over one row of V logits (any float dtype), in fp32.

// A running (max, sum of exp(x - max)) pair: the log-sum-exp of what it has seen is
// max + log(sum). The empty pair is (-inf, 0).
struct MaxSum {
  float max;
  float sum;
};

SFT_HD MaxSum MaxSumCombine(MaxSum a, MaxSum b) {
  if (a.max == kNegInf) return b;
  if (b.max == kNegInf) return a;
  const float m = a.max > b.max ? a.max : b.max;
  return MaxSum{m, a.sum * Exp(a.max - m) + b.sum * Exp(b.max - m)};
}

// Phase 1 of the loss (thread tid of nt): the pair over this thread's logits.
template <typename T>
SFT_HD MaxSum CrossEntropyPartial(const T* logits, int64_t V, int tid, int nt) {
  MaxSum acc{kNegInf, 0.0f};
  for (int64_t i = tid; i < V; i += nt) {
    const float x = Load(logits[i]);
    if (x > acc.max) {
      acc.sum = acc.sum * Exp(acc.max - x) + 1.0f;
      acc.max = x;
    } else {
      acc.sum += Exp(x - acc.max);
    }
  }
  return acc;
}

SFT_HD float LogSumExp(MaxSum total) { return total.max + Log(total.sum); }

// The loss's gradient in place of the logits: (softmax_i - [i == target]) * scale, where
// softmax_i = exp(x_i - lse). One call per element.
template <typename T>
SFT_HD void CrossEntropyGradInPlace(T* logits, float lse, int64_t target, float scale, int64_t i) {
  const float p = Exp(Load(logits[i]) - lse);
  logits[i] = Store<T>((p - (i == target ? 1.0f : 0.0f)) * scale);
}

// ---------------------------------------------------------------------------------------------
// Whole kernel bodies. Each kernel of cuda_kernels.cu is "index -> one of these": the element-wise
// ones take the flat element index, the row ones the row and (tid, nt); the CPU test calls them
// over every index, so the index arithmetic is tested with the arithmetic.

// Add + RMSNorm over rows of C. H: the dtype of what is normalised (x's); D: d's.
template <typename H, typename D, typename Out>
struct AddRmsNormArgs {
  const H* x;      // [N, C]
  const D* d;      // [N, C] or null (no add)
  const float* w;  // [C]
  float* h_out;    // [N, C] fp32, or null when d is null
  Out* y;          // [N, C]
  float* rstd;     // [N]
  int64_t C;
  float eps;
};

template <typename H, typename D, typename Out>
SFT_HD float AddRmsNormForwardPhase1(const AddRmsNormArgs<H, D, Out>& a, int64_t r, int tid, int nt) {
  return AddRmsNormSumSq(a.x + r * a.C, a.d ? a.d + r * a.C : nullptr, a.h_out ? a.h_out + r * a.C : nullptr,
                         a.C, tid, nt);
}

// Phase 2 reads back only what the same thread wrote in phase 1 (same striding): no barrier.
template <typename H, typename D, typename Out>
SFT_HD void AddRmsNormForwardPhase2(const AddRmsNormArgs<H, D, Out>& a, int64_t r, float sum_sq, int tid,
                                    int nt) {
  const float rstd = RmsNormRstd(sum_sq, a.C, a.eps);
  if (tid == 0) a.rstd[r] = rstd;
  if (a.d) {
    RmsNormWrite<float>(a.h_out + r * a.C, a.w, a.y + r * a.C, rstd, a.C, tid, nt);
  } else {
    RmsNormWrite<H>(a.x + r * a.C, a.w, a.y + r * a.C, rstd, a.C, tid, nt);
  }
}

template <typename H, typename Out, typename GD>
struct RmsNormBackwardArgs {
  const H* h;          // [N, C]: what was normalised
  const float* w;      // [C]
  const Out* dy;       // [N, C]
  const float* dh_in;  // [N, C] or null
  const float* rstd;   // [N]
  H* dx;               // [N, C]
  GD* dd;              // [N, C] or null
  int64_t C;
};

template <typename H, typename Out, typename GD>
SFT_HD float RmsNormBackwardPhase1(const RmsNormBackwardArgs<H, Out, GD>& a, int64_t r, int tid, int nt) {
  return RmsNormBackwardDot(a.h + r * a.C, a.w, a.dy + r * a.C, a.rstd[r], a.C, tid, nt);
}

template <typename H, typename Out, typename GD>
SFT_HD void RmsNormBackwardPhase2(const RmsNormBackwardArgs<H, Out, GD>& a, int64_t r, float dot, int tid,
                                  int nt) {
  const int64_t o = r * a.C;
  RmsNormBackwardWrite(a.h + o, a.w, a.dy + o, a.dh_in ? a.dh_in + o : nullptr, a.rstd[r], dot, a.dx + o,
                       a.dd ? a.dd + o : nullptr, a.C, tid, nt);
}

// The weight's gradient: rows in `groups` groups of rows_per_group; element (g, c) of the
// partial sums for flat index g * C + c, then column c's sum over the groups in order.
template <typename H, typename Out>
SFT_HD void WeightGradPartialElement(const H* h, const Out* dy, const float* rstd, float* partial, int64_t N,
                                     int64_t C, int64_t rows_per_group, int64_t idx) {
  const auto [g, c] = DivMod(idx, C);
  const int64_t r0 = g * rows_per_group;
  const int64_t r1 = r0 + rows_per_group < N ? r0 + rows_per_group : N;
  partial[idx] = RmsNormWeightGradPartial<H>(h, dy, rstd, C, c, r0, r1);
}

SFT_HD void WeightGradSumElement(const float* partial, float* dw, int64_t groups, int64_t C, int64_t c) {
  float s = 0.0f;
  for (int64_t g = 0; g < groups; ++g) s += partial[g * C + c];
  dw[c] = s;
}

// RoPE over q, k and v: flat index -> (row b*T + t, head of q then k then v, pair i < D/2).
template <typename T>
struct QkvRopeArgs {
  // Rows of H*D (Hk*D) at their strides: read by the forward, written by the backward.
  T* q_src;
  T* k_src;
  T* v_src;
  int64_t q_stride, k_stride, v_stride;
  const float* cos;  // [P, D]
  const float* sin;
  const int64_t* positions;  // [B*T] or null (position t)
  T* q;                      // [B, H, T, D] (forward: written; backward: the incoming gradient)
  T* k;                      // [B, Hk, T, D]
  T* v;
  int64_t T_, H, Hk, D;
};

template <typename T>
SFT_HD int64_t QkvRopeElements(const QkvRopeArgs<T>& a, int64_t B) {
  return B * a.T_ * (a.H + 2 * a.Hk) * (a.D / 2);
}

// backward false: projections -> heads with RoPE; true: heads' gradients -> the projections'.
template <typename T>
SFT_HD void QkvRopeElement(const QkvRopeArgs<T>& a, bool backward, int64_t idx) {
  const int64_t half = a.D / 2, heads = a.H + 2 * a.Hk;
  const auto [pair_row, i] = DivMod(idx, half);  // pair_row: (b * T + t) * heads + head
  const auto [bt, head] = DivMod(pair_row, heads);
  const auto [b, t] = DivMod(bt, a.T_);
  const int64_t p = a.positions ? a.positions[bt] : t;
  const float* c = a.cos + p * a.D;
  const float* s = a.sin + p * a.D;
  T* src;
  T* dst;
  if (head < a.H) {
    src = a.q_src + bt * a.q_stride + head * a.D;
    dst = a.q + ((b * a.H + head) * a.T_ + t) * a.D;
  } else if (head < a.H + a.Hk) {
    const int64_t hk = head - a.H;
    src = a.k_src + bt * a.k_stride + hk * a.D;
    dst = a.k + ((b * a.Hk + hk) * a.T_ + t) * a.D;
  } else {
    const int64_t hv = head - a.H - a.Hk;
    src = a.v_src + bt * a.v_stride + hv * a.D;
    dst = a.v + ((b * a.Hk + hv) * a.T_ + t) * a.D;
    if (backward) {
      src[i] = dst[i];
      src[i + half] = dst[i + half];
    } else {
      dst[i] = src[i];
      dst[i + half] = src[i + half];
    }
    return;
  }
  if (backward) {
    RopePairBackward(dst, src, c, s, a.D, i);
  } else {
    RopePair(src, dst, c, s, a.D, i);
  }
}

// SwiGLU: flat index r * I + j.
template <typename T>
struct SwiGluArgs {
  const T* g;
  int64_t g_stride;
  const T* u;
  int64_t u_stride;
  const T* dy;  // backward: [N, I]
  T* y;         // forward: [N, I]
  T* dg;        // backward: rows at dg_stride
  int64_t dg_stride;
  T* du;
  int64_t du_stride;
  int64_t I;
};

template <typename T>
SFT_HD void SwiGluForwardElement(const SwiGluArgs<T>& a, int64_t idx) {
  const auto [r, j] = DivMod(idx, a.I);
  a.y[idx] = SwiGluForward(a.g[r * a.g_stride + j], a.u[r * a.u_stride + j]);
}

template <typename T>
SFT_HD void SwiGluBackwardElement(const SwiGluArgs<T>& a, int64_t idx) {
  const auto [r, j] = DivMod(idx, a.I);
  SwiGluBackward(a.g[r * a.g_stride + j], a.u[r * a.u_stride + j], a.dy[idx], a.dg + r * a.dg_stride + j,
                 a.du + r * a.du_stride + j);
}

// Cross-entropy over rows of V logits. A target outside [0, V) gives a NaN loss (never a read
// outside the row).
template <typename T>
SFT_HD void CrossEntropyRowFinish(const T* logits, const int64_t* targets, float* lse, float* picked,
                                  int64_t V, int64_t r, MaxSum total) {
  const int64_t t = targets[r];
  lse[r] = LogSumExp(total);
  picked[r] = (t >= 0 && t < V) ? Load(logits[r * V + t]) : FloatOf(0x7fc00000u);
}

// The gradient in place: flat index r * V + i.
template <typename T>
SFT_HD void CrossEntropyGradElement(T* logits, const int64_t* targets, const float* lse, const float* scale,
                                    int64_t V, int64_t idx) {
  const auto [r, i] = DivMod(idx, V);
  CrossEntropyGradInPlace(logits + r * V, lse[r], targets[r], *scale, i);
}

}  // namespace sftctl::trainer::kernels
