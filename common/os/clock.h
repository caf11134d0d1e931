// Clock: the time source of timeouts and back-offs (the step heartbeat, the TERM->KILL grace period,
// a reconnect's pause). Components that wait for time to pass take a `const Clock*` and both read the
// time and sleep through it, so tests advance time instead of sleeping (tests/util/offset_clock.h).
//
// Thread safety: Now() and SleepFor() may be called from any thread. Clock::Real() lives forever.
#pragma once

#include <chrono>

namespace sftctl {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  // Monotonic: never goes back.
  virtual TimePoint Now() const = 0;
  // Returns once `d` has passed on this clock (Now() has moved on by at least `d`); at once when
  // d <= 0. A test clock may move itself forward instead of waiting.
  virtual void SleepFor(std::chrono::nanoseconds d) const = 0;

  // std::chrono::steady_clock and std::this_thread::sleep_for.
  static const Clock* Real();
};

}  // namespace sftctl
