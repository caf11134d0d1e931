// ConnectionRamp (client/remote/connection_ramp.h): a fixed number stays fixed; otherwise one connection at
// the start, one more each second while the last one added raised the rate by 15% or more, never past
// the maximum. Time is an OffsetClock the test moves, so the rule is tested without sleeping (a real
// second passing during a test only makes an interval longer; every bound below keeps its answer
// for intervals up to twice as long).
#include "client/remote/connection_ramp.h"

#include <gtest/gtest.h>

#include "tests/util/offset_clock.h"

namespace sftctl::client {
namespace {

using sftctl::testing::OffsetClock;
constexpr uint64_t kMiB = 1 << 20;

TEST(ConnectionRamp, AFixedNumberStartsAllAndAddsNone) {
  OffsetClock clock;
  ConnectionRamp ramp(3, 8, &clock);
  EXPECT_EQ(ramp.initial(), 3);
  EXPECT_EQ(ramp.max(), 3);
  ramp.Started(0);
  clock.Advance(std::chrono::seconds(2));
  EXPECT_FALSE(ramp.ShouldAdd(100 * kMiB, 3));
}

TEST(ConnectionRamp, AddsOneASecondWhileEachPaysOffAndStopsWhenOneDoesNot) {
  OffsetClock clock;
  ConnectionRamp ramp(0, 8, &clock);
  EXPECT_EQ(ramp.initial(), 1);
  ramp.Started(0);
  uint64_t bytes = 0;
  // One more second in which `mib` MiB moved over `open` connections: should one more open?
  const auto second = [&](uint64_t mib, int open) {
    clock.Advance(std::chrono::seconds(1));
    bytes += mib * kMiB;
    return ramp.ShouldAdd(bytes, open);
  };
  // Not before a second has passed (on this clock: a test that ran slowly does not change that).
  EXPECT_FALSE(ramp.ShouldAdd(5 * kMiB, 1));
  EXPECT_TRUE(second(10, 1));   // 10 MiB/s with one connection: add a second
  EXPECT_TRUE(second(20, 2));   // +100% with two: add a third
  EXPECT_FALSE(second(22, 3));  // +10% with three: the third did not pay off
  EXPECT_FALSE(second(80, 3));  // and no more after that, even if the rate jumps later
}

TEST(ConnectionRamp, NeverPastTheMaximum) {
  OffsetClock clock;
  ConnectionRamp ramp(0, 2, &clock);
  ramp.Started(0);
  uint64_t bytes = 0;
  int open = ramp.initial();
  for (int i = 1; i <= 5; ++i) {
    clock.Advance(std::chrono::seconds(1));
    bytes += static_cast<uint64_t>(i) * 10 * kMiB;  // every addition doubles the rate or better
    if (ramp.ShouldAdd(bytes, open)) ++open;
  }
  EXPECT_EQ(open, 2);
  EXPECT_EQ(ConnectionRamp(0, 0).max(), 1);  // at least one
}

}  // namespace
}  // namespace sftctl::client
