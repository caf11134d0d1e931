// PhaseTimer: where a training step's time goes, without a profiler (spec `metrics.phase_times`,
// docs/observability.md).
//
// A step is cut into four phases: forward (the decoder's hidden states), loss (the loss head's
// chunked cross-entropy from those states), backward, and optimizer (unscale, clip, AdamW update).
// The trainer brackets each with Begin/End; a phase bracketed several times in one step (the
// micro-batches of gradient accumulation) adds up. Collect returns the step's sums in milliseconds
// and starts the next step from zero.
//
// What is measured depends on the device:
//   - CUDA (in a build whose LibTorch has CUDA): a pair of timing CUDA events recorded on the
//     current stream around each bracket, so the times are the GPU's, not the host's launch time.
//     Begin/End never wait for the device; Collect waits for the last event recorded (the
//     optimizer's end), then reads every pair. The events are reused from step to step.
//   - Any other device: a steady clock on the host. On the CPU that is the work itself; on MPS,
//     whose kernels run asynchronously, it is mostly the launch.
//
// Thread safety: one thread (the training loop). Not copyable.
#pragma once

#include <torch/torch.h>

#include <array>
#include <memory>
#include <nlohmann/json.hpp>

namespace sftctl::trainer {

enum class Phase { kForward = 0, kLoss, kBackward, kOptimizer };
inline constexpr int kPhaseCount = 4;

// "forward", "loss", "backward", "optimizer".
const char* PhaseName(Phase phase);

// One step's time per phase, in milliseconds.
struct PhaseTimes {
  std::array<double, kPhaseCount> ms{};

  double& operator[](Phase p) { return ms[static_cast<int>(p)]; }
  double operator[](Phase p) const { return ms[static_cast<int>(p)]; }
  // Adds "forward_ms", "loss_ms", "backward_ms" and "optimizer_ms" to a step record (flat numbers,
  // so that TensorBoard and `sftctl plot --metric` take them like any other field).
  void AddTo(nlohmann::json* record) const;
};

class PhaseTimer {
 public:
  // Times on `device`: CUDA events for a CUDA device when this build has LibTorch's CUDA library,
  // else the host's steady clock.
  explicit PhaseTimer(const torch::Device& device);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  // REQUIRES: no phase is open. Opens `phase`.
  void Begin(Phase phase);
  // REQUIRES: `phase` is the open phase. Closes it, adding its time to the step's.
  void End(Phase phase);
  // The phases' sums since the last Collect (or construction), then zero. On CUDA it waits for the
  // last event recorded. REQUIRES: no phase is open.
  PhaseTimes Collect();

  // Whether the times come from CUDA events.
  bool uses_cuda_events() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Begin on construction, End on destruction; nothing when `timer` is null.
class PhaseScope {
 public:
  PhaseScope(PhaseTimer* timer, Phase phase) : timer_(timer), phase_(phase) {
    if (timer_) timer_->Begin(phase_);
  }
  // Never throws: a failure to record the end (a CUDA error, which the next CUDA call reports too)
  // leaves that bracket unmeasured.
  ~PhaseScope() {
    if (!timer_) return;
    try {
      timer_->End(phase_);
    } catch (const std::exception&) {
    }
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimer* timer_;
  Phase phase_;
};

}  // namespace sftctl::trainer
