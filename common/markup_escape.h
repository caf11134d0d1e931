// The five characters markup gives a meaning (& < > " ') as entities: the one escape of S3's XML
// request bodies (common/object_store/s3_xml.h, XmlEscape) and of Jinja's `escape` filter
// (common/jinja/jinja_builtins.cpp, byte-identical to Python markupsafe). They differ only in how a
// quote is written, which MarkupQuotes names.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace sftctl {

enum class MarkupQuotes {
  kNamed,    // &quot; &apos; (XML)
  kNumeric,  // &#34; &#39; (HTML as markupsafe writes it)
};

// `s` with & < > " ' replaced by &amp; &lt; &gt; and the quotes' entities; every other byte kept.
std::string EscapeMarkup(std::string_view s, MarkupQuotes quotes);

// EscapeMarkup(s, quotes).size(), computed without building it (a caller with a size limit checks
// it first).
size_t EscapedMarkupSize(std::string_view s, MarkupQuotes quotes);

}  // namespace sftctl
