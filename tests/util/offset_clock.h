// OffsetClock: real steady time plus an offset that a test moves forward, so code waiting on a
// timeout (the step heartbeat, a kill grace) sees it pass at once, while timers that run on real
// time keep running. SleepFor moves the offset instead of sleeping: a retry back-off costs no real
// time, and offset() tells how long the code under test slept. reads() counts the calls to Now(): a
// test that must show that nothing happens before the clock moves waits (tests/util/wait_for.h) until
// the code under test has read the time a few more times, instead of sleeping a while. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/os/clock.h"

namespace sftctl::testing {

class OffsetClock final : public Clock {
 public:
  TimePoint Now() const override {
    reads_.fetch_add(1);
    return std::chrono::steady_clock::now() + std::chrono::nanoseconds(offset_ns_.load());
  }
  void SleepFor(std::chrono::nanoseconds d) const override {
    if (d.count() > 0) offset_ns_ += d.count();
  }
  void Advance(std::chrono::nanoseconds by) { offset_ns_ += by.count(); }
  // The sum of every Advance and SleepFor so far.
  std::chrono::nanoseconds offset() const { return std::chrono::nanoseconds(offset_ns_.load()); }
  // How many times Now() has been called so far.
  uint64_t reads() const { return reads_.load(); }

 private:
  mutable std::atomic<int64_t> offset_ns_{0};
  mutable std::atomic<uint64_t> reads_{0};
};

// ManualClock: time that moves only when the test says (Advance, or the code under test's SleepFor),
// never by itself: for a decision that must not depend on how fast the machine ran the code before
// it (e.g. "a second has passed"). Thread-safe.
class ManualClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(std::chrono::nanoseconds(now_ns_.load())); }
  void SleepFor(std::chrono::nanoseconds d) const override {
    if (d.count() > 0) now_ns_ += d.count();
  }
  void Advance(std::chrono::nanoseconds by) { now_ns_ += by.count(); }

 private:
  mutable std::atomic<int64_t> now_ns_{0};
};

}  // namespace sftctl::testing
