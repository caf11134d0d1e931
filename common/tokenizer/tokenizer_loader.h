// LoadTokenizer: the one entry point that turns a `tokenizer:` setting into a Tokenizer.
//
//   "byte"  -> the built-in ByteTokenizer (from-scratch models)
//   DIR     -> DIR/tokenizer.json (byte-level BPE) + optional DIR/tokenizer_config.json
//              (eos/pad/bos tokens, added_tokens_decoder, additional_special_tokens)
//
// Errors name the file and the JSON field, e.g.
//   "/m/tokenizer.json: model.type 'Unigram' is not supported (byte-level BPE only)";
// a folder without tokenizer.json that holds sftctl_tokenizer.json (a checkpoint of a model trained
// with the byte tokenizer) is NOT_FOUND saying to use "byte".
#pragma once

#include <memory>
#include <string>

#include "common/os/file_system.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"

namespace sftctl {

// `fs` defaults to FileSystem::Default().
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir_or_name, FileSystem* fs = nullptr);

}  // namespace sftctl
