// ConnectionRamp (client/connection_ramp.h): a fixed number stays fixed; otherwise one connection at
// the start, one more each second while the last one added raised the rate by 15% or more, never past
// the maximum. Time is passed in, so the rule is tested without sleeping.
#include "client/connection_ramp.h"

#include <gtest/gtest.h>

namespace sftctl::client {
namespace {

using SteadyClock = ConnectionRamp::SteadyClock;
constexpr uint64_t kMiB = 1 << 20;

TEST(ConnectionRamp, AFixedNumberStartsAllAndAddsNone) {
  ConnectionRamp ramp(3, 8);
  EXPECT_EQ(ramp.initial(), 3);
  EXPECT_EQ(ramp.max(), 3);
  const SteadyClock::time_point t0{};
  ramp.Started(0, t0);
  EXPECT_FALSE(ramp.ShouldAdd(100 * kMiB, 3, t0 + std::chrono::seconds(2)));
}

TEST(ConnectionRamp, AddsOneASecondWhileEachPaysOffAndStopsWhenOneDoesNot) {
  ConnectionRamp ramp(0, 8);
  EXPECT_EQ(ramp.initial(), 1);
  SteadyClock::time_point t{};
  ramp.Started(0, t);
  uint64_t bytes = 0;
  // One more second in which `mib` MiB moved over `open` connections: should one more open?
  const auto second = [&](uint64_t mib, int open) {
    t += std::chrono::seconds(1);
    bytes += mib * kMiB;
    return ramp.ShouldAdd(bytes, open, t);
  };
  // Not before a second has passed.
  EXPECT_FALSE(ramp.ShouldAdd(5 * kMiB, 1, t + std::chrono::milliseconds(900)));
  EXPECT_TRUE(second(10, 1));   // 10 MiB/s with one connection: add a second
  EXPECT_TRUE(second(20, 2));   // +100% with two: add a third
  EXPECT_FALSE(second(22, 3));  // +10% with three: the third did not pay off
  EXPECT_FALSE(second(80, 3));  // and no more after that, even if the rate jumps later
}

TEST(ConnectionRamp, NeverPastTheMaximum) {
  ConnectionRamp ramp(0, 2);
  SteadyClock::time_point t{};
  ramp.Started(0, t);
  uint64_t bytes = 0;
  int open = ramp.initial();
  for (int i = 1; i <= 5; ++i) {
    t += std::chrono::seconds(1);
    bytes += static_cast<uint64_t>(i) * 10 * kMiB;  // every addition doubles the rate or better
    if (ramp.ShouldAdd(bytes, open, t)) ++open;
  }
  EXPECT_EQ(open, 2);
  EXPECT_EQ(ConnectionRamp(0, 0).max(), 1);  // at least one
}

}  // namespace
}  // namespace sftctl::client
