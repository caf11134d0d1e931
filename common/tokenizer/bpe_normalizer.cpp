#include "common/tokenizer/bpe_normalizer.h"

#include <utility>

namespace sftctl {
namespace bpe_internal {

std::string_view Normalize(std::string_view text, const std::vector<NormalizerStep>& steps,
                           std::string* storage) {
  bool changed = false;
  for (const NormalizerStep& step : steps) {
    std::string_view current = changed ? std::string_view(*storage) : text;
    if (step.form == NormalizationForm::kNFC && IsNfcStable(current)) continue;
    std::string next = NormalizeUtf8(current, step.form);
    *storage = std::move(next);
    changed = true;
  }
  return changed ? std::string_view(*storage) : text;
}

}  // namespace bpe_internal
}  // namespace sftctl
