#include "trainer/sampling.h"

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
  const float* p = probs.data_ptr<float>();
  if (opt_.top_p < 1.0) {
    // The smallest prefix whose mass reaches top_p.
    double mass = 0;
    int64_t n = 0;
    while (n < keep && mass < opt_.top_p) mass += p[n++];
    keep = std::max<int64_t>(n, 1);
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[i];
  // A uniform double in [0, total) from the top 53 bits of one draw.
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0) * total;
  double acc = 0;
  int64_t pick = keep - 1;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) {
      pick = i;
      break;
    }
  }
  return static_cast<int32_t>(order[pick].item<int64_t>());
}

}  // namespace sftctl::trainer
