#include "common/tokenizer/bpe_decoder.h"

#include <utility>

#include "common/tokenizer/bpe_byte_fallback.h"
#include "common/tokenizer/unicode_normalize.h"

namespace sftctl {
namespace bpe_internal {
namespace {

std::string ReplaceAll(std::string_view text, const std::string& pattern, const std::string& content) {
  std::string out;
  size_t last = 0;
  for (size_t pos = text.find(pattern); pos != std::string_view::npos; pos = text.find(pattern, last)) {
    out.append(text.substr(last, pos - last));
    out.append(content);
    last = pos + pattern.size();
  }
  out.append(text.substr(last));
  return out;
}

// Runs of byte-fallback tokens become one token each: their bytes as text.
std::vector<std::string> ByteFallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string bytes;
  auto flush = [&] {
    if (bytes.empty()) return;
    out.push_back(IsValidUtf8(bytes) ? bytes : ToValidUtf8(bytes));
    bytes.clear();
  };
  for (std::string& token : tokens) {
    unsigned char b;
    if (ParseByteFallbackToken(token, &b)) {
      bytes.push_back(static_cast<char>(b));
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  return out;
}

// Strips up to `start` leading and `stop` trailing copies of `c` (one character) off `token`.
void Strip(std::string* token, const std::string& c, size_t start, size_t stop) {
  size_t begin = 0;
  for (size_t i = 0; i < start && token->compare(begin, c.size(), c) == 0; ++i) begin += c.size();
  size_t end = token->size();
  for (size_t i = 0; i < stop && end >= begin + c.size() && token->compare(end - c.size(), c.size(), c) == 0;
       ++i) {
    end -= c.size();
  }
  *token = token->substr(begin, end - begin);
}

}  // namespace

std::string RunDecoders(std::vector<std::string> tokens, const std::vector<DecoderStep>& steps) {
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) {
          if (t.find(step.pattern) != std::string::npos) t = ReplaceAll(t, step.pattern, step.content);
        }
        break;
      case DecoderStep::Kind::kByteFallback:
        tokens = ByteFallback(std::move(tokens));
        break;
      case DecoderStep::Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& t : tokens) Strip(&t, step.content, step.start, step.stop);
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string DecodeTokenBytes(std::string_view token, const std::vector<DecoderStep>& steps) {
  std::string t(token);
  for (const DecoderStep& step : steps) {
    unsigned char b;
    if (step.kind == DecoderStep::Kind::kReplace && t.find(step.pattern) != std::string::npos) {
      t = ReplaceAll(t, step.pattern, step.content);
    } else if (step.kind == DecoderStep::Kind::kByteFallback && ParseByteFallbackToken(t, &b)) {
      t.assign(1, static_cast<char>(b));
    }
  }
  return t;
}

}  // namespace bpe_internal
}  // namespace sftctl
