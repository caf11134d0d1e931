// The few XML shapes of S3 responses (errors, listings, multipart), read without a general XML
// parser: the text of elements by tag name, entities decoded. Bodies come from an untrusted server:
// nothing here throws or reads past the string.
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sftctl {

// The inner text of each <tag>...</tag> in `xml`, in order (nested elements left as text; a
// self-closing <tag/> gives ""). Entities (&amp; &lt; &gt; &quot; &apos; &#N; &#xN;) are decoded
// only by XmlText/XmlTexts, not by XmlElements.
std::vector<std::string_view> XmlElements(std::string_view xml, std::string_view tag);
// The decoded text of the first <tag> element (a whole <![CDATA[...]]> taken as is), "" when there is none.
std::string XmlText(std::string_view xml, std::string_view tag);
std::string XmlUnescape(std::string_view s);
// Escapes & < > " ' for element text (&quot; &apos;: common/markup_escape.h).
std::string XmlEscape(std::string_view s);

}  // namespace sftctl
