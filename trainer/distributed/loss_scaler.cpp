#include "trainer/distributed/loss_scaler.h"

#include <algorithm>

namespace sftctl::trainer {

DynamicLossScaler::DynamicLossScaler(const Options& options)
    : options_(options), scale_(options.init_scale) {}

void DynamicLossScaler::OnGoodStep() {
  if (++good_steps_ < options_.growth_interval) return;
  scale_ *= options_.growth_factor;
  good_steps_ = 0;
}

bool DynamicLossScaler::OnOverflow() {
  good_steps_ = 0;
  if (scale_ <= options_.min_scale) return false;
  scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
  return true;
}

void DynamicLossScaler::Restore(double scale, int64_t good_steps) {
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace sftctl::trainer
