// Reading JSONL files (one JSON object per line) record by record, never whole: the one place
// that decides how a line is read (bounded length, '\r\n' endings, blank lines skipped) and how
// its errors name it ("<file>:<line>: ...").
//
// Thread safety: reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace sftctl {

// Called for each record with its location ("file:line") and line number. Setting *stop ends
// the reading after this record.
using JsonlRecordFn = std::function<Status(const nlohmann::ordered_json& rec, const std::string& where,
                                           int64_t line, bool* stop)>;

// Calls `fn` for every non-blank line of `path`, parsed as JSON (common/json_parse.h), until
// `fn` fails or stops. Errors: NOT_FOUND when the file cannot be opened ("cannot read data file
// '<path>'"), INVALID_ARGUMENT naming file:line for invalid JSON or a line longer than
// `max_line_bytes` (nothing more of it is read into memory), DATA_LOSS on a read error.
// Returns the number of records read through *records when given.
Status ForEachJsonlRecord(const std::string& path, size_t max_line_bytes, const JsonlRecordFn& fn,
                          int64_t* records = nullptr);

}  // namespace sftctl
