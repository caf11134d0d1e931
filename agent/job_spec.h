// Job spec validation and rewriting (SubmitJob). The spec is the client's resolved training config as a
// JSON object; the agent treats its structure as opaque except for "output_dir" (replaced by the job's
// run folder) and the fields named by blob references (replaced by blob paths on this host).
//
// Blob references come in two forms (proto BlobRef):
//   * a file: dir_entry empty; the field is set to the blob's own path (blobs/<sha256>);
//   * a folder: several references with the same json_pointer and distinct dir_entry values ("config.json",
//     "sub/a.json"); they become one folder <job_dir>/inputs/<n>/ holding each blob under its dir_entry
//     (a hard link to the blob file, a symlink where hard links are impossible), and the field is set to
//     that folder. n counts the folders of the job in order of first appearance.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace sftctl::agent {

struct SpecBlobRef {
  std::string json_pointer;
  std::string sha256;
  std::string dir_entry;  // empty: a single file
};

// A folder to assemble from blobs (see MaterializeFolders).
struct SpecFolder {
  std::string json_pointer;
  std::vector<std::pair<std::string, std::string>> entries;  // {dir_entry, blob path}
};

// Parses `spec_json` (at most kMaxJsonDepth levels deep; common/json_parse.h) and applies the blob
// references. Folder entries (dir_entry) must pass common/safe_path's CheckRelativePath. `blob_path(sha)`
// returns the local path of a complete blob or FAILED_PRECONDITION. File references are applied to the
// returned spec; folder references are validated and appended to `folders` (their fields are set by
// MaterializeFolders). Never throws. Errors: INVALID_ARGUMENT naming the field ("spec_json: not a JSON
// object", "spec_json.output_dir: must be a string", "blobs[1].json_pointer: ...", "blobs[2].dir_entry:
// ..."), FAILED_PRECONDITION from blob_path.
StatusOr<nlohmann::json> ValidateSpec(
    const std::string& spec_json, const std::vector<SpecBlobRef>& refs,
    const std::function<StatusOr<std::string>(const std::string&)>& blob_path,
    std::vector<SpecFolder>* folders = nullptr);

// Creates <job_dir>/inputs/<n>/<dir_entry> for every folder (replacing what a previous attempt left
// there) and sets each folder's field in `spec` to <job_dir>/inputs/<n>. Errors: INTERNAL naming the path.
Status MaterializeFolders(const std::string& job_dir, const std::vector<SpecFolder>& folders,
                          nlohmann::json* spec);

// Sets "output_dir" to `run_dir`.
void SetOutputDir(nlohmann::json* spec, const std::string& run_dir);

}  // namespace sftctl::agent
