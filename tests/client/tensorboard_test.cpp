// TensorBoard event files (common/formats/tensorboard.h, client/metrics/tensorboard_export.h): the files are
// read back the way TensorBoard reads them — tests/client/tensorboard/read_events.py checks every record's
// masked CRC-32C with its own CRC code and parses every Event with python3-protobuf and protos compiled here
// by protoc — and must hold exactly metrics.jsonl's scalars at their steps, each once. The end-to-end tests
// run the real sftctl, sftctl-trainer and sftd.
#include "common/formats/tensorboard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "client/metrics/tensorboard_export.h"
#include "tests/remote/remote_test_util.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using nlohmann::json;
using ::sftctl::remotetest::Result;
using ::sftctl::remotetest::Sftctl;
using ::sftctl::remotetest::WriteTinyJob;
using ::sftctl::testing::Bin;
using ::sftctl::testing::MakeTempDir;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WriteWholeFile;
using tensorboard::EventFileWriter;
using tensorboard::kEventFileName;
using ::testing::HasSubstr;

// event_pb2.py and summary_pb2.py, compiled once per test program.
const std::string& ProtoOut() {
  static const std::string dir = [] {
    const std::string out = MakeTempDir("tb-protos");
    const std::string src = std::string(SFTCTL_SOURCE_DIR) + "/tests/client/tensorboard";
    auto r = RunCommand(
        {"protoc", "-I", src, "--python_out=" + out, src + "/event.proto", src + "/summary.proto"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return out;
  }();
  return dir;
}

// The file's contents as read_events.py reports them (one JSON object per value / file version).
std::vector<json> ReadEvents(const std::string& file) {
  // Debian's interpreter, where python3-protobuf is (a PATH python3 may be another one).
  auto r = sftctl::testing::RunForStdout(
      {"/usr/bin/python3", std::string(SFTCTL_SOURCE_DIR) + "/tests/client/tensorboard/read_events.py",
       ProtoOut(), file});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<json> out;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

std::vector<json> ReadJsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(ReadWholeFile(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// The scalars TensorBoard must show for `records` (metrics.jsonl): step records' numbers as train/<key>,
// eval records' as eval/<key without eval_>, each (tag, step) once (its first report).
std::map<std::pair<std::string, int64_t>, json> Expected(const std::vector<json>& records) {
  std::map<std::pair<std::string, int64_t>, json> want;
  for (const json& r : records) {
    const std::string ev = r.value("event", "");
    if (ev != "step" && ev != "eval") continue;
    for (const auto& [key, v] : r.items()) {
      if (key == "step" || key == "time" || !v.is_number()) continue;
      std::string tag = key;
      if (ev == "eval" && tag.rfind("eval_", 0) == 0) tag = tag.substr(5);
      tag = (ev == "step" ? "train/" : "eval/") + tag;
      want.emplace(std::make_pair(tag, r["step"].get<int64_t>()), json{{"value", v}, {"time", r["time"]}});
    }
  }
  return want;
}

// Every scalar of the event file equals metrics.jsonl's (as float32, TensorBoard's simple_value), at
// its step and wall time, each once; the file starts with its version and holds the spec text once.
void ExpectMatches(const std::string& event_file, const std::vector<json>& records) {
  const auto events = ReadEvents(event_file);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].value("file_version", ""), "brain.Event:2");
  const auto want = Expected(records);
  std::set<std::pair<std::string, int64_t>> seen;
  int specs = 0;
  for (const json& e : events) {
    if (e.contains("file_version")) continue;
    if (e["tag"] == "spec") {
      ++specs;
      EXPECT_EQ(e["plugin"], "text");
      EXPECT_THAT(e["text"].get<std::string>(), HasSubstr("\"max_steps\""));
      continue;
    }
    const auto key = std::make_pair(e["tag"].get<std::string>(), e["step"].get<int64_t>());
    EXPECT_TRUE(seen.insert(key).second) << "duplicate " << key.first << " at step " << key.second;
    auto it = want.find(key);
    ASSERT_NE(it, want.end()) << key.first << " at step " << key.second << " is not in metrics.jsonl";
    EXPECT_EQ(e["value"].get<double>(),
              static_cast<double>(static_cast<float>(it->second["value"].get<double>())))
        << key.first << " at step " << key.second;
    EXPECT_EQ(e["wall_time"].get<double>(), it->second["time"].get<double>()) << key.first;
  }
  EXPECT_EQ(specs, 1);
  EXPECT_EQ(seen.size(), want.size());
  EXPECT_TRUE(want.count({"train/loss", 1})) << "no train/loss at step 1";
}

json StepRecord(int64_t step, double loss, double time) {
  return {{"event", "step"}, {"step", step}, {"loss", loss}, {"lr", 1e-4 * step}, {"time", time}};
}

TEST(TensorBoard, Crc32cOfTheStandardCheckString) {
  EXPECT_EQ(tensorboard::Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(tensorboard::Crc32c(""), 0u);
  const std::string framed = tensorboard::FrameRecord("abc");
  EXPECT_EQ(framed.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(framed.substr(12, 3), "abc");
}

TEST(TensorBoard, ScalarsOfStepAndEvalRecordsOnly) {
  auto s =
      tensorboard::ScalarsOf({{"event", "step"}, {"step", 3}, {"loss", 1.5}, {"ok", true}, {"time", 9.0}});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0], std::make_pair(std::string("train/loss"), 1.5));
  s = tensorboard::ScalarsOf({{"event", "eval"}, {"step", 3}, {"eval_loss", 2.0}, {"exact_match", 0.5}});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].first, "eval/exact_match");
  EXPECT_EQ(s[1].first, "eval/loss");
  EXPECT_TRUE(tensorboard::ScalarsOf({{"event", "done"}, {"step", 3}, {"loss", 1.0}}).empty());
}

// Issue 49: records are read by the one event-line reader (common/event_line.h): keys beyond its typed
// fields (per-phase times, resource figures) become scalars too, and a record with a typed field of the
// wrong type gives none, nor does the writer write it.
TEST(TensorBoard, ScalarsOfRecordsReadAsEventLines) {
  auto s = tensorboard::ScalarsOf({{"event", "step"}, {"step", 3}, {"loss", 1.5}, {"forward_ms", 12.5}});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0], std::make_pair(std::string("train/forward_ms"), 12.5));
  EXPECT_TRUE(tensorboard::ScalarsOf({{"event", "step"}, {"step", 3}, {"loss", "1.5"}, {"lr", 0.1}}).empty());
  EXPECT_TRUE(tensorboard::ScalarsOf({{"event", "step"}, {"step", -3}, {"loss", 1.5}}).empty());
  TempDir tmp("tb-typed");
  auto w = tensorboard::EventFileWriter::Open(tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_TRUE((*w)->WriteMetrics({{"event", "step"}, {"step", 4}, {"loss", 2.0}, {"time", "now"}}).ok());
  EXPECT_TRUE((*w)->WriteMetrics({{"event", "step"}, {"step", 5}, {"loss", 2.0}, {"time", 7.0}}).ok());
  size_t end = 0;
  auto events = tensorboard::ParseRecords(ReadWholeFile((*w)->path()), 0, &end, "events");
  ASSERT_TRUE(events.ok()) << events.status().message();
  ASSERT_EQ(events->size(), 2u);  // the file version and step 5's loss, at the record's time
  EXPECT_EQ((*events)[1].step, 5);
  EXPECT_EQ((*events)[1].wall_time, 7.0);
}

// Issue 37, item 5: an agent-supplied record whose "event" is not a string made `logs --tensorboard`
// abort (type_error, exit 134). Such records give no scalars, and the writer writes nothing for them.
TEST(TensorBoard, ARecordWhoseEventIsNotAStringIsSkipped) {
  for (const nlohmann::json& bad : {nlohmann::json{{"event", 7}, {"step", 3}, {"loss", 1.0}},
                                    nlohmann::json{{"event", nullptr}, {"step", 3}, {"loss", 1.0}},
                                    nlohmann::json::array({"step"}), nlohmann::json("step")}) {
    EXPECT_TRUE(tensorboard::ScalarsOf(bad).empty()) << bad;
  }
  TempDir tmp("tb-bad");
  auto w = tensorboard::EventFileWriter::Open(tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_TRUE((*w)->WriteMetrics({{"event", 7}, {"step", 3}, {"loss", 1.0}}).ok());
  EXPECT_TRUE((*w)->WriteMetrics({{"event", "step"}, {"step", 4}, {"loss", 2.0}}).ok());
  size_t end = 0;
  auto events = tensorboard::ParseRecords(ReadWholeFile((*w)->path()), 0, &end, "events");
  ASSERT_TRUE(events.ok()) << events.status().message();
  ASSERT_EQ(events->size(), 2u);  // the file version and step 4's loss
  EXPECT_EQ((*events)[1].step, 4);
}

TEST(TensorBoard, ReopenedWriterAddsOnlyNewSteps) {
  TempDir tmp("tb-reopen");
  std::vector<json> records;
  {
    auto w = EventFileWriter::Open(tmp.path());
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->WriteTextOnce("spec", "    {\"max_steps\": 5}", 100.0).ok());
    for (int s = 1; s <= 3; ++s) {
      records.push_back(StepRecord(s, 3.0 - 0.1 * s, 100.0 + s));
      ASSERT_TRUE((*w)->WriteMetrics(records.back()).ok());
    }
  }
  // Followed again (or resumed): steps 2..3 come again with other values, then 4..5 are new.
  auto w = EventFileWriter::Open(tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->WriteTextOnce("spec", "    {\"max_steps\": 5}", 200.0).ok());
  std::vector<json> all = records;
  for (int s = 2; s <= 5; ++s) {
    all.push_back(StepRecord(s, 7.0 + s, 200.0 + s));
    ASSERT_TRUE((*w)->WriteMetrics(all.back()).ok());
  }
  ExpectMatches(tmp.path() + "/" + kEventFileName, all);
}

TEST(TensorBoard, TwoWritersOfOneFolderWriteEachStepOnce) {
  TempDir tmp("tb-two");
  auto a = EventFileWriter::Open(tmp.path());
  auto b = EventFileWriter::Open(tmp.path());
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<json> records;
  for (int s = 1; s <= 4; ++s) records.push_back(StepRecord(s, 1.0 / s, 50.0 + s));
  ASSERT_TRUE((*a)->WriteTextOnce("spec", "    {\"max_steps\": 4}", 1).ok());
  ASSERT_TRUE((*b)->WriteTextOnce("spec", "    {\"max_steps\": 4}", 2).ok());
  for (int i : {0, 1}) ASSERT_TRUE((*a)->WriteMetrics(records[i]).ok());
  for (int i : {0, 1, 2}) ASSERT_TRUE((*b)->WriteMetrics(records[i]).ok());
  for (int i : {1, 2, 3}) ASSERT_TRUE((*a)->WriteMetrics(records[i]).ok());
  ExpectMatches(tmp.path() + "/" + kEventFileName, records);
}

TEST(TensorBoard, TornLastRecordIsCutOffOnOpen) {
  TempDir tmp("tb-torn");
  const std::string file = tmp.path() + "/" + kEventFileName;
  std::vector<json> records = {StepRecord(1, 2.0, 10), StepRecord(2, 1.0, 11)};
  {
    auto w = EventFileWriter::Open(tmp.path());
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteTextOnce("spec", "    {\"max_steps\": 2}", 1).ok());
    ASSERT_TRUE((*w)->WriteMetrics(records[0]).ok());
  }
  // A crash in the middle of a record.
  const std::string half = tensorboard::FrameRecord(tensorboard::ScalarEvent(11, 2, "train/loss", 9.0f));
  WriteWholeFile(file, ReadWholeFile(file) + half.substr(0, half.size() / 2));
  auto w = EventFileWriter::Open(tmp.path());
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE((*w)->WriteMetrics(records[1]).ok());
  ExpectMatches(file, records);
}

TEST(TensorBoard, CorruptRecordIsRefusedAndTheFileLeftAlone) {
  TempDir tmp("tb-corrupt");
  const std::string file = tmp.path() + "/" + kEventFileName;
  {
    auto w = EventFileWriter::Open(tmp.path());
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteMetrics(StepRecord(1, 2.0, 10)).ok());
  }
  std::string bytes = ReadWholeFile(file);
  bytes[bytes.size() - 6] ^= 0x40;  // inside the last record's data
  WriteWholeFile(file, bytes);
  EXPECT_THAT(EventFileWriter::Open(tmp.path()).status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr(file + ": byte ")));
  EXPECT_EQ(ReadWholeFile(file), bytes);
}

TEST(TensorBoard, ExportNewMetricLinesLeavesAnUnfinishedLine) {
  TempDir tmp("tb-lines");
  const std::string jsonl = tmp.path() + "/metrics.jsonl";
  auto w = EventFileWriter::Open(tmp.path() + "/tb");
  ASSERT_TRUE(w.ok());
  uint64_t offset = 0;
  ASSERT_TRUE(client::ExportNewMetricLines(jsonl, &offset, w->get()).ok());  // not there yet
  EXPECT_EQ(offset, 0u);
  const std::string first = StepRecord(1, 2.0, 10).dump() + "\n";
  const std::string second = StepRecord(2, 1.0, 11).dump();
  WriteWholeFile(jsonl, first + "not json\n" + second.substr(0, 10));
  ASSERT_TRUE(client::ExportNewMetricLines(jsonl, &offset, w->get()).ok());
  EXPECT_EQ(offset, first.size() + 9);
  WriteWholeFile(jsonl, first + "not json\n" + second + "\n");
  ASSERT_TRUE(client::ExportNewMetricLines(jsonl, &offset, w->get()).ok());
  ASSERT_TRUE((*w)->WriteTextOnce("spec", "    \"max_steps\"", 1).ok());
  ExpectMatches(tmp.path() + "/tb/" + kEventFileName, {StepRecord(1, 2.0, 10), StepRecord(2, 1.0, 11)});
}

// The spec's metrics section is validated like every other (docs/spec.md), naming the field and line.
TEST(TensorBoard, BadMetricsFieldsAreNamed) {
  TempDir tmp("tb-spec");
  const std::string spec = WriteTinyJob(tmp.path(), /*steps=*/1);
  const std::string base = ReadWholeFile(spec);
  WriteWholeFile(spec, base + "metrics:\n  tensorboard: sometimes\n");
  auto r = RunCommand({Bin("sftctl"), "run", spec});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("job.yaml:21: field 'metrics.tensorboard': must be true or false"));
  WriteWholeFile(spec, base + "metrics: {gpu_peak_tflops: -1}\n");
  r = RunCommand({Bin("sftctl"), "run", spec});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("field 'metrics.gpu_peak_tflops'"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/runs"));
}

#ifdef SFTCTL_HAVE_TRAINER
// `run --tensorboard DIR` (client side) and `metrics.tensorboard: true` (<run>/tb/, trainer side) both
// hold metrics.jsonl's scalars; a resumed run extends the same series without duplicates.
TEST(TensorBoardE2E, RunLocalAndSpecWriteTheSameSeriesAcrossAResume) {
  TempDir tmp("tb-run");
  const std::string spec = WriteTinyJob(tmp.path(), /*steps=*/4, /*checkpoint_interval=*/2);
  WriteWholeFile(spec, ReadWholeFile(spec) + "eval: {interval: 2}\nmetrics: {tensorboard: true}\n");
  const std::string run = tmp.path() + "/run", tb = tmp.path() + "/tb";
  auto r = RunCommand({Bin("sftctl"), "run", spec, "-o", run, "--tensorboard", tb});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ExpectMatches(tb + "/" + kEventFileName, ReadJsonl(run + "/metrics.jsonl"));
  ExpectMatches(run + "/tb/" + kEventFileName, ReadJsonl(run + "/metrics.jsonl"));
  // On CPU the step records carry the process RSS (a train/rss_mb series) and no GPU figures.
  for (const json& rec : ReadJsonl(run + "/metrics.jsonl")) {
    if (rec["event"] != "step") continue;
    EXPECT_GT(rec.value("rss_mb", 0.0), 1.0) << rec.dump();
    EXPECT_FALSE(rec.contains("gpu_mem_allocated_mb") || rec.contains("gpu_util_pct") || rec.contains("mfu"));
  }
  r = RunCommand({Bin("sftctl"), "run", spec, "-o", run, "--tensorboard", tb, "--max-steps", "6"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto records = ReadJsonl(run + "/metrics.jsonl");
  EXPECT_TRUE(Expected(records).count({"train/loss", 6}));
  EXPECT_TRUE(Expected(records).count({"eval/loss", 6}));
  ExpectMatches(tb + "/" + kEventFileName, records);
  ExpectMatches(run + "/tb/" + kEventFileName, records);
}

// `logs -f --tensorboard DIR` against a local agent; following again writes nothing new. The agent has
// a price per hour: `logs -f`, `status` and `list` show the job's usage and cost (client/remote/job_usage.h),
// and status the latest step's resource figures.
TEST(TensorBoardE2E, LogsFollowWritesTheJobsSeriesOnceAndUsageIsShown) {
  TempDir tmp("tb-logs");
  const std::string agent = tmp.path() + "/agent", host = "local:" + agent;
  auto started = RunCommand({Bin("sftd"), "start", "--detach", "--data-dir", agent, "--port", "0", "--gpus",
                             "none", "--price-per-hour", "3.6"});
  ASSERT_EQ(started.exit_code, 0) << started.output;
  struct StopAgent {
    std::string dir;
    ~StopAgent() { RunCommand({Bin("sftd"), "stop", "--data-dir", dir}); }
  } stop_agent{agent};
  std::filesystem::create_directories(tmp.path() + "/home");
  Sftctl sftctl(tmp.path() + "/home");
  const std::string spec = WriteTinyJob(tmp.path() + "/work", /*steps=*/3);
  Result r = sftctl.Run({"submit", "--host", host, spec, "--json", "--cpu-ranks", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const std::string job = r.Json()["job"];
  const std::string tb = tmp.path() + "/tb";
  r = sftctl.Run({"logs", "-f", job, "--tensorboard", tb});
  EXPECT_EQ(r.exit_code, 0) << r.All();
  EXPECT_THAT(r.out, HasSubstr("step 3/3: loss "));
  const std::string follow_err = r.err;  // its usage line is checked below, against `list --json`
  const std::string file = tb + "/" + kEventFileName;
  ExpectMatches(file, ReadJsonl(agent + "/jobs/" + job + "/run/metrics.jsonl"));
  const std::string before = ReadWholeFile(file);
  r = sftctl.Run({"logs", job, "--tensorboard", tb, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(ReadWholeFile(file), before);

  r = sftctl.Run({"list", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const json listed = r.Json()["jobs"][0]["usage"];
  EXPECT_GT(listed["run_hours"].get<double>(), 0.0) << listed;
  EXPECT_EQ(listed["gpu_hours"], 0.0);
  EXPECT_EQ(listed["price_per_hour"], 3.6);
  EXPECT_DOUBLE_EQ(listed["cost"].get<double>(),
                   listed["run_hours"].get<double>() * 3.6);  // a CPU job: the host
  // The job has ended, so every view shows the same figures (a loaded machine may run it for more
  // than the 5 s that make a cent: the text is built from the listed numbers, not assumed zero).
  char usage[96];
  std::snprintf(usage, sizeof(usage), "%.2f h on CPU, $%.2f at $3.60/h", listed["run_hours"].get<double>(),
                listed["cost"].get<double>());
  EXPECT_THAT(follow_err, HasSubstr(std::string(": SUCCEEDED; ") + usage)) << follow_err;
  r = sftctl.Run({"status", job, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const json node = r.Json()["nodes"][0];
  EXPECT_EQ(node["usage"], listed);  // the job has ended: the same figures
  EXPECT_EQ(node["latest_metrics"]["step"], 3);
  EXPECT_GT(node["latest_metrics"]["rss_mb"].get<double>(), 1.0);
  r = sftctl.Run({"status", job});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_THAT(r.out, HasSubstr(std::string("  usage ") + usage + "\n"));
  EXPECT_THAT(r.out, HasSubstr("  at step 3: rss "));
}
#endif

}  // namespace
}  // namespace sftctl
