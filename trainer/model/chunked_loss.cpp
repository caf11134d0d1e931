#include "trainer/model/chunked_loss.h"

#include <algorithm>

#include "trainer/model/cuda_ops.h"
#include "trainer/model/projection.h"
#include "trainer/runtime/cuda_capability.h"

namespace sftctl::trainer {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// fp32 logits of rows [begin, end) of h against w, with the matmul in `dtype`; soft-capped
// (tanh(z / cap) * cap) when cap > 0.
Tensor ChunkLogits(const Tensor& h, const Tensor& w, int64_t begin, int64_t end, torch::ScalarType dtype,
                   double cap) {
  Tensor z = torch::matmul(h.slice(0, begin, end).to(dtype), w.t()).to(torch::kFloat32);
  if (cap > 0) z = z.div_(cap).tanh_().mul_(cap);
  return z;
}

struct ChunkedCrossEntropyFn : public torch::autograd::Function<ChunkedCrossEntropyFn> {
  // `dtype`: the matmul dtype, chosen by the caller under the forward's autocast settings
  // (backward may run without them).
  static Tensor forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& weight,
                        const Tensor& targets, int64_t chunk, int64_t dtype, double cap) {
    const auto dt = static_cast<torch::ScalarType>(dtype);
    const Tensor w = weight.to(dt);  // one cast for all chunks (none when W is stored in dt)
    const int64_t N = hidden.size(0);
    Tensor lse = torch::empty({N}, hidden.options().dtype(torch::kFloat32));
    Tensor picked = torch::empty({N}, hidden.options().dtype(torch::kFloat32));
    for (int64_t b = 0; b < N; b += chunk) {
      const int64_t e = std::min(N, b + chunk);
      const Tensor logits = ChunkLogits(hidden, w, b, e, dt, cap);
      lse.slice(0, b, e).copy_(logits.logsumexp(1));
      picked.slice(0, b, e).copy_(logits.gather(1, targets.slice(0, b, e).unsqueeze(1)).squeeze(1));
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["dtype"] = dtype;
    ctx->saved_data["cap"] = cap;
    return (lse - picked).sum();
  }

  // d/dlogits of the summed loss is softmax(logits) - onehot(target), per row; soft-capped
  // logits c = cap * tanh(z / cap) add the factor dc/dz = 1 - (c / cap)^2.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const auto dt = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    const double cap = ctx->saved_data["cap"].toDouble();
    const bool want_h = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const Tensor g = grads[0].to(torch::kFloat32);
    const Tensor w = weight.to(dt);
    const int64_t N = hidden.size(0);
    Tensor dh = want_h ? torch::empty_like(hidden) : Tensor();
    Tensor dw = want_w ? torch::zeros(weight.sizes(), weight.options().dtype(torch::kFloat32)) : Tensor();
    for (int64_t b = 0; b < N; b += chunk) {
      const int64_t e = std::min(N, b + chunk);
      Tensor p = ChunkLogits(hidden, w, b, e, dt, cap);
      const Tensor slope = cap > 0 ? 1.0 - (p / cap).square() : Tensor();
      p.sub_(lse.slice(0, b, e).unsqueeze(1)).exp_();
      const Tensor t = targets.slice(0, b, e).unsqueeze(1);
      p.scatter_add_(1, t, torch::full(t.sizes(), -1.0f, p.options()));
      p.mul_(g);
      if (cap > 0) p.mul_(slope);
      const Tensor dlogits = p.to(dt);
      if (want_h) dh.slice(0, b, e).copy_(torch::matmul(dlogits, w));
      if (want_w) dw.add_(torch::matmul(dlogits.t(), hidden.slice(0, b, e).to(dt)));
    }
    return {dh, want_w ? dw.to(weight.scalar_type()) : Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

LossChunkDevice LossChunkDeviceFor(const torch::Device& device) {
  LossChunkDevice d;
  d.type = device.type();
  if (device.is_cuda()) d.memory_bytes = CudaTotalMemory(device.has_index() ? device.index() : 0).value_or(0);
  return d;
}

int64_t LossChunkTokens(int64_t requested, int64_t vocab_size, const LossChunkDevice& device) {
  if (requested > 0) return requested;
  if (vocab_size < kLossChunkMinVocab) return 0;
  int64_t budget = kLossChunkLogitBytes;
  if (device.type == at::kCUDA) {
    budget = std::clamp(device.memory_bytes / kCudaLossChunkMemoryShare, kCudaLossChunkMinBytes,
                        kCudaLossChunkMaxBytes);
  }
  return std::max<int64_t>(64, budget / (4 * std::max<int64_t>(vocab_size, 1)));
}

Tensor LinearCrossEntropySum(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                             int64_t chunk_tokens, double softcap, const WorkingWeight& working) {
  // The fused CUDA loss knows no soft-capping: a capped head takes the paths below on CUDA too.
  if (cuda_ops::Supported(hidden) && hidden.size(0) > 0 && softcap <= 0) {
    // CUDA: the fused path, also for a batch that fits one chunk (it never makes fp32 logits).
    const int64_t rows = chunk_tokens > 0 ? std::min(chunk_tokens, hidden.size(0)) : hidden.size(0);
    const torch::ScalarType dtype = LinearComputeDtype(hidden, weight);
    if (working && working.copies->dtype() == dtype) {
      return cuda_ops::LinearCrossEntropySum(hidden, working.View(weight.sizes()), targets, rows, dtype,
                                             weight);
    }
    return cuda_ops::LinearCrossEntropySum(hidden, weight, targets, rows, dtype);
  }
  if (chunk_tokens <= 0 || hidden.size(0) <= chunk_tokens) {
    Tensor logits = MixedLinear(hidden, weight).to(torch::kFloat32);
    if (softcap > 0) logits = torch::tanh(logits / softcap) * softcap;
    return torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  const torch::ScalarType dtype = LinearComputeDtype(hidden, weight);
  return ChunkedCrossEntropyFn::apply(hidden, weight, targets, chunk_tokens, static_cast<int64_t>(dtype),
                                      softcap);
}

}  // namespace sftctl::trainer
