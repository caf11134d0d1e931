// WaitFor: polling until something happens, in one place.
//
//   ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(port_file); }));
//
// Calls `pred` on the calling thread at once and then every kPollInterval (10 ms) until it returns
// true, or until `timeout` of real (steady) time has passed; then calls it once more and returns that
// last value. The default timeout, kWaitTimeout (90 s), is generous on purpose: the suite must pass on
// a loaded 2-core machine under sanitizers, and a test only spends it when it is failing anyway.
//
// Only for waiting on a positive event. That something does NOT happen cannot be shown by waiting a
// while: give the code under test an OffsetClock (tests/util/offset_clock.h) and wait for it to have
// looked at the time (OffsetClock::reads()), or wait for a later event that would come after it.
// Thread-compatible: `pred` runs only on the caller's thread.
#pragma once

#include <chrono>
#include <thread>
#include <utility>

namespace sftctl::testing {

inline constexpr std::chrono::milliseconds kPollInterval{10};
inline constexpr std::chrono::seconds kWaitTimeout{90};

// REQUIRES: `pred` is callable as bool() and may be called many times. `poll`: a longer interval
// for a `pred` that is costly to ask (one that runs a command, e.g. squeue).
template <typename Pred>
bool WaitFor(Pred&& pred, std::chrono::milliseconds timeout = kWaitTimeout,
             std::chrono::milliseconds poll = kPollInterval) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(poll);
  }
  return static_cast<bool>(pred());
}

}  // namespace sftctl::testing
