#include "client/remote/connection_ramp.h"

#include <algorithm>

namespace sftctl::client {

ConnectionRamp::ConnectionRamp(int fixed, int max_auto, const Clock* clock)
    : clock_(clock), fixed_(fixed > 0), max_(fixed > 0 ? fixed : std::max(1, max_auto)) {}

void ConnectionRamp::Started(uint64_t bytes) {
  since_ = clock_->Now();
  bytes_at_since_ = bytes;
}

bool ConnectionRamp::ShouldAdd(uint64_t bytes, int open) {
  if (fixed_ || stopped_ || open >= max_) return false;
  const Clock::TimePoint now = clock_->Now();
  const double secs = std::chrono::duration<double>(now - since_).count();
  if (secs < 1.0) return false;
  const double rate = static_cast<double>(bytes - bytes_at_since_) / secs;
  if (last_rate_ > 0 && rate < last_rate_ * 1.15) {
    stopped_ = true;  // the last one added did not pay off
    return false;
  }
  last_rate_ = rate;
  since_ = now;
  bytes_at_since_ = bytes;
  return true;
}

}  // namespace sftctl::client
