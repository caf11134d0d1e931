// Launchers of the fused CUDA kernels (cuda_kernels.cu): raw device pointers, sizes and a
// stream, nothing of LibTorch and nothing of the CUDA headers, so the .cu file compiles with nvcc
// alone and this header is usable from any C++ file. trainer/model/cuda_ops.h wraps them as
// autograd functions on tensors. Each kernel's arithmetic is in kernel_math.h (tested on the CPU
// by tests/trainer/kernel_math_test.cpp; on a GPU by tests/trainer/cuda_kernels_test.cpp).
//
// Conventions: `stream` is a cudaStream_t passed as void*; DType names the element type behind a
// void pointer; rows are contiguous in their last dimension, with the row strides given (in
// elements). Launchers return the launch's cudaError_t as an int (0: success) and never
// synchronize; an error is checked by the caller (cuda_ops.cpp turns it into a c10::Error).
//
// Thread safety: the launchers are safe to call from any thread; the memory they write must not
// be written concurrently by anything else.
#pragma once

#include <cstdint>

namespace sftctl::trainer::kernels {

enum class DType : int { kFloat32 = 0, kBFloat16 = 1 };

// Add + RMSNorm forward over N rows of C (kernel_math.h): h = x + d, y = w * Through<H>(h * rstd)
// as y_dtype, where H is x's dtype (x_dtype). Without d (null) h is x itself and h_out may be null.
// REQUIRES: with d, x is fp32 (the residual stream) and h_out [N, C] fp32 is not null. rstd_out [N]
// fp32 receives each row's 1 / sqrt(mean(h^2) + eps) for the backward.
int LaunchAddRmsNormForward(const void* x, DType x_dtype, const void* d, DType d_dtype, const float* w,
                            float* h_out, void* y, DType y_dtype, float* rstd_out, int64_t N, int64_t C,
                            float eps, void* stream);

// Backward of the above: h is what was normalised (h_out, or x when there was no add; h_dtype), dy
// the gradient of y, dh_in the gradient of h_out (null: none). Writes dx [N, C] (h_dtype: x's
// gradient), dd [N, C] (dd_dtype; null: not wanted) and, when dw is not null, the weight's gradient
// [C] fp32 through `scratch`, which must hold WeightGradScratchFloats(N, C) floats. The weight's
// gradient is summed in a fixed order (deterministic).
int LaunchAddRmsNormBackward(const void* h, DType h_dtype, const float* w, const void* dy, DType dy_dtype,
                             const float* dh_in, const float* rstd, void* dx, void* dd, DType dd_dtype,
                             float* dw, float* scratch, int64_t N, int64_t C, void* stream);
// Floats of scratch LaunchAddRmsNormBackward needs for the weight's gradient: one partial row of
// C per group of rows (at most kWeightGradGroups groups).
inline constexpr int64_t kWeightGradGroups = 64;
inline int64_t WeightGradGroups(int64_t N) { return N < kWeightGradGroups ? N : kWeightGradGroups; }
inline int64_t WeightGradScratchFloats(int64_t N, int64_t C) { return WeightGradGroups(N) * C; }

// RoPE for attention: q/k/v projections (rows b*T + t of q_src: H*D values at row stride
// q_stride, of k_src and v_src: Hk*D values at their strides; all of `dtype`) become q [B, H, T, D]
// and k, v [B, Hk, T, D] (contiguous), with rotate-half RoPE on q and k at position
// positions[b*T + t] (null: t) of the fp32 cos/sin tables [P, D]. REQUIRES: D even.
int LaunchQkvRopeForward(const void* q_src, int64_t q_stride, const void* k_src, int64_t k_stride,
                         const void* v_src, int64_t v_stride, const float* cos, const float* sin,
                         const int64_t* positions, void* q, void* k, void* v, DType dtype, int64_t B,
                         int64_t T, int64_t H, int64_t Hk, int64_t D, void* stream);
// Its backward: gradients of q, k, v (contiguous, as above) onto the projections' layout
// (dq_src rows of H*D at dq_stride, ...).
int LaunchQkvRopeBackward(const void* gq, const void* gk, const void* gv, const float* cos, const float* sin,
                          const int64_t* positions, void* dq_src, int64_t dq_stride, void* dk_src,
                          int64_t dk_stride, void* dv_src, int64_t dv_stride, DType dtype, int64_t B,
                          int64_t T, int64_t H, int64_t Hk, int64_t D, void* stream);

// SwiGLU over N rows of I: y = silu(g) * u, g and u rows at strides g_stride, u_stride (a fused
// gate/up projection: the same base, u = g + I, both strides 2I); y contiguous [N, I].
int LaunchSwiGluForward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, void* y,
                        DType dtype, int64_t N, int64_t I, void* stream);
// Its backward into dg, du (rows at their strides; may be one fused [N, 2I] buffer).
int LaunchSwiGluBackward(const void* g, int64_t g_stride, const void* u, int64_t u_stride, const void* dy,
                         void* dg, int64_t dg_stride, void* du, int64_t du_stride, DType dtype, int64_t N,
                         int64_t I, void* stream);

// Cross-entropy over N rows of V logits (`dtype`, row stride V): lse[r] = logsumexp(row r) and
// picked[r] = row r's logit at targets[r] (fp32, [N] each). One block per row, one pass.
int LaunchCrossEntropyForward(const void* logits, DType dtype, const int64_t* targets, float* lse,
                              float* picked, int64_t N, int64_t V, void* stream);
// The gradient in place of the logits: (softmax - onehot(target)) * (*scale), scale a device
// scalar (the loss's incoming gradient: read on the device, so the host never waits for it).
int LaunchCrossEntropyGradInPlace(void* logits, DType dtype, const int64_t* targets, const float* lse,
                                  const float* scale, int64_t N, int64_t V, void* stream);

}  // namespace sftctl::trainer::kernels
