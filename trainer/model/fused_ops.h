// Fused CPU kernels for the model's memory-bound steps, each a custom autograd function with
// a hand-written backward. They replace chains of small ATen ops whose bf16 CPU kernels (in
// LibTorch 1.13) cost more than the matrix multiplies around them.
//
// Every kernel reads float or bf16, computes in fp32, and rounds once on output. The loops run
// in parallel through trainer/runtime/parallel.h (LibTorch's OpenMP threads where the build has them,
// else a small pool). Reductions use a fixed chunking that depends only on the tensor shape,
// never on the thread count or the parallel backend, so results are deterministic (exact resume
// relies on it). The composite ATen formulations in
// model.cpp remain the reference: tests/trainer/fused_ops_test.cpp compares both, forward
// and backward. Callers use these only for CPU tensors (see Supported()).
//
// Thread safety: pure functions.
#pragma once

#include <torch/torch.h>

#include <tuple>

namespace sftctl::trainer::fused {

// Whether the fused kernels handle `t` (CPU, float or bf16) and are enabled.
bool Supported(const torch::Tensor& t);

// Turns the fused kernels off (the model then uses its composite ATen path). They are on by
// default unless the environment sets SFTCTL_NO_FUSED=1. For tests and as an escape hatch.
void SetEnabled(bool enabled);
// Whether they are on (this switch also governs the CUDA kernels of trainer/model/cuda_ops.h).
bool IsEnabled();

// RMSNorm as transformers computes it: y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype),
// returned in `out_dtype` (the dtype the next matmul wants). x: [..., C], weight: [C] fp32.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      torch::ScalarType out_dtype);

// Splits a fused projection qkv [B, T, (H + 2*Hkv) * D] into q [B, H, T, D], k and v
// [B, Hkv, T, D] (contiguous), applying rotate-half RoPE to q and k. cos/sin: fp32 tables
// [P, D]; positions: [B, T] int64, or undefined for 0..T-1.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> QkvRope(const torch::Tensor& qkv,
                                                                const torch::Tensor& cos,
                                                                const torch::Tensor& sin,
                                                                const torch::Tensor& positions, int64_t heads,
                                                                int64_t kv_heads, int64_t head_dim);

// Causal softmax of attention scores [Z, R, T] whose row r is query position t = r % T (GQA
// groups stack their query rows), scaled by `scale`, computed in fp32 and returned in
// `out_dtype`. Row t sees keys j <= t, and with `window` > 0 (a sliding window) only those
// with t - j < window. Masked entries are exactly 0.
torch::Tensor CausalSoftmax(const torch::Tensor& scores, double scale, torch::ScalarType out_dtype,
                            int64_t window = 0);

// SwiGLU on a fused gate/up projection [..., 2I]: silu(gate) * up -> [..., I].
torch::Tensor SwiGlu(const torch::Tensor& gate_up);

// One AdamW update over flat fp32 buffers (same arithmetic as torch.optim.AdamW):
// p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
void AdamWStep(torch::Tensor& p, const torch::Tensor& g, torch::Tensor& m, torch::Tensor& v, double lr,
               double wd, double beta1, double beta2, double eps, double bc1, double bc2);

// Sum of squares of a flat fp32 buffer, accumulated in double with shape-fixed chunking.
double SumOfSquares(const torch::Tensor& flat);

}  // namespace sftctl::trainer::fused
