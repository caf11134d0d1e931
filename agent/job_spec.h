// Job spec validation and rewriting (SubmitJob). The spec is the client's resolved training config as a
// JSON object; the agent treats its structure as opaque except for "output_dir" (replaced by the job's
// run folder) and the fields named by blob references (replaced by blob paths on this host).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::agent {

struct SpecBlobRef {
  std::string json_pointer;
  std::string sha256;
};

// Parses `spec_json` and applies the blob references. `blob_path(sha)` returns the local path of a
// complete blob or FAILED_PRECONDITION. Errors: INVALID_ARGUMENT naming the field
// ("spec_json: not a JSON object", "spec_json.output_dir: must be a string",
// "blobs[1].json_pointer: ..."), FAILED_PRECONDITION from blob_path.
StatusOr<nlohmann::json> ValidateSpec(
    const std::string& spec_json, const std::vector<SpecBlobRef>& refs,
    const std::function<StatusOr<std::string>(const std::string&)>& blob_path);

// Sets "output_dir" to `run_dir`.
void SetOutputDir(nlohmann::json* spec, const std::string& run_dir);

}  // namespace sftctl::agent
