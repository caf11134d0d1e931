// StatusIs(code, message): a GoogleMock matcher for a Status or a StatusOr<T> whose code is `code`
// and whose message matches `message` (a string matches exactly; use HasSubstr for part of it).
//
//   EXPECT_THAT(Reader::Open(path), StatusIs(StatusCode::kDataLoss, HasSubstr("out of range")));
//
// RpcStatusIs(code, message): the same for a grpc::Status (any value with error_code() and
// error_message()), with `code` a grpc::StatusCode. This header does not include gRPC: the matcher
// is a template, instantiated only where a test passes it a grpc::Status.
//
//   EXPECT_THAT(stub->CancelJob(...), RpcStatusIs(grpc::StatusCode::NOT_FOUND, HasSubstr("job-9")));
//
// Both are pure functions of their argument: safe to use from any thread.
#pragma once

#include <gmock/gmock.h>

#include <ostream>
#include <string>

#include "common/status.h"

namespace sftctl {
// How GoogleTest prints them in failure messages (found by argument-dependent lookup).
inline void PrintTo(StatusCode code, std::ostream* os) { *os << StatusCodeName(code); }
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
template <typename T>
void PrintTo(const StatusOr<T>& s, std::ostream* os) {
  *os << (s.ok() ? std::string("OK (a value)") : s.status().ToString());
}
}  // namespace sftctl

namespace sftctl::testing {

inline Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const StatusOr<T>& s) {
  return s.status();
}

MATCHER_P2(StatusIs, code, message, "") {
  const Status s = StatusOf(arg);
  return s.code() == code && ::testing::ExplainMatchResult(message, s.message(), result_listener);
}

// Codes print as numbers (FAILED_PRECONDITION is 9): naming them would need StatusCodeName, which
// would make every test that checks a gRPC status link sftctl_common.
MATCHER_P2(RpcStatusIs, code, message,
           std::string(negation ? "isn't" : "is") + " a gRPC status of code " +
               std::to_string(static_cast<int>(code)) + " whose message " +
               ::testing::DescribeMatcher<std::string>(message)) {
  *result_listener << "whose code is " << static_cast<int>(arg.error_code()) << " and message \""
                   << arg.error_message() << "\"";
  return arg.error_code() == code && ::testing::Matches(message)(arg.error_message());
}

}  // namespace sftctl::testing
