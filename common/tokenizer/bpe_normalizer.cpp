#include "common/tokenizer/bpe_normalizer.h"

#include <utility>

namespace sftctl {
namespace bpe_internal {
namespace {

// Sets *next to `current` with every occurrence of `pattern` replaced; false when there is none.
bool ReplaceAll(std::string_view current, const std::string& pattern, const std::string& content,
                std::string* next) {
  size_t pos = current.find(pattern);
  if (pos == std::string_view::npos) return false;
  next->clear();
  next->reserve(current.size() + current.size() / 2);
  size_t last = 0;
  while (pos != std::string_view::npos) {
    next->append(current.substr(last, pos - last));
    next->append(content);
    last = pos + pattern.size();
    pos = current.find(pattern, last);
  }
  next->append(current.substr(last));
  return true;
}

// Applies one step to `current`: false when it leaves the text as it is, else the result in *next.
bool ApplyStep(const NormalizerStep& step, std::string_view current, std::string* next) {
  switch (step.kind) {
    case NormalizerStep::Kind::kUnicode:
      if (step.form == NormalizationForm::kNFC && IsNfcStable(current)) return false;
      *next = NormalizeUtf8(current, step.form);
      return true;
    case NormalizerStep::Kind::kReplace:
      return ReplaceAll(current, step.pattern, step.content, next);
    case NormalizerStep::Kind::kPrepend:
      if (current.empty() || step.content.empty()) return false;
      next->assign(step.content);
      next->append(current);
      return true;
  }
  return false;
}

}  // namespace

std::string_view Normalize(std::string_view text, const std::vector<NormalizerStep>& steps,
                           std::string* storage) {
  bool changed = false;
  std::string next;
  for (const NormalizerStep& step : steps) {
    std::string_view current = changed ? std::string_view(*storage) : text;
    if (!ApplyStep(step, current, &next)) continue;
    storage->swap(next);
    changed = true;
  }
  return changed ? std::string_view(*storage) : text;
}

}  // namespace bpe_internal
}  // namespace sftctl
