// ConnectionRamp: how many connections a parallel transfer (range pulls, range uploads) uses. One
// policy for both directions: a number the user fixed, else start with one connection and add one,
// up to a maximum, about once a second while the one added last raised the total rate by at least
// 15%. More connections help while each is bound by a window per round trip or by one core's
// crypto; once the link or the CPU is full, another one only adds work, and the ramp stops.
//
// The time comes from a Clock (common/os/clock.h), so tests decide when a second has passed.
//
// Thread safety: one thread calls it (the transfer's coordinating thread).
#pragma once

#include <cstdint>

#include "common/os/clock.h"

namespace sftctl::client {

class ConnectionRamp {
 public:
  // `fixed` > 0: exactly that many connections; else up to `max_auto` (at least 1) chosen as above.
  // REQUIRES: `clock` outlives the ramp.
  ConnectionRamp(int fixed, int max_auto, const Clock* clock = Clock::Real());

  // How many connections to open at the start.
  int initial() const { return fixed_ ? max_ : 1; }
  // The most connections this transfer may use.
  int max() const { return max_; }
  // Starts the first measurement interval: `bytes` moved so far, now.
  void Started(uint64_t bytes);
  // Called often (every ~100 ms or faster) with the bytes moved so far and the connections open;
  // true when one more should be opened now (the caller then opens it).
  bool ShouldAdd(uint64_t bytes, int open);

 private:
  const Clock* clock_;
  bool fixed_;
  int max_;
  bool stopped_ = false;
  double last_rate_ = 0;  // bytes per second of the interval before the last addition
  Clock::TimePoint since_;
  uint64_t bytes_at_since_ = 0;
};

}  // namespace sftctl::client
