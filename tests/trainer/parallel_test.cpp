// The fused kernels' parallel-for seam (trainer/runtime/parallel.h): both backends, several thread counts.
#include "trainer/runtime/parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace sftctl::trainer {
namespace {

using parallel::Backend;

std::vector<Backend> AvailableBackends() {
  std::vector<Backend> b = {Backend::kPool};
  if (parallel::AtenAvailable()) b.push_back(Backend::kAten);
  return b;
}

// Runs the test body under one backend and thread count, restoring both afterwards.
class ParallelFor : public ::testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  void SetUp() override {
    saved_threads_ = torch::get_num_threads();
    saved_backend_ = parallel::CurrentBackend();
    ASSERT_TRUE(parallel::SetBackend(std::get<0>(GetParam())).ok());
    torch::set_num_threads(std::get<1>(GetParam()));
  }
  void TearDown() override {
    torch::set_num_threads(saved_threads_);
    ASSERT_TRUE(parallel::SetBackend(saved_backend_).ok());
  }
  int threads() const { return std::get<1>(GetParam()); }

 private:
  int saved_threads_ = 1;
  Backend saved_backend_ = Backend::kPool;
};

TEST_P(ParallelFor, EmptyRangeCallsNothing) {
  int calls = 0;
  parallel::For(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  parallel::For(7, 3, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST_P(ParallelFor, GrainLargerThanRangeRunsOnceOnTheCaller) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  std::thread::id ran_on;
  parallel::For(3, 40, 100, [&](int64_t b, int64_t e) {
    calls.emplace_back(b, e);
    ran_on = std::this_thread::get_id();
  });
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], std::make_pair(int64_t{3}, int64_t{40}));
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST_P(ParallelFor, CoversEveryIndexExactlyOnceInSubrangesOfAtLeastTheGrain) {
  for (int64_t n : {1, 2, 7, 100, 10007}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int64_t> smallest{n};
    std::atomic<int> calls{0};
    parallel::For(0, n, 3, [&](int64_t b, int64_t e) {
      ASSERT_LT(b, e);
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      if (e < n) smallest = std::min<int64_t>(smallest, e - b);  // the last may be shorter
      calls++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i;
    if (n > 3) {
      EXPECT_GE(smallest.load(), 3) << "n=" << n;
    }
    EXPECT_LE(calls.load(), n > 3 ? (n + 2) / 3 : 1) << "n=" << n;
  }
}

TEST_P(ParallelFor, RethrowsTheExceptionOfASubrangeAndStaysUsable) {
  auto run = [&] {
    parallel::For(0, 1000, 10, [&](int64_t b, int64_t e) {
      if (b <= 500 && 500 < e) throw std::runtime_error("index 500 failed");
    });
  };
  try {
    run();
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "index 500 failed");
  }
  std::atomic<int64_t> sum{0};
  parallel::For(0, 1000, 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
}

TEST_P(ParallelFor, NestedCallsCompleteAndCoverTheirRanges) {
  std::vector<std::atomic<int>> hits(64 * 64);
  parallel::For(0, 64, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      parallel::For(0, 64, 1, [&](int64_t jb, int64_t je) {
        for (int64_t j = jb; j < je; ++j) hits[static_cast<size_t>(i * 64 + j)]++;
      });
    }
  });
  for (size_t k = 0; k < hits.size(); ++k) ASSERT_EQ(hits[k].load(), 1) << "index " << k;
}

TEST_P(ParallelFor, ConcurrentCallersFromSeveralThreadsEachGetTheirWholeRange) {
  constexpr int kCallers = 3, kRounds = 200;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        std::atomic<int64_t> sum{0};
        parallel::For(0, 5000, 100, [&](int64_t b, int64_t e) {
          int64_t s = 0;
          for (int64_t i = b; i < e; ++i) s += i;
          sum += s;
        });
        sums[c] += sum.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(sums[c], int64_t{kRounds} * 4999 * 5000 / 2) << "caller " << c;
}

// The point of the seam: with more than one thread configured the work really spreads out (an
// OpenMP-less compile of at::parallel_for would silently stay on the caller).
TEST_P(ParallelFor, UsesSeveralThreadsWhenConfigured) {
  std::mutex mu;
  std::set<std::thread::id> seen;
  parallel::For(0, 16, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lk(mu);
      seen.insert(std::this_thread::get_id());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  });
  if (threads() == 1) {
    EXPECT_EQ(seen.size(), 1u);
  } else {
    EXPECT_GE(seen.size(), 2u);
    EXPECT_LE(seen.size(), static_cast<size_t>(threads()));
  }
}

INSTANTIATE_TEST_SUITE_P(BackendsAndThreads, ParallelFor,
                         ::testing::Combine(::testing::ValuesIn(AvailableBackends()),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == Backend::kPool ? "pool" : "aten") +
                                  std::to_string(std::get<1>(info.param)) + "threads";
                         });

TEST(ParallelBackend, SetBackendRefusesAtenOnlyWhereItIsSerial) {
  const Backend saved = parallel::CurrentBackend();
  EXPECT_TRUE(parallel::SetBackend(Backend::kPool).ok());
  EXPECT_EQ(parallel::CurrentBackend(), Backend::kPool);
  const Status s = parallel::SetBackend(Backend::kAten);
  if (parallel::AtenAvailable()) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(parallel::CurrentBackend(), Backend::kAten);
  } else {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parallel::CurrentBackend(), Backend::kPool);
  }
  EXPECT_STREQ(parallel::BackendName(Backend::kPool), "pool");
  EXPECT_TRUE(parallel::SetBackend(saved).ok());
}

// The default, and SFTCTL_PARALLEL as tests/trainer/CMakeLists.txt sets it for extra runs of
// this test: "pool" selects the pool, anything else unknown keeps the default.
TEST(ParallelBackend, DefaultFollowsTheBuildAndSftctlParallel) {
  const char* env = std::getenv("SFTCTL_PARALLEL");
  const std::string v = env ? env : "";
  const Backend build_default = parallel::AtenAvailable() ? Backend::kAten : Backend::kPool;
  const Backend want = v == "pool" ? Backend::kPool : build_default;
  EXPECT_EQ(parallel::CurrentBackend(), want) << "SFTCTL_PARALLEL=" << v;
}

}  // namespace
}  // namespace sftctl::trainer
