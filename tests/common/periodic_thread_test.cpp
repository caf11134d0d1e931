// PeriodicThread (common/os/periodic_thread.h): runs at once and then every interval, and Stop (or
// destruction) ends the wait between runs at once instead of sleeping out the interval.
#include "common/os/periodic_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "tests/util/wait_for.h"

namespace sftctl {
namespace {

using ::sftctl::testing::WaitFor;
using namespace std::chrono_literals;

// An interval no test waits out: a Stop that returns at all within a test's time woke the wait.
constexpr auto kForever = std::chrono::hours(24);
// Far below kForever, far above any scheduling delay of a loaded 2-core machine under sanitizers.
constexpr auto kPrompt = 30s;

TEST(PeriodicThread, RunsAtOnceAndThenEveryInterval) {
  std::atomic<int> runs{0};
  PeriodicThread loop(5ms, [&] { ++runs; });
  EXPECT_EQ(runs.load(), 0) << "nothing runs before Start";
  loop.Start();
  EXPECT_TRUE(WaitFor([&] { return runs.load() >= 3; })) << runs.load() << " runs";
  loop.Stop();
  const int after_stop = runs.load();
  std::this_thread::sleep_for(20ms);  // four intervals: a loop still running would have run again
  EXPECT_EQ(runs.load(), after_stop) << "no run after Stop returned";
}

TEST(PeriodicThread, StopEndsTheWaitAtOnce) {
  std::atomic<int> runs{0};
  PeriodicThread loop(kForever, [&] { ++runs; });
  loop.Start();
  ASSERT_TRUE(WaitFor([&] { return runs.load() == 1; })) << "the first run comes at Start";
  const auto begin = std::chrono::steady_clock::now();
  loop.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - begin, kPrompt);
  EXPECT_EQ(runs.load(), 1);
  loop.Stop();  // again: nothing to do
}

TEST(PeriodicThread, DestructionStopsIt) {
  std::atomic<int> runs{0};
  auto loop = std::make_unique<PeriodicThread>(kForever, [&] { ++runs; });
  loop->Start();
  ASSERT_TRUE(WaitFor([&] { return runs.load() == 1; }));
  const auto begin = std::chrono::steady_clock::now();
  loop.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - begin, kPrompt);
  EXPECT_EQ(runs.load(), 1);
}

TEST(PeriodicThread, StopWaitsForTheRunInProgressAndThenNoneFollows) {
  std::atomic<int> runs{0};
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  PeriodicThread loop(1ms, [&] {
    if (++runs == 1) {
      entered.set_value();
      released.wait();  // the first run blocks until the test lets it go
    }
  });
  loop.Start();
  entered.get_future().wait();
  auto stopped = std::async(std::launch::async, [&] { loop.Stop(); });
  EXPECT_EQ(stopped.wait_for(50ms), std::future_status::timeout) << "Stop returned during a run";
  release.set_value();
  EXPECT_EQ(stopped.wait_for(kPrompt), std::future_status::ready);
  EXPECT_EQ(runs.load(), 1) << "Stop began during the first run: there is no second";
}

TEST(PeriodicThread, StoppedBeforeStartNeverRuns) {
  std::atomic<int> runs{0};
  PeriodicThread loop(1ms, [&] { ++runs; });
  loop.Stop();
  loop.Start();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(runs.load(), 0);
}

}  // namespace
}  // namespace sftctl
