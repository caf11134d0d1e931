// The model's memory-bound steps on CUDA: autograd functions around the fused kernels of
// trainer/model/kernels/ (one kernel per memory pass, each checked against its CPU reference by
// tests/trainer/kernel_math_test.cpp and, on a GPU, tests/trainer/cuda_kernels_test.cpp). The CPU
// has its own fused kernels (trainer/model/fused_ops.h); the composite ATen formulations in
// model.cpp and chunked_loss.cpp stay the reference for both.
//
// The CUDA kernels are built where the trainer's LibTorch has CUDA and a CUDA compiler is found
// (CMake option SFTCTL_CUDA_KERNELS). Every function below also runs on CPU tensors, through the
// kernels' host reference (kernels/host_kernels.h: the same kernel bodies in plain loops, slow);
// the model takes that path only when SetHostReference(true), so tests prove the CUDA path's
// composition -- its autograd plumbing, its numbers, its kernel count -- on a machine without a GPU.
//
// Thread safety: pure functions (each launches on the current CUDA stream of its tensors' device).
#pragma once

#include <torch/torch.h>

#include <tuple>
#include <utility>

namespace sftctl::trainer::cuda_ops {

// Whether the CUDA kernels are compiled in (SFTCTL_CUDA_KERNELS).
bool Compiled();

// Whether the model runs its CUDA path on CPU tensors too, through the host reference (off by
// default; for tests: tests/trainer/kernel_math_test.cpp). Process-wide.
void SetHostReference(bool on);

// Whether the model should use these functions for `t` (float or bf16): a CUDA tensor when the
// kernels are compiled in, CUDA autocast is off or in bf16 (fp16 runs take the composite path)
// and the fused kernels are enabled (fused::SetEnabled; SFTCTL_NO_FUSED=1 turns the CPU and CUDA
// ones off); a CPU tensor when SetHostReference(true).
bool Supported(const torch::Tensor& t);

// RMSNorm as fused::RmsNorm: y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype) in `out_dtype`.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                      torch::ScalarType out_dtype);

// The residual add fused with the next RMSNorm: h = x + d (x: the fp32 residual stream [..., C],
// d: a sublayer's output of the same shape), y = RmsNorm(h) in `out_dtype`. Returns {h, y}; both
// are differentiable (h feeds the next residual add).
std::pair<torch::Tensor, torch::Tensor> AddRmsNorm(const torch::Tensor& x, const torch::Tensor& d,
                                                   const torch::Tensor& weight, double eps,
                                                   torch::ScalarType out_dtype);

// The q, k and v projections [B, T, H*D] / [B, T, Hkv*D] (each row contiguous; they may be column
// slices of one fused projection) to q [B, H, T, D], k and v [B, Hkv, T, D] (contiguous), with
// rotate-half RoPE on q and k from the fp32 tables cos/sin [P, D] at `positions` ([B, T] int64, or
// undefined for 0..T-1). All three of one dtype.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> QkvRope(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& cos,
    const torch::Tensor& sin, const torch::Tensor& positions, int64_t heads, int64_t kv_heads,
    int64_t head_dim);

// The same for q, k and v stacked in one projection's output qkv [B, T, (H + 2 Hkv) D] (rows
// contiguous): its backward writes one gradient for qkv, so that one GEMM takes it back to the input
// (StackedWorkingLinear, trainer/model/projection.h) where three would, with two adds.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> QkvRope(const torch::Tensor& qkv,
                                                                const torch::Tensor& cos,
                                                                const torch::Tensor& sin,
                                                                const torch::Tensor& positions, int64_t heads,
                                                                int64_t kv_heads, int64_t head_dim);

// silu(gate) * up for gate, up [..., I] of one dtype (rows contiguous; column slices of a fused
// gate/up projection are fine).
torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up);
// The same for gate and up stacked in one projection's output gate_up [..., 2 I] (gate first): one
// gradient for gate_up.
torch::Tensor SwiGlu(const torch::Tensor& gate_up);

// chunked_loss.h's LinearCrossEntropySum on CUDA, in chunks of `chunk_tokens` rows (> 0): each
// chunk's logits are made once in the matmul dtype `dtype` and never in fp32; one kernel per
// chunk gives each row's log-sum-exp and target logit; backward recomputes a chunk's logits,
// turns them into the loss's gradient in place (one kernel), and accumulates the weight's
// gradient into one fp32 buffer inside the GEMM (no add kernel per chunk). With `master` (the
// fp32 weight whose working copy `weight` is, in `dtype`: trainer/model/working_weights.h) that
// buffer is master.grad() itself and no gradient is returned for `weight` (REQUIRES then: as for
// WorkingLinear's master).
torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t chunk_tokens,
                                    torch::ScalarType dtype, const torch::Tensor& master = {});

// x W^T + b with W read from its working copy `w_work` (trainer/model/working_weights.h) rather
// than cast from the fp32 master weight `master` at each step. The product runs in w_work's dtype
// (x and b cast to it; the result in that dtype, as autocast's linear). Backward returns x's
// gradient (in x's dtype) and the bias's (fp32 sum over rows), and adds dW = dy^T x in fp32
// straight into master.grad() inside the GEMM: no gradient comes back for W, so nothing else sees
// it arrive (no AccumulateGrad hook fires). `bias` may be undefined.
// REQUIRES: master.grad() is defined, fp32, contiguous and of W's shape (the optimizer's view of
// its flat gradient buffer) whenever backward runs.
torch::Tensor WorkingLinear(const torch::Tensor& x, const torch::Tensor& w_work, const torch::Tensor& bias,
                            const torch::Tensor& master);

}  // namespace sftctl::trainer::cuda_ops
