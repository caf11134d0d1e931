#include "trainer/training/phase_timer.h"

#include <chrono>
#include <vector>

// CUDA events exist only in CUDA builds of LibTorch (trainer/CMakeLists.txt defines
// SFTCTL_TORCH_CUDA there); CPU builds need no CUDA header.
#if defined(SFTCTL_TORCH_CUDA) && __has_include(<ATen/cuda/CUDAEvent.h>) && __has_include(<cuda_runtime_api.h>)
#include <ATen/cuda/CUDAEvent.h>
#define SFTCTL_HAVE_CUDA_EVENTS 1
#else
#define SFTCTL_HAVE_CUDA_EVENTS 0
#endif

namespace sftctl::trainer {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kLoss:
      return "loss";
    case Phase::kBackward:
      return "backward";
    case Phase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

void PhaseTimes::AddTo(nlohmann::json* record) const {
  for (int p = 0; p < kPhaseCount; ++p)
    (*record)[std::string(PhaseName(static_cast<Phase>(p))) + "_ms"] = ms[p];
}

struct PhaseTimer::Impl {
  using Clock = std::chrono::steady_clock;

  int open = -1;  // the open phase, -1 none
  PhaseTimes sums;
  Clock::time_point begun;  // host clock: when the open phase began

#if SFTCTL_HAVE_CUDA_EVENTS
  bool cuda = false;
  // One bracket: its phase and its two events, recorded on the current stream.
  struct Bracket {
    Phase phase = Phase::kForward;
    at::cuda::CUDAEvent begin{cudaEventDefault}, end{cudaEventDefault};
  };
  std::vector<std::unique_ptr<Bracket>> brackets;  // reused across steps
  size_t used = 0;                                 // brackets recorded this step
#endif
};

PhaseTimer::PhaseTimer(const torch::Device& device) : impl_(std::make_unique<Impl>()) {
#if SFTCTL_HAVE_CUDA_EVENTS
  impl_->cuda = device.is_cuda();
#else
  (void)device;
#endif
}

PhaseTimer::~PhaseTimer() = default;

bool PhaseTimer::uses_cuda_events() const {
#if SFTCTL_HAVE_CUDA_EVENTS
  return impl_->cuda;
#else
  return false;
#endif
}

void PhaseTimer::Begin(Phase phase) {
  TORCH_CHECK(impl_->open < 0, "PhaseTimer: ", PhaseName(phase), " begun while ",
              PhaseName(static_cast<Phase>(impl_->open)), " is open");
  impl_->open = static_cast<int>(phase);
#if SFTCTL_HAVE_CUDA_EVENTS
  if (impl_->cuda) {
    if (impl_->used == impl_->brackets.size()) impl_->brackets.push_back(std::make_unique<Impl::Bracket>());
    Impl::Bracket& b = *impl_->brackets[impl_->used++];
    b.phase = phase;
    b.begin.record();
    return;
  }
#endif
  impl_->begun = Impl::Clock::now();
}

void PhaseTimer::End(Phase phase) {
  TORCH_CHECK(impl_->open == static_cast<int>(phase), "PhaseTimer: ", PhaseName(phase),
              " ended but is not the open phase");
  impl_->open = -1;
#if SFTCTL_HAVE_CUDA_EVENTS
  if (impl_->cuda) {
    impl_->brackets[impl_->used - 1]->end.record();
    return;
  }
#endif
  impl_->sums[phase] += std::chrono::duration<double, std::milli>(Impl::Clock::now() - impl_->begun).count();
}

PhaseTimes PhaseTimer::Collect() {
  TORCH_CHECK(impl_->open < 0, "PhaseTimer: collected while ", PhaseName(static_cast<Phase>(impl_->open)),
              " is open");
#if SFTCTL_HAVE_CUDA_EVENTS
  if (impl_->cuda && impl_->used > 0) {
    // The events of one stream complete in order: once the last is done, all are.
    impl_->brackets[impl_->used - 1]->end.synchronize();
    for (size_t i = 0; i < impl_->used; ++i) {
      const Impl::Bracket& b = *impl_->brackets[i];
      impl_->sums[b.phase] += static_cast<double>(b.begin.elapsed_time(b.end));
    }
    impl_->used = 0;
  }
#endif
  PhaseTimes out = impl_->sums;
  impl_->sums = PhaseTimes();
  return out;
}

}  // namespace sftctl::trainer
