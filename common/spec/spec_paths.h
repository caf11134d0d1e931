// A job spec's path fields (SpecField::is_path in common/spec/spec_fields.h), read and rewritten on the
// type, so that no process turns a JobSpec back into JSON to ask about its paths: the hf:// paths a
// spec holds (in the fields the table marks with SpecField::hub), and a spec file's relative paths
// resolved in its JSON before `--set` overrides go in (common/spec/spec_yaml.h LoadSpecFile).
//
// Thread safety: plain functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/spec/spec_fields.h"
#include "common/spec/spec_types.h"
#include "common/status.h"

namespace sftctl {

// One hf:// path of a spec (common/spec/hub_path.h), in a field the table marks as able to hold one
// (SpecField::hub: model.path, tokenizer, data.train, data.eval).
struct SpecHubPath {
  std::string field;              // "model.path", "data.train": for messages
  std::string json_pointer;       // where ToJson writes it: "/model/path", "/data/train/0"
  std::string value;              // the hf:// reference as written
  SpecHub what = SpecHub::kNone;  // what it names: a model, a tokenizer, a file
};

// Every hf:// path of `spec`, in the table's order (tokenizer, model.path, data.train, data.eval).
// Empty: the spec has none, and nothing needs the Hub before its trainer starts.
std::vector<SpecHubPath> HubPaths(const JobSpec& spec);

// Puts `local` where `path` (one of HubPaths(*spec)) was. Errors: INTERNAL when `spec` holds no hf://
// path at path.json_pointer any more.
Status ReplaceHubPath(JobSpec* spec, const SpecHubPath& path, const std::string& local);

// `j`, a spec's JSON as read from a file in `base_dir`, with what ParseSpec(j, base_dir) resolves
// against `base_dir` resolved in place: each relative path of a path field (values the field keeps as
// written, hf:// paths and values of another type are left alone), and output_dir's default
// (`runs/<name>`) written out. ParseSpec(j, "") then reads the spec ParseSpec(j, base_dir) reads, and a
// value put in afterwards (a `--set` override) keeps its own meaning: a relative path stays relative to
// the working directory. Not an object, or `base_dir` empty: nothing changes.
void ResolveSpecPaths(nlohmann::json* j, const std::string& base_dir);

}  // namespace sftctl
