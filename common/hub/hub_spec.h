// The hf:// references of a job spec (the fields its table marks: SpecField::hub in
// common/spec/spec_fields.h, listed by HubPaths in common/spec/spec_paths.h) and their resolution into local
// paths in the Hugging Face cache (common/hub/hf_hub.h). Used by the agent before it starts a job's
// trainer and by `sftctl run --local`; the trainer itself never sees an hf:// path.
//
// Thread safety: plain functions; ResolveHubSpec uses the downloader given (one thread at a time).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/hub/hf_hub.h"
#include "common/spec/spec_paths.h"
#include "common/status.h"

namespace sftctl {

// The files a tokenizer needs from a model repository (tokenizer.json, tokenizer_config.json, the
// vocabulary and merges, special tokens, chat template) and its config.json: what `tokenizer:
// hf://...` downloads, and what a tokenizer-only resolution takes of `model.path`.
const std::vector<std::string>& HubTokenizerPatterns();

// Downloads every hf:// path of `spec` (HubPaths) and replaces it with the local path (a model or
// tokenizer field: the snapshot folder, or its PATH beneath it; a data file: the file in the
// snapshot). A data reference must name a file. A tokenizer field takes only HubTokenizerPatterns();
// so does model.path when `tokenizer_only` (`inspect-data`, which needs no weights). Errors: the
// downloader's, prefixed with the field ("field 'model.path': ..."); `spec` may then hold some local
// paths already.
Status ResolveHubSpec(JobSpec* spec, HubDownloader* downloader, bool tokenizer_only = false);

}  // namespace sftctl
