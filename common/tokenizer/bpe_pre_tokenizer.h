// Pre-tokenization for BPE: tokenizer.json's Split and ByteLevel pre-tokenizers cut
// text into words with a regex (PCRE2: UTF + UCP, JIT when available), and each word is then
// merged on its own (bpe_merges.h). The splitting is templated on the consumer of the words, and
// Regex::Find is inline, so that the encoder's hot loop inlines both. Included only by
// sftctl_common's own sources (which link PCRE2), never by a public header.
//
// Thread safety: a compiled Regex is immutable and Find may be called concurrently (match data
// and the JIT stack are per thread); the functions below keep no state.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/tokenizer/unicode_normalize.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

namespace sftctl {
namespace bpe_internal {

// Per-thread match data, match context and JIT stack, shared by every Regex.
struct MatchResources {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchResources();
  ~MatchResources();
};

inline MatchResources& ThreadMatchResources() {
  thread_local MatchResources resources;
  return resources;
}

class Regex {
 public:
  // Compiles `pattern` (matched as a literal string when `literal`). On failure returns null
  // and sets *error to "PCRE2 error at offset N: <message>".
  static std::unique_ptr<Regex> Compile(const std::string& pattern, bool literal, std::string* error);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match in subject[start..]; returns false when there is none.
  // REQUIRES: subject is valid UTF-8 and `start` is on a character boundary.
  // Inline: it runs once per word, and inlined into the split loop the per-thread lookup of
  // the match resources is hoisted out of the loop.
  bool Find(std::string_view subject, size_t start, size_t* match_start, size_t* match_end) const {
    MatchResources& res = ThreadMatchResources();
    auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    int rc;
    if (jit_) {
      rc = pcre2_jit_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, res.match_data, res.context);
    } else {
      rc = pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, res.match_data, res.context);
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // fall back to the interpreter (heap frames)
      rc = pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, res.match_data,
                       res.context);
    }
    if (rc < 0) return false;  // no match (or a resource limit: treat the rest as unmatched)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(res.match_data);
    *match_start = ovector[0];
    *match_end = ovector[1];
    return true;
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// GPT-2's pre-tokenization regex, used by ByteLevel(use_regex=true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer of the pipeline (a tokenizer.json Sequence is flattened into several).
struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::shared_ptr<Regex> regex;  // kSplit, or kByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  // kSplit: the regex matches the words and the text between matches is the delimiter (cl100k's
  // Split, with behavior Removed): the behavior applies to the non-matching pieces.
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
};

// Turns the pieces of a regex walk over `text` (non-match and match pieces, in text order) into
// the words a Split behavior emits, calling `emit` for each non-empty one.
template <typename Emit>
class SplitPieces {
 public:
  SplitPieces(std::string_view text, SplitBehavior behavior, Emit& emit)
      : text_(text), behavior_(behavior), emit_(emit) {}

  // Adds text[begin, end), a regex match when `is_match`; empty pieces are ignored.
  void Add(size_t begin, size_t end, bool is_match) {
    if (end <= begin) return;
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        emit_(text_.substr(begin, end - begin));
        return;
      case SplitBehavior::kRemoved:
        if (!is_match) emit_(text_.substr(begin, end - begin));
        return;
      case SplitBehavior::kMergedWithPrevious:
        // A match joins the preceding non-match piece.
        if (is_match && has_pending_ && !pending_is_match_ && pending_end_ == begin) {
          pending_end_ = end;
          pending_is_match_ = true;
          return;
        }
        Flush();
        break;
      case SplitBehavior::kMergedWithNext:
        // A non-match piece joins the preceding match.
        if (!is_match && has_pending_ && pending_is_match_ && pending_end_ == begin) {
          pending_end_ = end;
          pending_is_match_ = false;
          Flush();
          return;
        }
        Flush();
        break;
      case SplitBehavior::kContiguous:
        if (is_match && has_pending_ && pending_is_match_ && pending_end_ == begin) {
          pending_end_ = end;
          return;
        }
        Flush();
        break;
    }
    pending_begin_ = begin;
    pending_end_ = end;
    pending_is_match_ = is_match;
    has_pending_ = true;
    if (behavior_ == SplitBehavior::kMergedWithNext && !is_match) Flush();
  }

  // Emits the piece held back for a merging behavior, if any.
  void Flush() {
    if (has_pending_ && pending_end_ > pending_begin_)
      emit_(text_.substr(pending_begin_, pending_end_ - pending_begin_));
    has_pending_ = false;
  }

 private:
  std::string_view text_;
  SplitBehavior behavior_;
  Emit& emit_;
  // Pending piece for the merging behaviours.
  size_t pending_begin_ = 0, pending_end_ = 0;
  bool has_pending_ = false, pending_is_match_ = false;
};

// Splits `text` by `step` and calls `emit` for every non-empty piece, in order.
template <typename Emit>
void RunPreTokenizerStep(const PreTokenizerStep& step, std::string_view text, Emit&& emit) {
  std::string prefixed;
  if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    if (step.add_prefix_space && (text.empty() || text[0] != ' ')) {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    if (!step.regex) {
      if (!text.empty()) emit(text);
      return;
    }
  }
  // Walk the matches, producing (piece, is_match) in order.
  const Regex& regex = *step.regex;
  const SplitBehavior behavior =
      step.kind == PreTokenizerStep::Kind::kByteLevel ? SplitBehavior::kIsolated : step.behavior;
  const bool invert = step.kind == PreTokenizerStep::Kind::kSplit && step.invert;
  SplitPieces<std::remove_reference_t<Emit>> pieces(text, behavior, emit);
  size_t pos = 0, last = 0;
  while (pos <= text.size()) {
    size_t ms, me;
    if (!regex.Find(text, pos, &ms, &me)) break;
    pieces.Add(last, ms, invert);
    pieces.Add(ms, me, !invert);
    last = me;
    if (me > ms) {
      pos = me;
    } else {  // empty match: step over one character
      if (ms >= text.size()) break;
      size_t next = ms;
      NextCodePoint(text, &next);
      pos = next;
    }
  }
  pieces.Add(last, text.size(), invert);
  pieces.Flush();
}

// Runs steps[first..] on `text`: every piece of one step goes through the next, and `emit`
// gets the pieces of the last, in order (a recursive descent, without lists of pieces).
template <typename Emit>
void RunPreTokenizersFrom(const std::vector<PreTokenizerStep>& steps, size_t first, std::string_view text,
                          Emit& emit) {
  if (first == steps.size()) {
    emit(text);
    return;
  }
  RunPreTokenizerStep(steps[first], text,
                      [&](std::string_view piece) { RunPreTokenizersFrom(steps, first + 1, piece, emit); });
}

// Runs the whole pre-tokenizer pipeline on `text`, calling `emit` for every word, in order.
// Without steps, `text` itself is the one word.
template <typename Emit>
void RunPreTokenizers(const std::vector<PreTokenizerStep>& steps, std::string_view text, Emit&& emit) {
  if (steps.empty()) {
    emit(text);
  } else if (steps.size() == 1) {  // the common case (Qwen2/3, Llama-3, GPT-2)
    RunPreTokenizerStep(steps[0], text, emit);
  } else {
    RunPreTokenizersFrom(steps, 0, text, emit);
  }
}

}  // namespace bpe_internal
}  // namespace sftctl
