// Loading a JobSpec from a YAML file (the form users write).
//
// yaml-cpp is used only here, by the client and the agent: the trainer receives canonical
// JSON, so it never links yaml-cpp (GPU hosts build it against a different LibTorch ABI).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/spec/spec.h"

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
// The file's text becomes a JobSpec here, in one ParseSpec; nothing after needs to parse it again.
StatusOr<JobSpec> LoadSpecFile(const std::string& path);

// LoadSpecFile with `overrides` (`--set` ones): the one way a command line changes a spec file (`run`
// and `submit` turn each of their spec flags into an override: client/commands/spec_flags.h). The
// overrides are applied (ApplySetOverrides) to the file's JSON, its relative paths first resolved
// against its folder (ResolveSpecPaths), before the one ParseSpec: a relative path an override gives
// stays relative to the working directory, and a problem in an overridden field (or inside an
// overridden section) is reported at "command line", the file's own at "<file>:<line>".
StatusOr<JobSpec> LoadSpecFile(const std::string& path, const std::vector<std::string>& overrides);

// `spec` (one made in code: the built-in demo) with `overrides` applied to its canonical JSON and
// validated with ParseSpec; a problem is reported at "command line". With no overrides, `spec` as it
// is: no round trip, no parse.
StatusOr<JobSpec> OverrideSpec(const JobSpec& spec, const std::vector<std::string>& overrides);

// Applies `--set FIELD=VALUE` overrides to the JSON of a spec (a file's, or the canonical one), in
// order (a later one wins). FIELD is a dotted path: a field of the spec's table (common/spec/spec_fields.h,
// e.g. "train.lr", "checkpoint.upload_to"; setting a field of an absent lora or slurm section turns the
// section on), or a path that exists in `j` (e.g. "model.config.hidden_size"). VALUE is read as a YAML scalar
// or flow collection ("3", "1e-3", "true", "[a.jsonl, b.jsonl]"); a string field takes a plain scalar as
// written ("1" stays "1"). `FIELD+=VALUE` adds instead of replacing: to a list field, VALUE's entries
// (one value, or a flow list) after the list's own (its default when the JSON leaves it out); to a
// section, VALUE's fields (a flow mapping) over the section's own, which turns an absent section on
// (`slurm+={}`). The caller validates the result with ParseSpec (LoadSpecFile and OverrideSpec do).
Status ApplySetOverrides(const std::vector<std::string>& sets, nlohmann::json* j);

// `value` as a YAML double-quoted scalar, for a --set VALUE that must stay exactly this string
// ("FIELD=" + YamlQuoted(v)): no character of it ('#', ": ", a leading '[', "null", "1e3") is read as
// YAML syntax or another type.
std::string YamlQuoted(std::string_view value);

}  // namespace sftctl
