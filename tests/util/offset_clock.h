// OffsetClock: real steady time plus an offset that a test moves forward, so code waiting on a
// timeout (the step heartbeat, a kill grace) sees it pass at once, while timers that run on real
// time keep running. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>

#include "common/clock.h"

namespace sftctl::testing {

class OffsetClock final : public Clock {
 public:
  TimePoint Now() const override {
    return std::chrono::steady_clock::now() + std::chrono::nanoseconds(offset_ns_.load());
  }
  void Advance(std::chrono::nanoseconds by) { offset_ns_ += by.count(); }

 private:
  std::atomic<int64_t> offset_ns_{0};
};

}  // namespace sftctl::testing
