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
#include <optional>
#include <string>
#include <vector>

#include "common/spec.h"
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

// Loads `path`, applies `sets` and `name` (when not empty) and collects the referenced local files.
// Errors: NOT_FOUND (the spec or a data file is missing, naming it), INVALID_ARGUMENT (spec errors
// with file:line, bad --set).
StatusOr<RemoteSpec> LoadRemoteSpec(const std::string& path, const std::vector<std::string>& sets,
                                    const std::string& name);

// `submit --slurm` and its flags (docs/slurm.md); a flag left unset keeps the spec's `slurm:` value.
struct SlurmFlags {
  bool slurm = false;
  std::optional<int64_t> nodes, gpus_per_node, cpu_ranks_per_node;
  std::optional<std::string> partition, account, qos, time, constraint;
  std::vector<std::string> extra_args;  // --slurm-arg: after the spec's extra_args
  bool no_requeue = false;
};

// Makes `spec` a Slurm job when the flags say so: its `slurm:` section (or the defaults) with the
// flags on top, in spec->spec and spec->json. A spec with a `slurm:` section is a Slurm job without
// --slurm too. The values are checked by the agent (agent/slurm/slurm_options.h). Errors:
// INVALID_ARGUMENT when a Slurm flag is given without --slurm and the spec has no `slurm:`.
Status ApplySlurmFlags(const SlurmFlags& flags, RemoteSpec* spec);

// Computes size and sha256 of every file (a file referenced twice is read once).
Status HashSpecFiles(std::vector<SpecFile>* files);

// The part of a SubmitJobRequest that describes the spec: its canonical JSON, a blob reference per
// local file (at its JSON pointer) and its name. Every submission (`submit`, the bootstrap smoke job)
// starts from this one; what a caller adds (ranks, restarts, forwarded tokens) is its own.
// REQUIRES: HashSpecFiles(&spec.files) has run.
::sftctl::v1::SubmitJobRequest SpecSubmitRequest(const RemoteSpec& spec);

}  // namespace sftctl::client
