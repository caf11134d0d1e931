#include "common/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace sftctl {
namespace {

using ::testing::HasSubstr;

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_TRUE(OkStatus().ok());
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = InvalidArgumentError("bad field 'x'");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad field 'x'");
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: bad field 'x'");
}

TEST(StatusTest, HelpersUseTheirCodes) {
  const std::vector<std::pair<Status, StatusCode>> cases = {
      {InvalidArgumentError("m"), StatusCode::kInvalidArgument},
      {NotFoundError("m"), StatusCode::kNotFound},
      {AlreadyExistsError("m"), StatusCode::kAlreadyExists},
      {FailedPreconditionError("m"), StatusCode::kFailedPrecondition},
      {OutOfRangeError("m"), StatusCode::kOutOfRange},
      {DataLossError("m"), StatusCode::kDataLoss},
      {InternalError("m"), StatusCode::kInternal},
      {UnavailableError("m"), StatusCode::kUnavailable},
      {UnimplementedError("m"), StatusCode::kUnimplemented},
      {CancelledError("m"), StatusCode::kCancelled},
      {AbortedError("m"), StatusCode::kAborted},
      {ResourceExhaustedError("m"), StatusCode::kResourceExhausted},
      {DeadlineExceededError("m"), StatusCode::kDeadlineExceeded},
      {PermissionDeniedError("m"), StatusCode::kPermissionDenied},
      {UnauthenticatedError("m"), StatusCode::kUnauthenticated},
  };
  for (const auto& [status, code] : cases) {
    EXPECT_EQ(status.code(), code) << StatusCodeName(code);
    EXPECT_EQ(status.message(), "m");
    EXPECT_FALSE(status.ok());
  }
}

TEST(StatusTest, CodeNames) {
  EXPECT_STREQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_STREQ(StatusCodeName(StatusCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_STREQ(StatusCodeName(StatusCode::kNotFound), "NOT_FOUND");
  EXPECT_STREQ(StatusCodeName(StatusCode::kDataLoss), "DATA_LOSS");
  EXPECT_STREQ(StatusCodeName(StatusCode::kFailedPrecondition), "FAILED_PRECONDITION");
  EXPECT_STREQ(StatusCodeName(StatusCode::kUnauthenticated), "UNAUTHENTICATED");
  EXPECT_STREQ(StatusCodeName(static_cast<StatusCode>(999)), "UNKNOWN");
}

TEST(StatusTest, WithContext) {
  Status s = NotFoundError("no such file").WithContext("loading spec");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "loading spec: no such file");
  EXPECT_TRUE(OkStatus().WithContext("ignored").ok());
  EXPECT_EQ(OkStatus().WithContext("ignored").message(), "");
}

TEST(StatusTest, ErrnoErrorMapsCodes) {
  const std::vector<std::pair<int, StatusCode>> cases = {
      {ENOENT, StatusCode::kNotFound},          {EEXIST, StatusCode::kAlreadyExists},
      {EACCES, StatusCode::kPermissionDenied},  {EPERM, StatusCode::kPermissionDenied},
      {ENOSPC, StatusCode::kResourceExhausted}, {EIO, StatusCode::kInternal},
      {EISDIR, StatusCode::kInternal},
  };
  for (const auto& [err, code] : cases) {
    Status s = ErrnoError("cannot open", "/a/b", err);
    EXPECT_EQ(s.code(), code) << err;
    EXPECT_EQ(s.message(), std::string("cannot open '/a/b': ") + std::strerror(err));
  }
}

TEST(StatusOrTest, HoldsValue) {
  StatusOr<int> v = 42;
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(v.value(), 42);
  EXPECT_EQ(*v, 42);
  *v = 7;
  EXPECT_EQ(v.value(), 7);

  StatusOr<std::string> s = std::string("hello");
  EXPECT_EQ(s->size(), 5u);
}

TEST(StatusOrTest, HoldsError) {
  StatusOr<int> v = NotFoundError("gone");
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(v.status().message(), "gone");
}

TEST(StatusOrTest, MoveOnlyValue) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(5);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> owned = std::move(p).value();
  ASSERT_NE(owned, nullptr);
  EXPECT_EQ(*owned, 5);
}

#ifndef NDEBUG
TEST(StatusOrDeathTest, ConstructingFromOkStatusAsserts) {
  EXPECT_DEATH({ StatusOr<int> v(OkStatus()); }, "StatusOr constructed from OK status");
}
#endif

// ---- macros -------------------------------------------------------------------------------

Status Step(bool fail, int* calls) {
  ++*calls;
  return fail ? AbortedError("step failed") : OkStatus();
}

Status TwoSteps(bool fail_first, bool fail_second, int* calls) {
  SFT_RETURN_IF_ERROR(Step(fail_first, calls));
  SFT_RETURN_IF_ERROR(Step(fail_second, calls));
  return OkStatus();
}

TEST(MacroTest, ReturnIfError) {
  int calls = 0;
  EXPECT_TRUE(TwoSteps(false, false, &calls).ok());
  EXPECT_EQ(calls, 2);

  calls = 0;
  Status s = TwoSteps(true, false, &calls);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(s.message(), "step failed");
  EXPECT_EQ(calls, 1);  // stopped after the first failure

  calls = 0;
  EXPECT_EQ(TwoSteps(false, true, &calls).code(), StatusCode::kAborted);
  EXPECT_EQ(calls, 2);
}

StatusOr<int> Parse(const std::string& s, int* calls) {
  ++*calls;
  if (s.empty()) return InvalidArgumentError("empty");
  return static_cast<int>(s.size());
}

StatusOr<int> SumOfTwo(const std::string& a, const std::string& b, int* calls) {
  SFT_ASSIGN_OR_RETURN(int x, Parse(a, calls));
  SFT_ASSIGN_OR_RETURN(const int y, Parse(b, calls));  // two uses in one scope
  return x + y;
}

StatusOr<std::unique_ptr<int>> MakeBox(int v) {
  if (v < 0) return OutOfRangeError("negative");
  return std::make_unique<int>(v);
}

Status AssignExisting(int v, std::unique_ptr<int>* out) {
  SFT_ASSIGN_OR_RETURN(*out, MakeBox(v));  // assigns to an existing lvalue, moves the value
  return OkStatus();
}

TEST(MacroTest, AssignOrReturn) {
  int calls = 0;
  StatusOr<int> sum = SumOfTwo("ab", "cde", &calls);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(*sum, 5);
  EXPECT_EQ(calls, 2);  // each expression evaluated once

  calls = 0;
  sum = SumOfTwo("", "cde", &calls);
  EXPECT_EQ(sum.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sum.status().message(), "empty");
  EXPECT_EQ(calls, 1);

  std::unique_ptr<int> box;
  EXPECT_TRUE(AssignExisting(3, &box).ok());
  ASSERT_NE(box, nullptr);
  EXPECT_EQ(*box, 3);
  Status s = AssignExisting(-1, &box);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(s.ToString(), HasSubstr("OUT_OF_RANGE: negative"));
  EXPECT_EQ(*box, 3);  // untouched on error
}

TEST(StatusTest, FieldErrorNamesTheFileAndTheField) {
  Status s = FieldError("run/config.json", "rope_scaling.factor", "must be a number, got \"x\"");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "run/config.json: field 'rope_scaling.factor': must be a number, got \"x\"");
  EXPECT_EQ(FieldError("", "lr", "must be > 0").message(), "field 'lr': must be > 0");
}

}  // namespace
}  // namespace sftctl
