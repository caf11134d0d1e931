// The client's one reconnect loop (Reconnector::Run in client/remote/agent_session.h), on an OffsetClock:
// which failures are retried, the back-off it sleeps (doubling, capped), when it gives up (attempts, time
// since the last progress) and with which error, and what counts as progress. No real time passes:
// the back-offs move the clock.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "client/remote/agent_session.h"
#include "tests/util/offset_clock.h"
#include "tests/util/status_matchers.h"

namespace sftctl::client {
namespace {

using ::sftctl::testing::OffsetClock;
using ::sftctl::testing::StatusIs;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::unique_ptr<AgentSession> FakeSession() {
  return std::make_unique<AgentSession>(nullptr, "token", "gpu-box");
}

class ReconnectLoop : public ::testing::Test {
 protected:
  ReconnectLoop() {
    policy_.max_attempts = 4;
    policy_.initial_backoff = milliseconds(100);
    policy_.max_backoff = milliseconds(250);
    policy_.max_time = std::chrono::hours(1);
    policy_.clock = &clock_;
  }
  // A reconnector whose first session exists; the factory fails `refusals_` times (with `refusal_`)
  // before it connects.
  std::unique_ptr<Reconnector> Make(bool connected = true) {
    auto factory = [this]() -> StatusOr<std::unique_ptr<AgentSession>> {
      ++connects_;
      if (refusals_ > 0) {
        --refusals_;
        return refusal_;
      }
      return FakeSession();
    };
    return std::make_unique<Reconnector>(connected ? FakeSession() : nullptr, factory, policy_);
  }

  OffsetClock clock_;
  RetryPolicy policy_;
  int connects_ = 0;
  int refusals_ = 0;
  Status refusal_ = UnavailableError("connection refused");
};

TEST_F(ReconnectLoop, TransientFailuresBackOffDoublingUpToTheCapThenGiveUp) {
  auto rc = Make();
  int calls = 0;
  Status s = rc->Run([&](AgentSession& a) {
    ++calls;
    EXPECT_EQ(a.host(), "gpu-box");
    return Attempt{UnavailableError("stream reset")};
  });
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable,
                          HasSubstr("lost the connection to gpu-box and could not resume after 4 attempt(s): "
                                    "stream reset")));
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(clock_.offset(), milliseconds(100 + 200 + 250));  // no pause after the last failure
  EXPECT_EQ(rc->reconnects(), 3);                             // each retry on a new session
  EXPECT_EQ(connects_, 3);
}

TEST_F(ReconnectLoop, AFailureNoNewConnectionCuresIsReturnedAsIsAtOnce) {
  auto rc = Make();
  int calls = 0;
  Status s = rc->Run([&](AgentSession&) {
    ++calls;
    return Attempt{PermissionDeniedError("bad token")};
  });
  EXPECT_THAT(s, StatusIs(StatusCode::kPermissionDenied, HasSubstr("bad token")));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(clock_.offset(), milliseconds(0));
  EXPECT_EQ(connects_, 0);
}

TEST_F(ReconnectLoop, AFinalAttemptEndsTheLoopEvenWhenItsErrorLooksTransient) {
  auto rc = Make();
  int calls = 0;
  Status s = rc->Run([&](AgentSession&) {
    ++calls;
    return Attempt{InternalError("disk write failed here"), /*final=*/true};
  });
  EXPECT_THAT(s, StatusIs(StatusCode::kInternal, HasSubstr("disk write failed here")));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(clock_.offset(), milliseconds(0));
  EXPECT_EQ(connects_, 0);
}

TEST_F(ReconnectLoop, ProgressStartsTheBudgetOver) {
  auto rc = Make();
  int calls = 0;
  // Six failures in a row, each after some bytes arrived: more than max_attempts (4), yet it goes on,
  // and every pause is the first back-off again.
  Status s = rc->Run([&](AgentSession&) {
    if (++calls <= 6) return Attempt{UnavailableError("reset"), false, /*progressed=*/true};
    return Attempt{OkStatus()};
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(calls, 7);
  EXPECT_EQ(clock_.offset(), milliseconds(6 * 100));
}

TEST_F(ReconnectLoop, GivesUpOnceMaxTimeHasPassedSinceTheLastProgress) {
  policy_.max_attempts = 100;
  policy_.max_time = std::chrono::seconds(10);
  auto rc = Make();
  int calls = 0;
  Status s = rc->Run([&](AgentSession&) {
    ++calls;
    clock_.Advance(std::chrono::seconds(3));  // each attempt hangs 3 s before it fails
    return Attempt{DeadlineExceededError("no answer")};
  });
  // 3 s, 6.1 s, 9.3 s: retried; 12.55 s: past the 10 s.
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable, HasSubstr("after 4 attempt(s): no answer")));
  EXPECT_EQ(calls, 4);
}

TEST_F(ReconnectLoop, AFailedConnectIsAFailedAttempt) {
  refusals_ = 2;
  auto rc = Make(/*connected=*/false);
  int calls = 0;
  Status s = rc->Run([&](AgentSession&) {
    ++calls;
    return Attempt{OkStatus()};
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(connects_, 3);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(clock_.offset(), milliseconds(100 + 200));
  EXPECT_EQ(rc->reconnects(), 1);  // only a connect that succeeded
}

TEST_F(ReconnectLoop, ARefusedConnectThatNoRetryCuresIsReturnedAsIs) {
  refusals_ = 5;
  refusal_ = PermissionDeniedError("host key mismatch");
  auto rc = Make(/*connected=*/false);
  Status s = rc->Run([&](AgentSession&) { return Attempt{OkStatus()}; });
  EXPECT_THAT(s, StatusIs(StatusCode::kPermissionDenied, HasSubstr("host key mismatch")));
  EXPECT_EQ(connects_, 1);
}

TEST_F(ReconnectLoop, WithRetryCountsASuccessAsProgress) {
  policy_.max_attempts = 3;
  auto rc = Make();
  int failures_left = 0;
  const auto call = [&](AgentSession&) {
    if (failures_left > 0) {
      --failures_left;
      return UnavailableError("dropped");
    }
    return OkStatus();
  };
  // Two failures then a success, twice: the second call has a budget of 3 again (without the reset
  // after the first success it would give up at its first failure).
  failures_left = 2;
  EXPECT_TRUE(WithRetry(rc.get(), call).ok());
  failures_left = 2;
  EXPECT_TRUE(WithRetry(rc.get(), call).ok());
  EXPECT_EQ(clock_.offset(), milliseconds(2 * (100 + 200)));
  failures_left = 3;
  EXPECT_THAT(WithRetry(rc.get(), call),
              StatusIs(StatusCode::kUnavailable, HasSubstr("3 attempt(s): dropped")));
}

TEST_F(ReconnectLoop, HelperConnectionsShareTheClockAndPolicy) {
  auto rc = Make();
  ConnectionSet set(rc.get());
  EXPECT_EQ(set.Add(), rc.get());
  Reconnector* helper = set.Add();
  ASSERT_NE(helper, rc.get());
  EXPECT_EQ(helper->policy().clock, &clock_);
  Status s = helper->Run([&](AgentSession&) { return Attempt{UnavailableError("gone")}; });
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable, HasSubstr("4 attempt(s)")));
  EXPECT_EQ(clock_.offset(), milliseconds(100 + 200 + 250));
  set.Fold();  // the helper's first connection is not a reconnect; its 3 later ones are
  EXPECT_EQ(rc->reconnects(), 3);
}

}  // namespace
}  // namespace sftctl::client
