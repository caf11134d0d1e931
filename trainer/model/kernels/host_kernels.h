// The host reference of every launcher in cuda_kernels.h and cublas_gemm.h: the same signatures
// (the stream is ignored), the same kernel bodies (kernel_math.h) driven by plain loops over every
// index a grid would visit, on host memory. trainer/model/cuda_ops.h runs the CUDA path's
// composition through these on the CPU when asked to (cuda_ops::SetHostReference), so a machine
// without a GPU tests the autograd plumbing around the kernels and counts the step's kernels.
// Single-threaded and slow: for tests, never for training.
//
// Thread safety: like the CUDA launchers.
#pragma once

#include <cstdint>
#include <string>

#include "trainer/model/kernels/cuda_kernels.h"

namespace sftctl::trainer::kernels::host {

int LaunchAddRmsNormForward(const void* x, DType x_dtype, const void* d, DType d_dtype, const float* w,
                            float* h_out, void* y, DType y_dtype, float* rstd_out, int64_t N, int64_t C,
                            float eps, void* stream);
int LaunchAddRmsNormBackward(const void* h, DType h_dtype, const float* w, const void* dy, DType dy_dtype,
                             const float* dh_in, const float* rstd, void* dx, void* dd, DType dd_dtype,
                             float* dw, float* scratch, int64_t N, int64_t C, void* stream);
int LaunchQkvRopeForward(const void* q_src, int64_t q_stride, const void* k_src, int64_t k_stride,
                         const void* v_src, int64_t v_stride, const float* cos, const float* sin,
                         const int64_t* positions, void* q, void* k, void* v, DType dtype, int64_t B,
                         int64_t T, int64_t H, int64_t Hk, int64_t D, void* stream);
int LaunchQkvRopeBackward(const void* gq, const void* gk, const void* gv, const float* cos, const float* sin,
                          const int64_t* positions, void* dq_src, int64_t dq_stride, void* dk_src,
                          int64_t dk_stride, void* dv_src, int64_t dv_stride, DType dtype, int64_t B,
                          int64_t T, int64_t H, int64_t Hk, int64_t D, void* stream);
int LaunchSwiGluForward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, void* y,
                        DType dtype, int64_t N, int64_t I, void* stream);
int LaunchSwiGluBackward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, const void* dy,
                         void* dg, int64_t dg_stride, void* du, int64_t du_stride, DType dtype, int64_t N,
                         int64_t I, void* stream);
int LaunchCrossEntropyForward(const void* logits, DType dtype, const int64_t* targets, float* lse,
                              float* picked, int64_t N, int64_t V, void* stream);
int LaunchCrossEntropyGradInPlace(void* logits, DType dtype, const int64_t* targets, const float* lse,
                                  const float* scale, int64_t N, int64_t V, void* stream);
std::string GemmTransposedAccumulateF32(const void* a, const void* b, float* out, DType dtype, int64_t M,
                                        int64_t N, int64_t K, int device, void* stream);

// The threads per row the host reference emulates (the CUDA kernels' block size).
inline constexpr int kHostRowThreads = 256;

}  // namespace sftctl::trainer::kernels::host
