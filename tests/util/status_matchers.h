// StatusIs(code, message): a GoogleMock matcher for a Status or a StatusOr<T> whose code is `code`
// and whose message matches `message` (a string matches exactly; use HasSubstr for part of it).
//
//   EXPECT_THAT(Reader::Open(path), StatusIs(StatusCode::kDataLoss, HasSubstr("out of range")));
#pragma once

#include <gmock/gmock.h>

#include <ostream>

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

}  // namespace sftctl::testing
