#include "common/data/jsonl_reader.h"

#include <fstream>

#include "common/json_parse.h"

namespace sftctl {
namespace {

enum class LineRead { kLine, kEnd, kTooLong };

// One line of `in` without its '\n', of at most `max` bytes; kTooLong as soon as it is longer.
LineRead ReadBoundedLine(std::istream& in, std::string* line, size_t max) {
  line->clear();
  std::streambuf* sb = in.rdbuf();
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) return line->empty() ? LineRead::kEnd : LineRead::kLine;
    if (c == '\n') return LineRead::kLine;
    if (line->size() >= max) return LineRead::kTooLong;
    line->push_back(static_cast<char>(c));
  }
}

}  // namespace

Status ForEachJsonlRecord(const std::string& path, size_t max_line_bytes, const JsonlRecordFn& fn,
                          int64_t* records) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read data file '" + path + "'");
  std::string line;
  int64_t line_no = 0, count = 0;
  if (records) *records = 0;
  for (bool stop = false; !stop;) {
    const LineRead got = ReadBoundedLine(in, &line, max_line_bytes);
    if (got == LineRead::kEnd) break;
    ++line_no;
    if (got == LineRead::kTooLong) {
      return InvalidArgumentError(path + ":" + std::to_string(line_no) + ": the line is longer than " +
                                  std::to_string(max_line_bytes >> 20) + " MiB (one JSON record per line)");
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    SFT_ASSIGN_OR_RETURN(nlohmann::ordered_json rec, ParseOrderedJson(line, where));
    if (records) *records = ++count;
    SFT_RETURN_IF_ERROR(fn(rec, where, line_no, &stop));
  }
  if (in.bad()) return DataLossError("error reading data file '" + path + "'");
  return OkStatus();
}

}  // namespace sftctl
