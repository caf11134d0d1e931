#include "common/os/clock.h"

#include <thread>

namespace sftctl {
namespace {

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  void SleepFor(std::chrono::nanoseconds d) const override {
    if (d.count() > 0) std::this_thread::sleep_for(d);
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const SteadyClock* const clock = new SteadyClock();
  return clock;
}

}  // namespace sftctl
