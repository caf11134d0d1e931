#include "common/tokenizer/bpe_normalizer.h"

#include <algorithm>
#include <numeric>
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

namespace {

// One Replace or Prepend step applied to `current` and its byte origins.
void ApplyStepWithOffsets(const NormalizerStep& step, std::string* current, std::vector<size_t>* origin) {
  std::string next;
  std::vector<size_t> next_origin;
  if (step.kind == NormalizerStep::Kind::kPrepend) {
    if (current->empty() || step.content.empty()) return;
    next_origin.assign(step.content.size(), origin->front());
    next_origin.insert(next_origin.end(), origin->begin(), origin->end() - 1);
    next = step.content + *current;
  } else {
    size_t last = 0;
    for (size_t pos = current->find(step.pattern); pos != std::string::npos;
         pos = current->find(step.pattern, last)) {
      next.append(*current, last, pos - last);
      next_origin.insert(next_origin.end(), origin->begin() + last, origin->begin() + pos);
      next.append(step.content);
      next_origin.insert(next_origin.end(), step.content.size(), (*origin)[pos]);
      last = pos + step.pattern.size();
    }
    if (last == 0 && next.empty()) return;  // no match
    next.append(*current, last, std::string::npos);
    next_origin.insert(next_origin.end(), origin->begin() + last, origin->end() - 1);
  }
  next_origin.push_back(origin->back());
  current->swap(next);
  origin->swap(next_origin);
}

}  // namespace

bool NormalizeWithOffsets(std::string_view text, const std::vector<NormalizerStep>& steps,
                          std::string* storage, std::string_view* normalized, std::vector<size_t>* origin) {
  storage->assign(text);
  origin->resize(text.size() + 1);
  std::iota(origin->begin(), origin->end(), size_t{0});
  bool exact = true;
  for (const NormalizerStep& step : steps) {
    if (step.kind != NormalizerStep::Kind::kUnicode) {
      ApplyStepWithOffsets(step, storage, origin);
      continue;
    }
    if (step.form == NormalizationForm::kNFC && IsNfcStable(*storage)) continue;
    std::string next = NormalizeUtf8(*storage, step.form);
    if (next == *storage) continue;
    exact = false;  // origins no longer known byte by byte: clamp them
    storage->swap(next);
    const size_t end = origin->back();
    origin->resize(storage->size() + 1);
    for (size_t i = 0; i < origin->size(); ++i) (*origin)[i] = std::min(i, end);
  }
  *normalized = *storage;
  return exact;
}

}  // namespace bpe_internal
}  // namespace sftctl
