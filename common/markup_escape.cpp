#include "common/markup_escape.h"

namespace sftctl {
namespace {

// The entity of `c`, or an empty view when `c` stands for itself.
std::string_view EntityOf(char c, MarkupQuotes quotes) {
  switch (c) {
    case '&':
      return "&amp;";
    case '<':
      return "&lt;";
    case '>':
      return "&gt;";
    case '"':
      return quotes == MarkupQuotes::kNamed ? "&quot;" : "&#34;";
    case '\'':
      return quotes == MarkupQuotes::kNamed ? "&apos;" : "&#39;";
    default:
      return {};
  }
}

}  // namespace

std::string EscapeMarkup(std::string_view s, MarkupQuotes quotes) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const std::string_view entity = EntityOf(c, quotes);
    if (entity.empty()) {
      out += c;
    } else {
      out += entity;
    }
  }
  return out;
}

size_t EscapedMarkupSize(std::string_view s, MarkupQuotes quotes) {
  size_t size = 0;
  for (char c : s) {
    const size_t n = EntityOf(c, quotes).size();
    size += n == 0 ? 1 : n;
  }
  return size;
}

}  // namespace sftctl
