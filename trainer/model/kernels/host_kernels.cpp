#include "trainer/model/kernels/host_kernels.h"

#include <algorithm>

#include "trainer/model/kernels/kernel_math.h"

namespace sftctl::trainer::kernels::host {
namespace {

// A row kernel on the host: phase 1 for each emulated thread, the partials combined in thread
// order (where the GPU's BlockReduce combines them), then phase 2 for each thread.
template <typename P1, typename P2>
void Rows(int64_t N, P1 phase1, P2 phase2) {
  for (int64_t r = 0; r < N; ++r) {
    float total = 0.0f;
    for (int t = 0; t < kHostRowThreads; ++t) total += phase1(r, t);
    for (int t = 0; t < kHostRowThreads; ++t) phase2(r, total, t);
  }
}

}  // namespace

int LaunchAddRmsNormForward(const void* x, DType x_dtype, const void* d, DType d_dtype, const float* w,
                            float* h_out, void* y, DType y_dtype, float* rstd_out, int64_t N, int64_t C,
                            float eps, void*) {
  WithElementType(x_dtype, [&](auto ht) {
    using H = decltype(ht);
    WithElementType(d_dtype, [&](auto dt) {
      using D = decltype(dt);
      WithElementType(y_dtype, [&](auto yt) {
        using Out = decltype(yt);
        const AddRmsNormArgs<H, D, Out> a{static_cast<const H*>(x),
                                          static_cast<const D*>(d),
                                          w,
                                          h_out,
                                          static_cast<Out*>(y),
                                          rstd_out,
                                          C,
                                          eps};
        Rows(
            N, [&](int64_t r, int t) { return AddRmsNormForwardPhase1(a, r, t, kHostRowThreads); },
            [&](int64_t r, float ss, int t) { AddRmsNormForwardPhase2(a, r, ss, t, kHostRowThreads); });
      });
    });
  });
  return 0;
}

int LaunchAddRmsNormBackward(const void* h, DType h_dtype, const float* w, const void* dy, DType dy_dtype,
                             const float* dh_in, const float* rstd, void* dx, void* dd, DType dd_dtype,
                             float* dw, float* scratch, int64_t N, int64_t C, void*) {
  WithElementType(h_dtype, [&](auto ht) {
    using H = decltype(ht);
    WithElementType(dy_dtype, [&](auto yt) {
      using Out = decltype(yt);
      WithElementType(dd_dtype, [&](auto dt) {
        using GD = decltype(dt);
        const RmsNormBackwardArgs<H, Out, GD> a{
            static_cast<const H*>(h), w, static_cast<const Out*>(dy), dh_in, rstd, static_cast<H*>(dx),
            static_cast<GD*>(dd),     C};
        Rows(
            N, [&](int64_t r, int t) { return RmsNormBackwardPhase1(a, r, t, kHostRowThreads); },
            [&](int64_t r, float dot, int t) { RmsNormBackwardPhase2(a, r, dot, t, kHostRowThreads); });
      });
      if (dw && N > 0) {
        const int64_t groups = WeightGradGroups(N), per = (N + groups - 1) / groups;
        for (int64_t i = 0; i < groups * C; ++i)
          WeightGradPartialElement(static_cast<const H*>(h), static_cast<const Out*>(dy), rstd, scratch, N, C,
                                   per, i);
        for (int64_t c = 0; c < C; ++c) WeightGradSumElement(scratch, dw, groups, C, c);
      }
    });
  });
  return 0;
}

namespace {
int QkvRope(void* q_src, int64_t q_stride, void* k_src, int64_t k_stride, void* v_src, int64_t v_stride,
            const float* cos, const float* sin, const int64_t* positions, void* q, void* k, void* v,
            DType dtype, int64_t B, int64_t T, int64_t H, int64_t Hk, int64_t D, bool backward) {
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    const QkvRopeArgs<X> a{static_cast<X*>(q_src),
                           static_cast<X*>(k_src),
                           static_cast<X*>(v_src),
                           q_stride,
                           k_stride,
                           v_stride,
                           cos,
                           sin,
                           positions,
                           static_cast<X*>(q),
                           static_cast<X*>(k),
                           static_cast<X*>(v),
                           T,
                           H,
                           Hk,
                           D};
    const int64_t total = QkvRopeElements(a, B);
    for (int64_t i = 0; i < total; ++i) QkvRopeElement(a, backward, i);
  });
  return 0;
}
}  // namespace

int LaunchQkvRopeForward(const void* q_src, int64_t q_stride, const void* k_src, int64_t k_stride,
                         const void* v_src, int64_t v_stride, const float* cos, const float* sin,
                         const int64_t* positions, void* q, void* k, void* v, DType dtype, int64_t B,
                         int64_t T, int64_t H, int64_t Hk, int64_t D, void*) {
  return QkvRope(const_cast<void*>(q_src), q_stride, const_cast<void*>(k_src), k_stride,
                 const_cast<void*>(v_src), v_stride, cos, sin, positions, q, k, v, dtype, B, T, H, Hk, D,
                 /*backward=*/false);
}

int LaunchQkvRopeBackward(const void* gq, const void* gk, const void* gv, const float* cos, const float* sin,
                          const int64_t* positions, void* dq_src, int64_t dq_stride, void* dk_src,
                          int64_t dk_stride, void* dv_src, int64_t dv_stride, DType dtype, int64_t B,
                          int64_t T, int64_t H, int64_t Hk, int64_t D, void*) {
  return QkvRope(dq_src, dq_stride, dk_src, dk_stride, dv_src, dv_stride, cos, sin, positions,
                 const_cast<void*>(gq), const_cast<void*>(gk), const_cast<void*>(gv), dtype, B, T, H, Hk, D,
                 /*backward=*/true);
}

int LaunchSwiGluForward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, void* y,
                        DType dtype, int64_t N, int64_t I, void*) {
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    const SwiGluArgs<X> a{static_cast<const X*>(g),
                          g_stride,
                          static_cast<const X*>(u),
                          u_stride,
                          nullptr,
                          static_cast<X*>(y),
                          nullptr,
                          0,
                          nullptr,
                          0,
                          I};
    for (int64_t i = 0; i < N * I; ++i) SwiGluForwardElement(a, i);
  });
  return 0;
}

int LaunchSwiGluBackward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, const void* dy,
                         void* dg, int64_t dg_stride, void* du, int64_t du_stride, DType dtype, int64_t N,
                         int64_t I, void*) {
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    const SwiGluArgs<X> a{static_cast<const X*>(g),
                          g_stride,
                          static_cast<const X*>(u),
                          u_stride,
                          static_cast<const X*>(dy),
                          nullptr,
                          static_cast<X*>(dg),
                          dg_stride,
                          static_cast<X*>(du),
                          du_stride,
                          I};
    for (int64_t i = 0; i < N * I; ++i) SwiGluBackwardElement(a, i);
  });
  return 0;
}

int LaunchCrossEntropyForward(const void* logits, DType dtype, const int64_t* targets, float* lse,
                              float* picked, int64_t N, int64_t V, void*) {
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    const X* l = static_cast<const X*>(logits);
    for (int64_t r = 0; r < N; ++r) {
      MaxSum total{kNegInf, 0.0f};
      for (int t = 0; t < kHostRowThreads; ++t)
        total = MaxSumCombine(total, CrossEntropyPartial(l + r * V, V, t, kHostRowThreads));
      CrossEntropyRowFinish(l, targets, lse, picked, V, r, total);
    }
  });
  return 0;
}

int LaunchCrossEntropyGradInPlace(void* logits, DType dtype, const int64_t* targets, const float* lse,
                                  const float* scale, int64_t N, int64_t V, void*) {
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    for (int64_t i = 0; i < N * V; ++i)
      CrossEntropyGradElement(static_cast<X*>(logits), targets, lse, scale, V, i);
  });
  return 0;
}

std::string GemmTransposedAccumulateF32(const void* a, const void* b, float* out, DType dtype, int64_t M,
                                        int64_t N, int64_t K, int, void*) {
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    const X* ap = static_cast<const X*>(a);
    const X* bp = static_cast<const X*>(b);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        float s = 0.0f;
        for (int64_t k = 0; k < K; ++k) s += Load(ap[k * M + m]) * Load(bp[k * N + n]);
        out[m * N + n] += s;
      }
    }
  });
  return "";
}

}  // namespace sftctl::trainer::kernels::host
