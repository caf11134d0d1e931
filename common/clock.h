// Clock: the time source of timeouts (the step heartbeat, the TERM->KILL grace period). Components
// that wait for time to pass take a `const Clock*`, so tests advance time instead of sleeping
// (tests/util/offset_clock.h).
//
// Thread safety: Now() may be called from any thread. Clock::Real() lives forever.
#pragma once

#include <chrono>

namespace sftctl {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  // Monotonic: never goes back.
  virtual TimePoint Now() const = 0;

  // std::chrono::steady_clock.
  static const Clock* Real();
};

}  // namespace sftctl
