#include "trainer/model/sampling.h"

#include <algorithm>

namespace sftctl::trainer {

int32_t TokenSampler::Next(const torch::Tensor& logits) {
  torch::Tensor l = logits.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  if (opt_.temperature <= 0) return static_cast<int32_t>(l.argmax().item<int64_t>());
  // Highest first; a stable sort keeps equal logits in id order.
  auto [sorted, order] =
      torch::sort(l.div(opt_.temperature), /*stable=*/true, /*dim=*/0, /*descending=*/true);
  int64_t keep = sorted.size(0);
  if (opt_.top_k > 0) keep = std::min(keep, opt_.top_k);
  torch::Tensor probs = torch::softmax(sorted.narrow(0, 0, keep), 0);
  return static_cast<int32_t>(order[Draw(probs.data_ptr<float>(), keep, keep)].item<int64_t>());
}

int64_t TokenSampler::Draw(const float* p, int64_t keep, int64_t n) {
  if (opt_.top_p < 1.0) {
    // The smallest prefix whose mass reaches top_p.
    double mass = 0;
    int64_t m = 0;
    while (m < keep && mass < opt_.top_p) {
      if (m >= n) return -1;
      mass += p[m++];
    }
    keep = std::max<int64_t>(m, 1);
  }
  if (keep > n) return -1;
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[i];
  // A uniform double in [0, total) from the top 53 bits of one draw.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return i;
  }
  return keep - 1;
}

std::vector<int32_t> NextTokens(const torch::Tensor& logits, std::vector<TokenSampler>& samplers,
                                const std::vector<char>& skip) {
  torch::NoGradGuard no_grad;
  const int64_t B = logits.size(0), V = logits.size(1);
  std::vector<int32_t> out(static_cast<size_t>(B), -1);
  if (B == 0) return out;
  const SamplingOptions& o = samplers[0].options();
  torch::Tensor l = logits.detach().to(torch::kFloat32);
  if (o.temperature <= 0) {
    const torch::Tensor ids = l.argmax(1).to(torch::kCPU);
    const auto a = ids.accessor<int64_t, 1>();
    for (int64_t b = 0; b < B; ++b) {
      if (!skip[b]) out[b] = static_cast<int32_t>(a[b]);
    }
    return out;
  }
  auto [sorted, order] = torch::sort(l.div(o.temperature), /*stable=*/true, /*dim=*/1, /*descending=*/true);
  const int64_t keep = o.top_k > 0 ? std::min(V, o.top_k) : V;
  const torch::Tensor probs = torch::softmax(sorted.narrow(1, 0, keep), 1);
  int64_t n = keep;
  if (o.top_p < 1.0) {
    // The columns the rows' top_p prefixes need, estimated on the device (with a margin for
    // rounding: Draw asks for the whole row when it falls short).
    const torch::Tensor p64 = probs.to(torch::kFloat64);
    const torch::Tensor before = p64.cumsum(1) - p64;  // the mass ahead of each candidate
    n = std::min(keep, before.lt(o.top_p).sum(1).max().item<int64_t>() + 2);
  }
  const torch::Tensor host_p = probs.narrow(1, 0, n).to(torch::kCPU).contiguous();
  const torch::Tensor host_order = order.narrow(1, 0, n).to(torch::kCPU).contiguous();
  for (int64_t b = 0; b < B; ++b) {
    if (skip[b]) continue;
    int64_t pick = samplers[b].Draw(host_p.data_ptr<float>() + b * n, keep, n);
    if (pick >= 0) {
      out[b] = static_cast<int32_t>(host_order[b][pick].item<int64_t>());
    } else {
      const torch::Tensor row = probs[b].to(torch::kCPU).contiguous();
      pick = samplers[b].Draw(row.data_ptr<float>(), keep, keep);
      out[b] = static_cast<int32_t>(order[b][pick].item<int64_t>());
    }
  }
  return out;
}

}  // namespace sftctl::trainer
