// The job spec on the agent: parsed once, then typed. A job's spec arrives as the client's JSON text
// (SubmitJob) or comes back as the text stored by an earlier agent (recovery); either way it is
// parsed and validated here, once, into a JobSpec (common/spec/spec.h: every field checked, unknown
// fields refused, the trainer's own rules), which the job's record carries (JobRecord::spec).
// Everything after reads typed fields; the text kept beside it (JobRecord::spec_json, <job_dir>/spec.json,
// Job.spec_json) is CanonicalSpecJson of that JobSpec and is never parsed again by this agent.
//
// Blob references come in two forms (proto BlobRef):
//   * a file: dir_entry empty; the field is set to the blob's own path (blobs/<sha256>);
//   * a folder: several references with the same json_pointer and distinct dir_entry values ("config.json",
//     "sub/a.json"); they become one folder <job_dir>/inputs/<n>/ holding each blob under its dir_entry
//     (a hard link to the blob file, a symlink where hard links are impossible), and the field is set to
//     that folder. n counts the folders of the job in order of first appearance.
// The agent replaces "output_dir" with the job's run folder.
//
// Thread safety: plain functions; a SpecParseObserver is called on the caller's thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/spec_types.h"
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

// Told of each spec text ValidateSpec or ParseStoredSpec parses, as the parse starts, with the name its
// messages start with ("spec_json", "job-3 spec"): a caller held to one parse per job (the Supervisor:
// SupervisorConfig::spec_parsed) passes one to every parse it makes. Empty: nobody is told.
using SpecParseObserver = std::function<void(const std::string& where)>;

// SubmitJob's parse: `spec_json` (at most kMaxJsonDepth levels deep; common/json_parse.h) with the
// blob references applied, validated as a job spec (ParseSpec; relative paths are left as they
// are). Folder entries (dir_entry) must pass common/safe_path's CheckRelativePath. `blob_path(sha)`
// returns the local path of a complete blob or FAILED_PRECONDITION. File references are applied to
// the returned spec; folder references are validated (their field must be a string of the spec, see
// SpecStringAt) and appended to `folders` (their fields are set by MaterializeFolders). Never throws.
// Errors: INVALID_ARGUMENT naming the field ("spec_json: not a JSON object", "spec_json.output_dir: must
// be a string", "blobs[1].json_pointer: ...", "blobs[2].dir_entry: ...", "spec_json: field 'data':
// is required ..."), FAILED_PRECONDITION from blob_path. `parsed` is told of the parse.
StatusOr<JobSpec> ValidateSpec(const std::string& spec_json, const std::vector<SpecBlobRef>& refs,
                               const std::function<StatusOr<std::string>(const std::string&)>& blob_path,
                               std::vector<SpecFolder>* folders = nullptr,
                               const SpecParseObserver& parsed = {});

// Recovery's parse: a spec this agent stored (CanonicalSpecJson), validated again. `where` starts
// the messages ("job-3 spec"). Errors: INVALID_ARGUMENT naming the field. `parsed` is told of the parse.
StatusOr<std::shared_ptr<const JobSpec>> ParseStoredSpec(const std::string& spec_json,
                                                         const std::string& where,
                                                         const SpecParseObserver& parsed = {});

// The text kept and sent for `spec`: ToJson, indented by 2, invalid UTF-8 replaced.
std::string CanonicalSpecJson(const JobSpec& spec);

// The string of `spec` that `json_pointer` names in its canonical JSON (ToJson): a string field
// ("/model/path"), an existing entry of a list field ("/data/train/0"; "/data/train" itself when the
// list has one entry and may be written as one string), or a string inside model.config
// ("/model/config/x"); nullptr when it names none of these (another kind of field, an absent optional
// section, an index past the end, not a JSON pointer).
std::string* SpecStringAt(JobSpec* spec, const std::string& json_pointer);

// Creates <job_dir>/inputs/<n>/<dir_entry> for every folder (replacing what a previous attempt left
// there) and sets each folder's field in `spec` to <job_dir>/inputs/<n>. Errors: INTERNAL naming the
// path; INVALID_ARGUMENT for a field that is not a string of the spec (ValidateSpec checked it).
Status MaterializeFolders(const std::string& job_dir, const std::vector<SpecFolder>& folders, JobSpec* spec);

}  // namespace sftctl::agent
