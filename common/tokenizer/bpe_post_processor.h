// tokenizer.json's "post_processor": the special tokens transformers' `tokenizer(text)` puts around
// one sequence (add_special_tokens=True), as SequenceSpecialTokens (tokenizer.h):
//   TemplateProcessing  its "single" template: SpecialToken items (ids from "special_tokens")
//                       around the one Sequence item "A" ("pair" is checked, not used);
//   ByteLevel           offsets only: no ids;
//   Sequence            its "processors" in order, each wrapping the result of the ones before;
//   null or absent      nothing.
// Anything else (RobertaProcessing, BertProcessing, ...) is refused, naming tokenizer.json and the
// field ("post_processor.type").
//
// Thread safety: stateless.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace sftctl {
namespace bpe_internal {

// The token string of `id`, or nullopt when `id` is no token.
using TokenOfId = std::function<std::optional<std::string>(int64_t id)>;

// Reads root["post_processor"]; `label` names tokenizer.json in errors.
StatusOr<SequenceSpecialTokens> ParsePostProcessor(const nlohmann::json& root, const std::string& label,
                                                   const TokenOfId& token_of);

}  // namespace bpe_internal
}  // namespace sftctl
