// The spec's table of fields (common/spec/spec_fields.h): canonical JSON and error texts held to a golden
// taken from the hand-written parser the table replaced, docs/spec.md held to the table, `--set` on
// fields the canonical JSON leaves out, and the `slurm:` section.
#include "common/spec/spec_fields.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "common/spec/spec.h"
#include "common/spec/spec_yaml.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using nlohmann::json;
using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

std::string ReadSourceFile(const std::string& relative) {
  std::ifstream in(std::string(SFTCTL_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// tests/common/spec_golden.json: specs (whole, or a base with an RFC 7386 merge patch) with the
// canonical JSON or the exact error the parser before the table gave for them (the slurm cases: the
// first parser with the slurm section). Made by a throwaway harness; see the file's cases.
TEST(SpecFields, CanonicalJsonAndErrorsMatchTheGolden) {
  const json golden = json::parse(ReadSourceFile("tests/common/spec_golden.json"));
  const auto locate = [](const std::string& field) { return "L(" + field + ")"; };
  ASSERT_GT(golden["cases"].size(), 200u);
  for (const auto& c : golden["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    json spec_json = c.contains("spec") ? c["spec"] : golden["bases"][c["base"].get<std::string>()];
    if (c.contains("patch")) spec_json.merge_patch(c["patch"]);
    auto spec = ParseSpec(spec_json, c["base_dir"], locate);
    if (c.contains("error")) {
      EXPECT_THAT(spec, StatusIs(StatusCode::kInvalidArgument, c["error"].get<std::string>()));
      continue;
    }
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const std::string text = ToJson(*spec).dump(2);
    if (c.contains("canonical")) {
      EXPECT_EQ(text, c["canonical"].dump(2));
    }
    auto again = ParseSpec(json::parse(text));  // as the trainer reads spec.json
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(ToJson(*again).dump(2), text);
  }
}

json FieldValue(const SpecField& f, JobSpec& spec) {
  return std::visit([](auto* v) { return json(*v); }, f.value(spec));
}

// Every field of the table is set in the golden's full spec to a value other than its default, so
// the golden above covers each row (the fields ToJson writes only when set too): a new row needs
// its golden cases.
TEST(SpecFields, TheGoldenFullSpecSetsEveryField) {
  const json golden = json::parse(ReadSourceFile("tests/common/spec_golden.json"));
  auto full = ParseSpec(golden["bases"]["full"], "/base");
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  JobSpec defaults = SpecDefaults();
  size_t leaves = 0;
  for (const auto& row : SpecFieldRows()) {
    const SpecField* f = FindSpecField(row.path);
    ASSERT_NE(f, nullptr) << row.path;
    // Sections are covered by their fields; the full spec has model.path, the minimal one config.
    if (f->kind == SpecKind::kSection || row.path == "model.config") continue;
    ++leaves;
    EXPECT_NE(FieldValue(*f, *full), FieldValue(*f, defaults)) << row.path << " is at its default";
  }
  EXPECT_GT(leaves, 60u);
}

// docs/spec.md's field table is SpecFieldsMarkdown(), between the markers.
TEST(SpecFields, DocsSpecMdListsTheTable) {
  const std::string doc = ReadSourceFile("docs/spec.md");
  const std::string begin = "<!-- spec-fields:begin -->\n";
  const std::string end = "<!-- spec-fields:end -->";
  const size_t b = doc.find(begin);
  const size_t e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/spec.md has no " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/spec.md has no " << end;
  ASSERT_LT(b, e);
  const std::string listed = doc.substr(b + begin.size(), e - b - begin.size());
  const std::vector<std::string> have = Lines(listed);
  const std::vector<std::string> want = Lines(SpecFieldsMarkdown());
  for (size_t i = 0; i < std::max(have.size(), want.size()); ++i) {
    const std::string h = i < have.size() ? have[i] : "(nothing)";
    const std::string w = i < want.size() ? want[i] : "(nothing)";
    if (h == w) continue;
    ADD_FAILURE() << "docs/spec.md's field list and the table (common/spec/spec_fields.cpp) disagree at row "
                  << i + 1 << ":\n  docs/spec.md: " << h << "\n  the table:    " << w
                  << "\nPut the output of `sftctl spec --fields --markdown` between the markers.";
    break;
  }
}

TEST(SpecFields, RowsHaveDocsAndDefaultsFromTheStructs) {
  std::map<std::string, SpecFieldRow> rows;
  for (const auto& r : SpecFieldRows()) {
    EXPECT_FALSE(r.doc.empty()) << r.path;
    EXPECT_TRUE(rows.emplace(r.path, r).second) << r.path << " twice";
  }
  EXPECT_EQ(rows.at("train.lr").default_value, "`0.0002`");
  EXPECT_EQ(rows.at("train.lr").type, "number in (0, 10]");
  EXPECT_EQ(rows.at("train.batch_size").default_value, "`8`");
  EXPECT_EQ(rows.at("train.batch_size").type, "integer >= 1");
  EXPECT_EQ(rows.at("lora.target_modules").default_value, "`[q_proj, v_proj]`");
  EXPECT_EQ(rows.at("precision").type, "one of `auto`, `fp32`, `bf16`, `fp16`");
  EXPECT_EQ(rows.at("slurm.requeue").default_value, "`true`");
  EXPECT_EQ(rows.at("slurm").default_value, "absent");
  EXPECT_EQ(rows.count("train"), 0u);  // sections without a meaning of their own have no row
}

TEST(SpecFields, FindSpecField) {
  ASSERT_NE(FindSpecField("train.lr"), nullptr);
  EXPECT_EQ(FindSpecField("train.lr")->kind, SpecKind::kNumber);
  ASSERT_NE(FindSpecField("slurm"), nullptr);
  EXPECT_EQ(FindSpecField("slurm")->kind, SpecKind::kSection);
  EXPECT_EQ(FindSpecField("checkpoint.upload_to")->kind, SpecKind::kString);
  EXPECT_EQ(FindSpecField("train.nope"), nullptr);
  EXPECT_EQ(FindSpecField("train.lr.x"), nullptr);
  EXPECT_EQ(FindSpecField("model.config.hidden_size"), nullptr);  // inside model.config: not the table's
  EXPECT_EQ(FindSpecField(""), nullptr);
}

json MinimalCanonical() {
  auto spec =
      ParseSpec(json{{"model", {{"config", {{"hidden_size", 32}}}}}, {"data", {{"train", "t.jsonl"}}}});
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return ToJson(*spec);
}

StatusOr<JobSpec> WithSets(const std::vector<std::string>& sets) {
  json j = MinimalCanonical();
  SFT_RETURN_IF_ERROR(ApplySetOverrides(sets, &j));
  return ParseSpec(j);
}

// Fields at their default are not in the canonical JSON (upload_to, endpoint_url, region,
// data.max_samples, metrics.*), and an absent lora is null: --set reaches them all the same.
TEST(SpecFields, SetReachesFieldsTheCanonicalJsonLeavesOut) {
  auto spec =
      WithSets({"checkpoint.upload_to=s3://bucket/runs/x", "checkpoint.endpoint_url=http://127.0.0.1:9000",
                "checkpoint.region=eu-west-1", "data.max_samples=100", "metrics.tensorboard=true"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->checkpoint.upload_to, "s3://bucket/runs/x");
  EXPECT_EQ(spec->checkpoint.endpoint_url, "http://127.0.0.1:9000");
  EXPECT_EQ(spec->checkpoint.region, "eu-west-1");
  EXPECT_EQ(spec->data.max_samples, 100);
  EXPECT_TRUE(spec->metrics.tensorboard);
  EXPECT_FALSE(spec->lora.has_value());

  spec = WithSets({"lora.r=4"});  // a field of the absent lora section turns LoRA on
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(spec->lora.has_value());
  EXPECT_EQ(spec->lora->r, 4);
  spec = WithSets({"slurm.nodes=2", "slurm.extra_args=[--exclusive]"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(spec->slurm.has_value());
  EXPECT_EQ(spec->slurm->nodes, 2);
  EXPECT_EQ(spec->slurm->extra_args, std::vector<std::string>{"--exclusive"});
}

TEST(SpecFields, SetTypesValuesByTheField) {
  // A string field takes a plain scalar as written; other fields keep YAML's typing.
  auto spec = WithSets({"checkpoint.region=1", "name=1e3", "train.lr=1e-4", "data.packing=true"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->checkpoint.region, "1");
  EXPECT_EQ(spec->name, "1e3");
  EXPECT_DOUBLE_EQ(spec->train.lr, 1e-4);
  EXPECT_TRUE(spec->data.packing);
  EXPECT_THAT(
      WithSets({"train.lr=fast"}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'train.lr': must be a number, got a string")));
  EXPECT_THAT(
      WithSets({"checkpoint.upload_to=bucket"}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'checkpoint.upload_to': must be s3://")));
}

// FIELD+=VALUE adds: entries after a list's own, fields over a section's own (an absent one is turned
// on). What `submit --slurm-arg` and `--slurm` become (client/commands/spec_flags.h).
TEST(SpecFields, SetAddsToListsAndSections) {
  auto spec = WithSets({"data.train+=b.jsonl", "data.train+=[c.jsonl, d.jsonl]", "slurm.extra_args+=1"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.train, (std::vector<std::string>{"t.jsonl", "b.jsonl", "c.jsonl", "d.jsonl"}));
  ASSERT_TRUE(spec->slurm.has_value());  // a field of the absent section turned it on
  EXPECT_EQ(spec->slurm->extra_args, std::vector<std::string>{"1"});  // an entry is text as written

  spec = WithSets({"slurm+={}"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(spec->slurm.has_value());
  EXPECT_EQ(ToJson(*spec)["slurm"], ToJson(SpecDefaults())["slurm"]);
  spec = WithSets({"slurm.partition=gpu", "slurm+={nodes: 2}", "slurm+={}"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->slurm->partition, "gpu");  // kept
  EXPECT_EQ(spec->slurm->nodes, 2);

  EXPECT_THAT(WithSets({"train.lr+=1"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("+= adds entries")));
  EXPECT_THAT(WithSets({"slurm+=[a]"}), StatusIs(StatusCode::kInvalidArgument, HasSubstr("+= adds entries")));
  EXPECT_THAT(WithSets({"+=1"}), StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown field")));
}

// A flag's text set through YamlQuoted stays that text, whatever YAML would make of it plain.
TEST(SpecFields, YamlQuotedValuesStayAsTyped) {
  for (const std::string text :
       {"null", "~", "1e3", "true", "[a]", "{a: 1}", "a: b # c", "#x", "-", "'q'", "\"q\"", "back\\slash",
        "tab\there", "new\nline", "\x01\x7f", "ü ✓", "*a", "!t"}) {
    auto spec = WithSets({"name=" + YamlQuoted(text)});
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status().ToString();
    EXPECT_EQ(spec->name, text);
  }
}

TEST(SpecFields, SetStillRefusesUnknownPaths) {
  json j = MinimalCanonical();
  const json before = j;
  EXPECT_THAT(ApplySetOverrides({"train.nope=1"}, &j),
              StatusIs(StatusCode::kInvalidArgument, "--set: unknown field 'train.nope' (see docs/spec.md)"));
  EXPECT_THAT(ApplySetOverrides({"nope.x=1"}, &j),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown field 'nope.x'")));
  EXPECT_THAT(ApplySetOverrides({"model.config.num_layers=2"}, &j),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown field 'model.config.num_layers'")));
  EXPECT_EQ(j, before);
  // A path inside model.config that exists is still set.
  ASSERT_TRUE(ApplySetOverrides({"model.config.hidden_size=64"}, &j).ok());
  EXPECT_EQ(j["model"]["config"]["hidden_size"], 64);
}

TEST(SpecFields, SlurmSectionFromYaml) {
  ::sftctl::testing::TempDir dir;
  const std::string path = dir.path() + "/slurm.yaml";
  std::ofstream(path)
      << "model: {path: m}\ndata: {train: t.jsonl}\nslurm:\n  nodes: 2\n  gpus_per_node: 8\n"
         "  partition: gpu\n  time: \"4:00:00\"\n  extra_args: [--exclusive]\n  requeue: false\n";
  auto spec = LoadSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(spec->slurm.has_value());
  EXPECT_EQ(spec->slurm->nodes, 2);
  EXPECT_EQ(spec->slurm->gpus_per_node, 8);
  EXPECT_EQ(spec->slurm->cpu_ranks_per_node, 1);
  EXPECT_EQ(spec->slurm->partition, "gpu");
  EXPECT_EQ(spec->slurm->account, "");
  EXPECT_EQ(spec->slurm->time, "4:00:00");
  EXPECT_EQ(spec->slurm->extra_args, std::vector<std::string>{"--exclusive"});
  EXPECT_FALSE(spec->slurm->requeue);
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ToJson(*again), ToJson(*spec));

  std::ofstream(path) << "model: {path: m}\ndata: {train: t.jsonl}\nslurm:\n  nodes: two\n";
  EXPECT_THAT(LoadSpecFile(path),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("slurm.yaml:4: field 'slurm.nodes': must be an integer")));
  std::ofstream(path) << "model: {path: m}\ndata: {train: t.jsonl}\nslurm: {node: 2}\n";
  EXPECT_THAT(LoadSpecFile(path),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("field 'slurm.node': unknown field (did you mean 'slurm.nodes'?)")));
  std::ofstream(path) << "model: {path: m}\ndata: {train: t.jsonl}\n";
  auto none = LoadSpecFile(path);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->slurm.has_value());
  EXPECT_FALSE(ToJson(*none).contains("slurm"));  // an older trainer still takes the spec
}

}  // namespace
}  // namespace sftctl
