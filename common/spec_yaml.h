// Loading a JobSpec from a YAML file (the form users write).
//
// yaml-cpp is used only here, by the client and the agent: the trainer receives canonical
// JSON, so it never links yaml-cpp (GPU hosts build it against a different LibTorch ABI).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/spec.h"

namespace sftctl {

// A YAML document converted to JSON, with the source line of every field path.
struct YamlDocument {
  nlohmann::json value;
  std::map<std::string, int> lines;  // "train.lr" -> 1-based line
};

// Converts YAML text to JSON. Plain scalars become null/bool/int/float when they look like
// one (YAML 1.2 core schema); quoted scalars stay strings. Errors name `file_name` and line.
StatusOr<YamlDocument> YamlToJson(const std::string& text, const std::string& file_name);

// Reads, converts and validates a YAML job spec. Relative paths resolve against the spec's
// folder; the default name is the file's stem. Errors read "<file>:<line>: field '<path>': ...".
StatusOr<JobSpec> LoadSpecFile(const std::string& path);

// Applies `--set FIELD=VALUE` overrides to the canonical JSON of a spec. FIELD is a dotted path:
// a field of the spec's table (common/spec_fields.h, e.g. "train.lr", "checkpoint.upload_to";
// setting a field of an absent lora or slurm section turns the section on), or a path that exists
// in `j` (e.g. "model.config.hidden_size"). VALUE is read as a YAML scalar or flow collection ("3",
// "1e-3", "true", "[a.jsonl, b.jsonl]"); a string field takes a plain scalar as written ("1" stays
// "1"). The caller re-validates the result with ParseSpec.
Status ApplySetOverrides(const std::vector<std::string>& sets, nlohmann::json* j);

}  // namespace sftctl
