// Downloads from the Hugging Face Hub on this machine (common/hub/hf_hub.h): the hf:// paths of a spec
// for `sftctl run --local`, and `sftctl download REPO`. Options come from the environment
// (HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, HF_TOKEN or the token file); a live progress line goes to
// stderr when it is a terminal.
//
// Thread safety: one thread at a time.
#pragma once

#include <string>
#include <vector>

#include "common/hub/hf_hub.h"
#include "common/spec/spec.h"
#include "common/status.h"

namespace sftctl::client {

// Replaces every hf:// path of `spec` with its downloaded snapshot path (nothing to do: OK at once).
// `tokenizer_only`: of model.path only the tokenizer's files (`inspect-data`). Errors: those of
// ResolveHubSpec, naming the field and the reference.
Status ResolveHubPathsLocally(JobSpec* spec, bool tokenizer_only = false);

// Downloads `ref` (with `include` patterns, see HubDownloader::Download) into the local cache.
StatusOr<HubSnapshot> DownloadFromHub(const HubRef& ref, const std::vector<std::string>& include);

}  // namespace sftctl::client
