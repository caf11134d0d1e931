#include "common/tokenizer/tokenizer.h"

namespace sftctl {
namespace {
constexpr std::string_view kEndText = "<|end|>";
constexpr std::string_view kPadText = "<|pad|>";
}  // namespace

std::vector<int32_t> Tokenizer::EncodeWithSpecialTokens(std::string_view text, bool parse_special) const {
  const SequenceSpecialTokens special = single_special_tokens();
  std::vector<int32_t> ids = special.prefix;
  const std::vector<int32_t> body = Encode(text, parse_special);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), special.suffix.begin(), special.suffix.end());
  return ids;
}

std::vector<int32_t> ByteTokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (parse_special && text[i] == '<') {
      if (text.substr(i, kEndText.size()) == kEndText) {
        ids.push_back(kEndId);
        i += kEndText.size();
        continue;
      }
      if (text.substr(i, kPadText.size()) == kPadText) {
        ids.push_back(kPadId);
        i += kPadText.size();
        continue;
      }
    }
    ids.push_back(static_cast<unsigned char>(text[i]));
    ++i;
  }
  return ids;
}

std::string ByteTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (!skip_special && id == kEndId) {
      out.append(kEndText);
    } else if (!skip_special && id == kPadId) {
      out.append(kPadText);
    }
  }
  return out;
}

std::optional<int32_t> ByteTokenizer::TokenToId(std::string_view token) const {
  if (token == kEndText) return kEndId;
  if (token == kPadText) return kPadId;
  if (token.size() == 1) return static_cast<unsigned char>(token[0]);
  return std::nullopt;
}

}  // namespace sftctl
