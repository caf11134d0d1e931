#include "common/markup_escape.h"

#include <gtest/gtest.h>

#include <string>

namespace sftctl {
namespace {

TEST(MarkupEscapeTest, NamedQuotesForXml) {
  EXPECT_EQ(EscapeMarkup("<a&'\">", MarkupQuotes::kNamed), "&lt;a&amp;&apos;&quot;&gt;");
}

TEST(MarkupEscapeTest, NumericQuotesAsMarkupsafeWritesThem) {
  EXPECT_EQ(EscapeMarkup("<a&'\">", MarkupQuotes::kNumeric), "&lt;a&amp;&#39;&#34;&gt;");
}

TEST(MarkupEscapeTest, OtherBytesStayAsTheyAre) {
  const std::string bytes = std::string("plain ") + "\xc3\xa9" + std::string(1, '\0') + "\n;#";
  EXPECT_EQ(EscapeMarkup(bytes, MarkupQuotes::kNamed), bytes);
  EXPECT_EQ(EscapeMarkup("", MarkupQuotes::kNumeric), "");
  EXPECT_EQ(EscapeMarkup("&amp;", MarkupQuotes::kNamed), "&amp;amp;");  // escapes, never decodes
}

TEST(MarkupEscapeTest, SizeIsTheEscapedSize) {
  for (const char* s : {"", "abc", "<a&'\">", "''''", "&&<>x"}) {
    for (MarkupQuotes q : {MarkupQuotes::kNamed, MarkupQuotes::kNumeric})
      EXPECT_EQ(EscapedMarkupSize(s, q), EscapeMarkup(s, q).size()) << s;
  }
}

}  // namespace
}  // namespace sftctl
