// Dynamic loss scaling for fp16 training (precision: fp16).
//
// fp16 has 5 exponent bits: small gradients underflow to zero. The loss is multiplied by a
// scale S before backward so gradients land in fp16's range, and the gradients are divided by S
// before clipping and the optimizer step. When any gradient overflowed (inf/NaN) the step is
// skipped and S halves; after `growth_interval` good steps in a row S doubles. Scales are
// powers of two, so scaling and unscaling are exact in fp32 (the master weights' dtype).
//
// Thread safety: none; one training loop owns it.
#pragma once

#include <cstdint>

namespace sftctl::trainer {

class DynamicLossScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, as torch.cuda.amp.GradScaler
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;  // good steps in a row before the scale grows
    double min_scale = 1.0;          // overflowing at this scale is not an fp16 range problem
  };

  DynamicLossScaler() : DynamicLossScaler(Options()) {}
  explicit DynamicLossScaler(const Options& options);

  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }

  // Records a step whose gradients were all finite; may grow the scale.
  void OnGoodStep();
  // Records an overflowed step and lowers the scale. Returns false (scale unchanged) when the
  // scale is already at min_scale: the overflow is then not a loss-scaling problem.
  bool OnOverflow();

  // Restores the state saved with a checkpoint (scale > 0).
  void Restore(double scale, int64_t good_steps);

 private:
  Options options_;
  double scale_;
  int64_t good_steps_ = 0;
};

}  // namespace sftctl::trainer
