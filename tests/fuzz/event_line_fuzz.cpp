// Fuzz target: one line of a trainer's event stream, to the one reader of it (common/event_line.h
// ParseEventLine, then ReadEventLine and EventLineToJson on what it read): the agent's live path, its journal
// replay and the Slurm follow thread, `logs`, `status`, `plot`, `run --local --ranks N` and the TensorBoard
// writer all read event lines through it (issue 49). Properties: it never throws; an error is
// INVALID_ARGUMENT starting with the `where` it was given; a line over kMaxEventLineBytes is refused; an
// accepted line is a JSON object whose "event" is the non-empty `kind`, `type` is EventKindOf(kind), `json`
// is the whole line, every typed count is the line's integer and >= 0; EventLineToJson gives the line back;
// the line dumped again reads back the same.
#include <nlohmann/json.hpp>

#include "common/event_line.h"
#include "common/json_parse.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

namespace {

void CheckCount(const EventLine& ev, const std::optional<int64_t>& v, const char* key) {
  if (!v) {
    FUZZ_CHECK(!ev.json.contains(key) || ev.json[key].is_null(), std::string("absent ") + key);
    return;
  }
  FUZZ_CHECK(*v >= 0, key);
  FUZZ_CHECK(ev.json.at(key).is_number_integer() && ev.json.at(key) == *v, key);
}

void CheckSame(const EventLine& a, const EventLine& b) {
  FUZZ_CHECK(a.kind == b.kind && a.type == b.type, "kind");
  FUZZ_CHECK(a.step == b.step && a.tokens == b.tokens && a.rank == b.rank, "counts");
  FUZZ_CHECK(a.message == b.message && a.path == b.path && a.device == b.device, "strings");
  FUZZ_CHECK(a.json == b.json, "json");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line = fuzz::AsView(data, size);
  auto ev = ParseEventLine(line, "fuzz line");
  fuzz::Log("ParseEventLine", ev.status());
  if (!ev.ok()) {
    FUZZ_CHECK(ev.status().code() == StatusCode::kInvalidArgument, ev.status().ToString());
    FUZZ_CHECK(ev.status().message().rfind("fuzz line: ", 0) == 0, ev.status().message());
    return 0;
  }
  FUZZ_CHECK(line.size() <= kMaxEventLineBytes, "an over-long line was read");
  auto j = ParseJson(line, "fuzz line", kMaxEventLineDepth);
  FUZZ_CHECK(j.ok() && *j == ev->json, "json is not the line");
  FUZZ_CHECK(ev->json.is_object() && ev->json.at("event") == ev->kind && !ev->kind.empty(),
             "kind " + ev->kind);
  FUZZ_CHECK(ev->type == EventKindOf(ev->kind), "type of " + ev->kind);
  FUZZ_CHECK(ev->type == EventKind::kOther || EventKindName(ev->type) == ev->kind, "name of " + ev->kind);
  CheckCount(*ev, ev->step, "step");
  CheckCount(*ev, ev->tokens, "tokens");
  CheckCount(*ev, ev->total_steps, "total_steps");
  CheckCount(*ev, ev->rank, "rank");
  CheckCount(*ev, ev->exact_total, "exact_total");
  if (ev->loss) FUZZ_CHECK(ev->json.at("loss").is_number(), "loss");
  FUZZ_CHECK(EventLineToJson(*ev) == ev->json, "the record of a line read is not the line");
  // The record as read, and the record written out again, read back the same.
  auto again = ReadEventLine(ev->json, "again");
  FUZZ_CHECK(again.ok(), again.status().ToString());
  CheckSame(*ev, *again);
  const std::string dumped = ev->json.dump();
  if (dumped.size() <= kMaxEventLineBytes) {
    auto reread = ParseEventLine(dumped, "dumped");
    FUZZ_CHECK(reread.ok(), reread.status().ToString());
    CheckSame(*ev, *reread);
  }
  return 0;
}
