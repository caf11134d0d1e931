// client/transfer/progress.h: the live transfer line. Its label (a Hub file name, an agent's artifact path)
// comes from another machine: only the line's own "\r\x1b[K" reaches the terminal as a control.
#include "client/transfer/progress.h"

#include <gtest/gtest.h>

#include <string>

namespace sftctl::client {
namespace {

std::string DrawnLine(const std::string& label) {
  ::testing::internal::CaptureStderr();
  {
    Progress p(/*enabled=*/true, /*total=*/100);
    p.SetLabel(label);
  }
  return ::testing::internal::GetCapturedStderr();
}

TEST(Progress, EscapesControlsInTheLabel) {
  const std::string line = DrawnLine(
      "model\xc2\x9b"
      "2J\xe2\x80\xae"
      "x\x1b]0;t\x07\nnext\ttab.safetensors");
  EXPECT_EQ(line.rfind("\r\x1b[Kmodel\\u009b2J\\u202ex\\x1b]0;t\\x07\\x0anext\\x09tab.safetensors [", 0), 0u)
      << line;
  // The line's own erase codes are the only ESC; nothing else of the label is raw.
  size_t escs = 0;
  for (size_t at = line.find('\x1b'); at != std::string::npos; at = line.find('\x1b', at + 1)) {
    EXPECT_EQ(line.compare(at, 3, "\x1b[K"), 0) << line.substr(at);
    ++escs;
  }
  EXPECT_EQ(escs, 2u) << "drawn, then erased by Finish";
  for (const char* raw : {"\xc2\x9b", "\xe2\x80\xae", "\x07", "\n", "\t"})
    EXPECT_EQ(line.find(raw), std::string::npos) << line;
}

TEST(Progress, KeepsAPlainLabelAndDrawsNothingWhenDisabled) {
  EXPECT_EQ(DrawnLine("checkpoint-000004/model.safetensors")
                .rfind("\r\x1b[Kcheckpoint-000004/model.safetensors [", 0),
            0u);
  ::testing::internal::CaptureStderr();
  {
    Progress p(/*enabled=*/false, 100);
    p.SetLabel("x\x1b[2J");
    p.Add(10);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace sftctl::client
