// The hf:// references of a job spec (model.path, data.train[i], data.eval[i]) and their resolution
// into local paths in the Hugging Face cache (common/hub/hf_hub.h). Used by the agent before it starts a
// job's trainer and by `sftctl run --local`; the trainer itself never sees an hf:// path.
//
// Thread safety: plain functions; ResolveHubSpec uses the downloader given (one thread at a time).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/hub/hf_hub.h"
#include "common/status.h"

namespace sftctl {

struct HubSpecField {
  std::string json_pointer;  // "/model/path", "/data/train/0", ...
  std::string field;         // "model.path", "data.train", ... for messages
  std::string value;         // the hf:// reference
};

// The spec's fields that hold hf:// references, in spec order. `spec` may be any JSON (a spec the
// agent has not parsed): fields of other shapes are ignored.
std::vector<HubSpecField> HubSpecFields(const nlohmann::json& spec);

// The files a tokenizer needs from a model repository (tokenizer.json, tokenizer_config.json, the
// vocabulary and merges, special tokens, chat template) and its config.json: what `tokenizer:
// hf://...` downloads, and what a tokenizer-only resolution takes of `model.path`.
const std::vector<std::string>& HubTokenizerPatterns();

// Downloads every hf:// reference of `spec` and replaces it with the local path (model.path and
// tokenizer: the snapshot folder, or its PATH beneath it; data files: the file in the snapshot). A
// data reference must name a file. `tokenizer_only`: model.path takes only HubTokenizerPatterns()
// (`inspect-data`, which needs no weights). Errors: the downloader's, prefixed with the field
// ("model.path: hf://...: ...").
Status ResolveHubSpec(nlohmann::json* spec, HubDownloader* downloader, bool tokenizer_only = false);

}  // namespace sftctl
