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

TEST(TerminalText, EscapesEveryC1AndBidiControlButKeepsTheirNeighbours) {
  // The C1 range's ends, and the first code point after it (NO-BREAK SPACE) kept.
  EXPECT_EQ(EscapeForTerminal("\xc2\x80|\xc2\x9f|\xc2\xa0"), "\\u0080|\\u009f|\xc2\xa0");
  EXPECT_EQ(EscapeForTerminal("\xc2\x9d"
                              "8;;http://x\xc2\x9c"),
            "\\u009d8;;http://x\\u009c");  // 8-bit OSC and ST
  struct Case {
    const char* utf8;
    const char* escaped;
  } bidi[] = {
      {"\xe2\x80\xaa", "\\u202a"},  // LRE
      {"\xe2\x80\xab", "\\u202b"},  // RLE
      {"\xe2\x80\xac", "\\u202c"},  // PDF
      {"\xe2\x80\xad", "\\u202d"},  // LRO
      {"\xe2\x81\xa7", "\\u2067"},  // RLI
      {"\xe2\x81\xa8", "\\u2068"},  // FSI
      {"\xe2\x81\xa9", "\\u2069"},  // PDI
      {"\xe2\x80\x8e", "\\u200e"},  // LRM
      {"\xe2\x80\x8f", "\\u200f"},  // RLM
      {"\xd8\x9c", "\\u061c"},      // ARABIC LETTER MARK
  };
  for (const Case& c : bidi) {
    EXPECT_EQ(EscapeForTerminal(std::string("a") + c.utf8 + "b"), std::string("a") + c.escaped + "b");
    EXPECT_TRUE(HoldsC1OrBidiControl(std::string("a") + c.utf8 + "b")) << c.escaped;
  }
  // Neighbours that are text: ZERO WIDTH JOINER, U+2029, U+206A, Arabic letters, U+061B.
  for (const char* text : {"\xe2\x80\x8d", "\xe2\x80\xa9", "\xe2\x81\xaa", "\xd8\xb9\xd8\xb1", "\xd8\x9b"}) {
    EXPECT_EQ(EscapeForTerminal(text), text);
    EXPECT_FALSE(HoldsC1OrBidiControl(text));
  }
}

TEST(TerminalText, HoldsC1OrBidiControlLooksOnlyAtWellFormedUtf8) {
  EXPECT_FALSE(HoldsC1OrBidiControl(""));
  EXPECT_FALSE(HoldsC1OrBidiControl("checkpoint-000004/model.safetensors"));
  EXPECT_FALSE(HoldsC1OrBidiControl("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(HoldsC1OrBidiControl("a\x1b[2J\x7f"));  // C0 and DEL: not what it reports
  EXPECT_FALSE(HoldsC1OrBidiControl("\x9b\xae"));      // stray bytes, not the code points
  EXPECT_TRUE(HoldsC1OrBidiControl("\xc2\x9b"));
  EXPECT_TRUE(HoldsC1OrBidiControl("\xff\xe2\x80\xae"));      // after an invalid byte
  EXPECT_TRUE(HoldsC1OrBidiControl("\xe4\xb8\xad\xd8\x9c"));  // after a multi-byte character
}

}  // namespace
}  // namespace sftctl
