#include "common/object_store/s3_xml.h"

#include <cstdlib>

#include "common/markup_escape.h"

namespace sftctl {

namespace {

void AppendUtf8(unsigned long cp, std::string* out) {
  if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

std::vector<std::string_view> XmlElements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = "<" + std::string(tag), close = "</" + std::string(tag) + ">";
  for (size_t pos = 0;;) {
    size_t at = xml.find(open, pos);
    if (at == std::string_view::npos) break;
    const size_t after = at + open.size();
    if (after >= xml.size()) break;
    const char c = xml[after];
    if (c != '>' && c != ' ' && c != '/') {  // <tagX...>: another element
      pos = after;
      continue;
    }
    const size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {  // <tag/>
      out.emplace_back();
      pos = gt + 1;
      continue;
    }
    const size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::string XmlText(std::string_view xml, std::string_view tag) {
  const auto all = XmlElements(xml, tag);
  if (all.empty()) return std::string();
  std::string_view text = all.front();
  const std::string_view open = "<![CDATA[", close = "]]>";
  if (text.substr(0, open.size()) == open && text.size() >= open.size() + close.size() &&
      text.substr(text.size() - close.size()) == close)
    return std::string(text.substr(open.size(), text.size() - open.size() - close.size()));
  return XmlUnescape(text);
}

std::string XmlUnescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const size_t semi = s[i] == '&' ? s.find(';', i) : std::string_view::npos;
    if (semi == std::string_view::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    const std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out += '&';
    else if (ent == "lt")
      out += '<';
    else if (ent == "gt")
      out += '>';
    else if (ent == "quot")
      out += '"';
    else if (ent == "apos")
      out += '\'';
    else if (ent.size() > 1 && ent[0] == '#') {
      const bool hex = ent[1] == 'x' || ent[1] == 'X';
      const std::string digits(ent.substr(hex ? 2 : 1));
      char* end = nullptr;
      const unsigned long cp = std::strtoul(digits.c_str(), &end, hex ? 16 : 10);
      if (digits.empty() || *end != '\0') {
        out += s[i];
        continue;
      }
      AppendUtf8(cp, &out);
    } else {
      out += s[i];
      continue;
    }
    i = semi;
  }
  return out;
}

std::string XmlEscape(std::string_view s) { return EscapeMarkup(s, MarkupQuotes::kNamed); }

}  // namespace sftctl
