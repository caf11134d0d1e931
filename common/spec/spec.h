// JobSpec: everything a training job needs, parsed strictly from JSON or YAML.
//
// The user writes YAML (see docs/spec.md for every field and its default). The client
// converts it to JSON, resolves relative paths against the spec file's folder, validates it
// and hands the canonical JSON (ToJson) to the trainer, which parses it again with
// ParseSpec. Unknown or mistyped fields are errors that name the field (and the YAML line
// when a locator is given).
//
// The structs are in common/spec/spec_types.h. Parsing, ToJson, defaults in docs and `--set` are driven
// by the table of fields in common/spec/spec_fields.cpp: a new field is its member there plus its row.
//
// Thread safety: plain value types.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/spec/spec_types.h"
#include "common/status.h"

namespace sftctl {

// Maps a field path such as "train.lr" to a location such as "job.yaml:12" for messages.
using FieldLocator = std::function<std::string(const std::string& path)>;

// Parses and validates a spec from its JSON form. Relative paths are resolved against
// `base_dir` (empty: leave them as they are). Errors are INVALID_ARGUMENT and read
// "<location>: field '<path>': <problem>".
StatusOr<JobSpec> ParseSpec(const nlohmann::json& j, const std::string& base_dir = "",
                            const FieldLocator& locate = nullptr);

// The canonical JSON form: every field present, defaults filled in.
nlohmann::json ToJson(const JobSpec& spec);

// Checks what can be checked without reading data: files exist and are regular files.
Status CheckSpecFiles(const JobSpec& spec);

// The text of a run folder's spec.json: the canonical JSON with every relative local path (data
// files, model, tokenizer, chat template, output_dir, resume) made absolute against the working
// directory, which is what a relative path in `spec` means to the process holding it. The file
// then reads back to the same spec from any folder (ParseSpec with its folder, LoadSpecFile and
// `sftctl inspect-data RUN/spec.json` resolve a relative path against the file's own folder).
// `sftctl run` and the trainer both write spec.json through this. The paths are made absolute on a
// copy of `spec` (the table's path fields, the values they keep as written left alone): no parse.
// Errors: the working directory cannot be read.
StatusOr<std::string> RunSpecJson(const JobSpec& spec);

}  // namespace sftctl
