// The job spec's fields, defined once: a table of every field of JobSpec (common/spec/spec.h) with its
// kind, limits, how it is written to canonical JSON and its documentation. ParseSpec (JSON, and
// YAML through it), ToJson, the `--set` paths (common/spec/spec_yaml.h) and the field list of
// docs/spec.md (generated from it; tests/common/spec_fields_test.cpp holds the doc to it) all read
// this table. A new field is one row here plus its member in common/spec/spec.h.
//
// Thread safety: the table is built once (a function-local static) and read-only afterwards.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "common/spec/spec_types.h"

namespace sftctl {

enum class SpecKind {
  kInt,      // an integer (a float that is a whole number counts)
  kNumber,   // a double
  kBool,     // true or false
  kString,   // a string, optionally one of `choices`, optionally a path
  kList,     // a list of strings (optionally one string: a list of one)
  kJson,     // a mapping kept as it is (model.config)
  kSection,  // a mapping of the fields in `fields`
};

// Where a leaf field's value lives in a JobSpec whose sections exist.
using SpecValue =
    std::variant<int64_t*, double*, bool*, std::string*, std::vector<std::string>*, nlohmann::json*>;

// What an hf:// path (common/spec/hub_path.h) in a field names, so that one downloader
// (common/hub/hub_spec.h) knows what to fetch: a whole model repository (model.path), only a
// tokenizer's files (tokenizer), or one file (data.train, data.eval).
enum class SpecHub { kNone, kModel, kTokenizer, kFile };

// When ToJson writes a field (or a section): always, or only when it differs from its default
// (a section: only when something in it is written). The second is for knobs added after the
// first release, so that an older trainer still takes a spec that does not use them.
enum class SpecEmit { kAlways, kUnlessDefault };

struct SpecField {
  std::string name;  // the key in its section ("lr")
  SpecKind kind = SpecKind::kString;
  SpecValue (*value)(JobSpec&) = nullptr;  // leaf fields: the member it parses into
  SpecEmit emit = SpecEmit::kAlways;
  // Given but empty (a section or field that is absent, a list with no entry): this problem.
  std::string required;

  // kInt: >= int_min. kNumber: in [min, max], and > min when above_min.
  int64_t int_min = 0;
  double min = 0, max = 0;
  bool above_min = false;

  // kString: one of `choices` when not empty; `check` returns "" or the problem; non_empty
  // refuses "". kList: `choices` are the allowed entries.
  std::vector<std::string> choices;
  std::string (*check)(const std::string& value) = nullptr;
  bool non_empty = false;
  // kString, kList: a path, resolved against the spec's folder, except the values in `keep` (an
  // entry ending in "://" keeps every value with that prefix) and hf:// paths.
  bool is_path = false;
  std::vector<std::string> keep;
  // kString, kList path fields: what an hf:// value in it is (common/spec/spec_paths.h HubPaths); kNone: the
  // field never holds one.
  SpecHub hub = SpecHub::kNone;

  // kList. `item`/`items` name an entry in messages ("file name"/"file names").
  std::string item, items;
  bool one_string_ok = false;  // "a.jsonl" reads as [a.jsonl]
  bool list_non_empty = false;
  bool items_non_empty = false;
  bool dedupe = false;
  std::string all_alias;       // this string stands for all `choices` ("all-linear")
  std::string choice_problem;  // "'x' <choice_problem> (<choices>)" for an entry not allowed

  // kSection. Optional sections (present/enable set) are absent from a JobSpec until given;
  // ToJson writes an absent one as null when null_when_absent, else leaves it out.
  const std::vector<SpecField>* fields = nullptr;
  bool (*present)(const JobSpec&) = nullptr;
  void (*enable)(JobSpec&) = nullptr;
  bool null_when_absent = false;
  // Checked after the section's fields: "" or the problem, reported at field `check_at`.
  std::string (*section_check)(const JobSpec&) = nullptr;
  std::string check_at;

  // docs/spec.md: the default as the reader should see it when not the value's own ("the file's
  // stem"), and the meaning (Markdown, one line).
  std::string default_doc;
  std::string doc;
};

// The top-level fields and sections, in the order ParseSpec reads them (which decides which of
// several problems is reported).
const std::vector<SpecField>& SpecFields();

// The field or section at a dotted path ("train.lr", "lora"), or nullptr.
const SpecField* FindSpecField(const std::string& path);

// A JobSpec holding every default, its optional sections (lora, slurm) present.
const JobSpec& SpecDefaults();

// One row per documented field: its path, type, default and meaning, in table order.
struct SpecFieldRow {
  std::string path, type, default_value, doc;
};
std::vector<SpecFieldRow> SpecFieldRows();

// The field table of docs/spec.md (Markdown), from SpecFieldRows().
std::string SpecFieldsMarkdown();

}  // namespace sftctl
