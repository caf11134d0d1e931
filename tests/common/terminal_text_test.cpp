// EscapeForTerminal: what an agent sends never reaches the terminal as a control sequence.
#include "common/terminal_text.h"

#include <gtest/gtest.h>

namespace sftctl {
namespace {

TEST(TerminalText, KeepsPrintableTextNewlinesTabsAndCarriageReturns) {
  const std::string s = "step 10/100: loss 1.2345\tok\r progress 50%\n";
  EXPECT_EQ(EscapeForTerminal(s), s);
  const std::string utf8 = "caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80";  // café 中文 😀
  EXPECT_EQ(EscapeForTerminal(utf8), utf8);
}

TEST(TerminalText, EscapesCsiOscAndOtherC0Controls) {
  // Clear screen, set the window title, copy to the clipboard (OSC 52), bell, backspace, DEL.
  EXPECT_EQ(EscapeForTerminal("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(EscapeForTerminal("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
  EXPECT_EQ(EscapeForTerminal("\x1b]52;c;ZXZpbA==\x1b\\"), "\\x1b]52;c;ZXZpbA==\\x1b\\");
  EXPECT_EQ(EscapeForTerminal(std::string("x\0y\x08\x7f", 5)), "x\\x00y\\x08\\x7f");
}

TEST(TerminalText, EscapesC1ControlsBidiOverridesAndInvalidUtf8) {
  EXPECT_EQ(EscapeForTerminal("\xc2\x9b"
                              "2J"),
            "\\u009b2J");  // 8-bit CSI
  EXPECT_EQ(EscapeForTerminal("abc\xe2\x80\xae"
                              "def"),
            "abc\\u202edef");                                 // RLO
  EXPECT_EQ(EscapeForTerminal("\xe2\x81\xa6x"), "\\u2066x");  // LRI
  EXPECT_EQ(EscapeForTerminal("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(EscapeForTerminal("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(EscapeForTerminal("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
  EXPECT_EQ(EscapeForTerminal("\xe4\xb8"), "\\xe4\\xb8");           // truncated sequence
}

}  // namespace
}  // namespace sftctl
