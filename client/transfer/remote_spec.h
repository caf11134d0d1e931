// Loading a job spec for a remote submission and finding the local files it references.
//
// The spec is loaded exactly like `run --local` does (YAML or JSON, defaults, paths resolved against
// the spec's folder, --set overrides re-validated, errors with file:line). The files it references on
// this machine travel as blobs: data.train / data.eval files (must exist), data.chat_template when it
// is a file, and model.path / tokenizer / resume when they are local folders (one blob per file; dot
// files and dot folders such as .git and .cache are skipped; symlinks are followed). A model.path that
// is not a folder here is kept as a path on the host; hf:// paths (model.path, data.train, data.eval)
// are checked and kept: the agent downloads them from the Hugging Face Hub. output_dir is ignored (the
// agent owns the job folder).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/spec/spec.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::client {

// One local file a spec field refers to.
struct SpecFile {
  std::string json_pointer;  // into the canonical spec JSON, e.g. "/data/train/0", "/model/path"
  std::string local_path;    // absolute path on this machine
  std::string dir_entry;     // for a folder: the file's path relative to it; empty for a single file
  uint64_t size = 0;
  std::string sha256;  // filled by HashSpecFiles
};

struct RemoteSpec {
  JobSpec spec;
  nlohmann::json json;             // canonical JSON to submit (ToJson(spec))
  std::vector<SpecFile> files;     // every local file to upload, in spec order
  std::vector<std::string> hosts;  // the spec's `hosts` (multi-node), empty when absent
  std::vector<std::string> notes;  // things the user should know (e.g. a model.path kept as a host path)
};

// Loads `path` with `overrides` (`--set` ones, a command's spec flags': LoadSpecFile(path, overrides),
// common/spec/spec_yaml.h) and collects the referenced local files. Errors: NOT_FOUND (the spec or a
// data file is missing, naming it), INVALID_ARGUMENT (spec errors with file:line, a bad override).
StatusOr<RemoteSpec> LoadRemoteSpec(const std::string& path, const std::vector<std::string>& overrides);

// Computes size and sha256 of every file (a file referenced twice is read once).
Status HashSpecFiles(std::vector<SpecFile>* files);

// The part of a SubmitJobRequest that describes the spec: its canonical JSON, a blob reference per
// local file (at its JSON pointer) and its name. Every submission (`submit`, the bootstrap smoke job)
// starts from this one; what a caller adds (ranks, restarts, forwarded tokens) is its own.
// REQUIRES: HashSpecFiles(&spec.files) has run.
::sftctl::v1::SubmitJobRequest SpecSubmitRequest(const RemoteSpec& spec);

}  // namespace sftctl::client
