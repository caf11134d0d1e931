// The hf:// scheme of Hugging Face Hub paths, in one place. model.path, tokenizer, data.train and
// data.eval (the fields the spec's table marks: SpecField::hub, listed by HubPaths in
// common/spec/spec_paths.h) may name files on the Hub, hf://[datasets/]ORG/NAME[@REVISION][/PATH]
// (common/hub/hf_hub.h). The spec keeps such paths as written (not resolved against the spec's folder,
// not checked by CheckSpecFiles): the agent, or `run --local`, downloads them before the trainer starts
// (common/hub/hub_spec.h). Header-only, so the trainer's spec code needs no Hub library. Thread-safe.
#pragma once

#include <string_view>

namespace sftctl {

inline constexpr std::string_view kHubScheme = "hf://";

// True when `s` starts with hf://.
inline bool IsHubPath(std::string_view s) { return s.substr(0, kHubScheme.size()) == kHubScheme; }

}  // namespace sftctl
