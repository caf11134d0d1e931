// The fused CUDA kernels: thin grids around kernel_math.h's kernel bodies. The GPU-only parts are
// each grid's index (blockIdx * blockDim + threadIdx, or one block per row), BlockReduce (a warp
// shuffle, then one warp over the warps' results) and the dtype dispatch; see cuda_kernels.h for
// each launcher's contract.
#include <cuda_runtime.h>

#include <cstdint>

#include "trainer/model/kernels/cuda_kernels.h"
#include "trainer/model/kernels/kernel_math.h"

namespace sftctl::trainer::kernels {
namespace {

constexpr int kRowThreads = 256;      // threads per row-block (8 warps)
constexpr int kElementThreads = 256;  // threads per block of the element-wise kernels

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

__device__ float ShuffleDown(float v, int o) { return __shfl_down_sync(0xffffffffu, v, o); }
__device__ MaxSum ShuffleDown(MaxSum v, int o) {
  return MaxSum{__shfl_down_sync(0xffffffffu, v.max, o), __shfl_down_sync(0xffffffffu, v.sum, o)};
}

struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Combine {
  __device__ MaxSum operator()(MaxSum a, MaxSum b) const { return MaxSumCombine(a, b); }
};

// Sum (or MaxSum combine) over the block's threads; every thread gets the result.
// REQUIRES: blockDim.x is a multiple of 32 and at most 1024; every thread of the block calls it.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T identity) {
  __shared__ unsigned char raw[32 * sizeof(T)];
  T* partial = reinterpret_cast<T*>(raw);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o /= 2) v = op(v, ShuffleDown(v, o));
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : identity;
  if (warp == 0) {
    for (int o = 16; o > 0; o /= 2) v = op(v, ShuffleDown(v, o));
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  const T out = partial[0];
  __syncthreads();  // partial may be reused by a following BlockReduce
  return out;
}

__device__ int64_t FlatIndex() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }

template <typename H, typename D, typename Out>
__global__ void AddRmsNormForwardKernel(AddRmsNormArgs<H, D, Out> a) {
  const int64_t r = blockIdx.x;
  const float ss = BlockReduce(AddRmsNormForwardPhase1(a, r, threadIdx.x, blockDim.x), Plus{}, 0.0f);
  AddRmsNormForwardPhase2(a, r, ss, threadIdx.x, blockDim.x);
}

template <typename H, typename Out, typename GD>
__global__ void RmsNormBackwardKernel(RmsNormBackwardArgs<H, Out, GD> a) {
  const int64_t r = blockIdx.x;
  const float dot = BlockReduce(RmsNormBackwardPhase1(a, r, threadIdx.x, blockDim.x), Plus{}, 0.0f);
  RmsNormBackwardPhase2(a, r, dot, threadIdx.x, blockDim.x);
}

template <typename H, typename Out>
__global__ void WeightGradPartialKernel(const H* h, const Out* dy, const float* rstd, float* partial,
                                        int64_t N, int64_t C, int64_t rows_per_group, int64_t total) {
  const int64_t idx = FlatIndex();
  if (idx < total) WeightGradPartialElement(h, dy, rstd, partial, N, C, rows_per_group, idx);
}

__global__ void WeightGradSumKernel(const float* partial, float* dw, int64_t groups, int64_t C) {
  const int64_t c = FlatIndex();
  if (c < C) WeightGradSumElement(partial, dw, groups, C, c);
}

template <typename T>
__global__ void QkvRopeKernel(QkvRopeArgs<T> a, bool backward, int64_t total) {
  const int64_t idx = FlatIndex();
  if (idx < total) QkvRopeElement(a, backward, idx);
}

template <typename T>
__global__ void SwiGluForwardKernel(SwiGluArgs<T> a, int64_t total) {
  const int64_t idx = FlatIndex();
  if (idx < total) SwiGluForwardElement(a, idx);
}

template <typename T>
__global__ void SwiGluBackwardKernel(SwiGluArgs<T> a, int64_t total) {
  const int64_t idx = FlatIndex();
  if (idx < total) SwiGluBackwardElement(a, idx);
}

template <typename T>
__global__ void CrossEntropyForwardKernel(const T* logits, const int64_t* targets, float* lse, float* picked,
                                          int64_t V) {
  const int64_t r = blockIdx.x;
  const MaxSum total = BlockReduce(CrossEntropyPartial(logits + r * V, V, threadIdx.x, blockDim.x), Combine{},
                                   MaxSum{kNegInf, 0.0f});
  if (threadIdx.x == 0) CrossEntropyRowFinish(logits, targets, lse, picked, V, r, total);
}

template <typename T>
__global__ void CrossEntropyGradKernel(T* logits, const int64_t* targets, const float* lse,
                                       const float* scale, int64_t V, int64_t total) {
  const int64_t idx = FlatIndex();
  if (idx < total) CrossEntropyGradElement(logits, targets, lse, scale, V, idx);
}

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

int LastError() { return static_cast<int>(cudaGetLastError()); }

}  // namespace

int LaunchAddRmsNormForward(const void* x, DType x_dtype, const void* d, DType d_dtype, const float* w,
                            float* h_out, void* y, DType y_dtype, float* rstd_out, int64_t N, int64_t C,
                            float eps, void* stream) {
  if (N == 0) return 0;
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
        AddRmsNormForwardKernel<<<static_cast<unsigned>(N), kRowThreads, 0, AsStream(stream)>>>(a);
      });
    });
  });
  return LastError();
}

int LaunchAddRmsNormBackward(const void* h, DType h_dtype, const float* w, const void* dy, DType dy_dtype,
                             const float* dh_in, const float* rstd, void* dx, void* dd, DType dd_dtype,
                             float* dw, float* scratch, int64_t N, int64_t C, void* stream) {
  if (N == 0) return 0;
  cudaStream_t s = AsStream(stream);
  WithElementType(h_dtype, [&](auto ht) {
    using H = decltype(ht);
    WithElementType(dy_dtype, [&](auto yt) {
      using Out = decltype(yt);
      WithElementType(dd_dtype, [&](auto dt) {
        using GD = decltype(dt);
        const RmsNormBackwardArgs<H, Out, GD> a{
            static_cast<const H*>(h), w, static_cast<const Out*>(dy), dh_in, rstd, static_cast<H*>(dx),
            static_cast<GD*>(dd),     C};
        RmsNormBackwardKernel<<<static_cast<unsigned>(N), kRowThreads, 0, s>>>(a);
      });
      if (dw) {
        const int64_t groups = WeightGradGroups(N), per = (N + groups - 1) / groups, total = groups * C;
        WeightGradPartialKernel<<<Blocks(total, kElementThreads), kElementThreads, 0, s>>>(
            static_cast<const H*>(h), static_cast<const Out*>(dy), rstd, scratch, N, C, per, total);
        WeightGradSumKernel<<<Blocks(C, kElementThreads), kElementThreads, 0, s>>>(scratch, dw, groups, C);
      }
    });
  });
  return LastError();
}

namespace {
int LaunchQkvRope(void* q_src, int64_t q_stride, void* k_src, int64_t k_stride, void* v_src, int64_t v_stride,
                  const float* cos, const float* sin, const int64_t* positions, void* q, void* k, void* v,
                  DType dtype, int64_t B, int64_t T, int64_t H, int64_t Hk, int64_t D, bool backward,
                  void* stream) {
  const int64_t total = B * T * (H + 2 * Hk) * (D / 2);
  if (total == 0) return 0;
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
    QkvRopeKernel<<<Blocks(total, kElementThreads), kElementThreads, 0, AsStream(stream)>>>(a, backward,
                                                                                            total);
  });
  return LastError();
}
}  // namespace

// (The forward only reads the projections and only writes q, k, v; the backward the other way
// round: QkvRopeArgs carries both directions, hence the casts.)
int LaunchQkvRopeForward(const void* q_src, int64_t q_stride, const void* k_src, int64_t k_stride,
                         const void* v_src, int64_t v_stride, const float* cos, const float* sin,
                         const int64_t* positions, void* q, void* k, void* v, DType dtype, int64_t B,
                         int64_t T, int64_t H, int64_t Hk, int64_t D, void* stream) {
  return LaunchQkvRope(const_cast<void*>(q_src), q_stride, const_cast<void*>(k_src), k_stride,
                       const_cast<void*>(v_src), v_stride, cos, sin, positions, q, k, v, dtype, B, T, H, Hk,
                       D,
                       /*backward=*/false, stream);
}

int LaunchQkvRopeBackward(const void* gq, const void* gk, const void* gv, const float* cos, const float* sin,
                          const int64_t* positions, void* dq_src, int64_t dq_stride, void* dk_src,
                          int64_t dk_stride, void* dv_src, int64_t dv_stride, DType dtype, int64_t B,
                          int64_t T, int64_t H, int64_t Hk, int64_t D, void* stream) {
  return LaunchQkvRope(dq_src, dq_stride, dk_src, dk_stride, dv_src, dv_stride, cos, sin, positions,
                       const_cast<void*>(gq), const_cast<void*>(gk), const_cast<void*>(gv), dtype, B, T, H,
                       Hk, D,
                       /*backward=*/true, stream);
}

int LaunchSwiGluForward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, void* y,
                        DType dtype, int64_t N, int64_t I, void* stream) {
  const int64_t total = N * I;
  if (total == 0) return 0;
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
    SwiGluForwardKernel<<<Blocks(total, kElementThreads), kElementThreads, 0, AsStream(stream)>>>(a, total);
  });
  return LastError();
}

int LaunchSwiGluBackward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, const void* dy,
                         void* dg, int64_t dg_stride, void* du, int64_t du_stride, DType dtype, int64_t N,
                         int64_t I, void* stream) {
  const int64_t total = N * I;
  if (total == 0) return 0;
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
    SwiGluBackwardKernel<<<Blocks(total, kElementThreads), kElementThreads, 0, AsStream(stream)>>>(a, total);
  });
  return LastError();
}

int LaunchCrossEntropyForward(const void* logits, DType dtype, const int64_t* targets, float* lse,
                              float* picked, int64_t N, int64_t V, void* stream) {
  if (N == 0) return 0;
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    CrossEntropyForwardKernel<<<static_cast<unsigned>(N), kRowThreads, 0, AsStream(stream)>>>(
        static_cast<const X*>(logits), targets, lse, picked, V);
  });
  return LastError();
}

int LaunchCrossEntropyGradInPlace(void* logits, DType dtype, const int64_t* targets, const float* lse,
                                  const float* scale, int64_t N, int64_t V, void* stream) {
  const int64_t total = N * V;
  if (total == 0) return 0;
  WithElementType(dtype, [&](auto tt) {
    using X = decltype(tt);
    CrossEntropyGradKernel<<<Blocks(total, kElementThreads), kElementThreads, 0, AsStream(stream)>>>(
        static_cast<X*>(logits), targets, lse, scale, V, total);
  });
  return LastError();
}

}  // namespace sftctl::trainer::kernels
