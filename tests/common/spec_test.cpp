// JobSpec parsing: defaults, strictness, messages that name the field and the YAML line.
#include "common/spec/spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/spec/spec_fields.h"
#include "common/spec/spec_paths.h"
#include "common/spec/spec_yaml.h"
#include "common/spec/upload_to.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// `text` as `name` in this program's folder (removed at its exit, pass or fail; names are per test).
std::string TempFile(const std::string& name, const std::string& text) {
  static const std::string dir = ::sftctl::testing::MakeTempDir("spec-test");
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kMinimal = R"(model:
  config: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4}
data:
  train: data/train.jsonl
)";

TEST(Spec, DefaultsAndRelativePaths) {
  const std::string path = TempFile("minimal.yaml", kMinimal);
  auto spec = LoadSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::string dir = std::filesystem::path(path).parent_path().string();
  EXPECT_EQ(spec->name, "minimal");
  EXPECT_EQ(spec->output_dir, dir + "/runs/minimal");
  ASSERT_EQ(spec->data.train.size(), 1u);
  EXPECT_EQ(spec->data.train[0], dir + "/data/train.jsonl");
  EXPECT_EQ(spec->train.batch_size, 8);
  EXPECT_EQ(spec->train.grad_accum, 1);
  EXPECT_DOUBLE_EQ(spec->train.lr, 2e-4);
  EXPECT_EQ(spec->train.schedule, "cosine");
  EXPECT_EQ(spec->precision, "auto");
  EXPECT_EQ(spec->device, "auto");
  EXPECT_EQ(spec->resume, "auto");
  EXPECT_EQ(spec->checkpoint.keep, 2);
  EXPECT_EQ(spec->model.config["hidden_size"], 32);
}

TEST(Spec, CanonicalJsonRoundTrips) {
  auto spec =
      LoadSpecFile(TempFile("rt.yaml", std::string(kMinimal) + "train: {lr: 1.0e-3, grad_accum: 4}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ToJson(*again), ToJson(*spec));
  EXPECT_DOUBLE_EQ(again->train.lr, 1e-3);
  EXPECT_EQ(again->train.grad_accum, 4);
}

// A run folder's spec.json (RunSpecJson, written by `sftctl run` and the trainer) holds the paths of
// a spec given relative to the working directory (the demo's, `--set data.train=x.jsonl`, `-o runs/a`)
// as absolute ones, so that it reads back to the same files from its own folder: it used to join the
// run folder to them a second time (`inspect-data sftctl-runs/demo-X/spec.json` looked in
// sftctl-runs/demo-X/sftctl-runs/demo-X/data/train.jsonl).
TEST(Spec, RunSpecJsonReadsBackFromTheRunFolder) {
  auto spec = ParseSpec(nlohmann::json::parse(R"({
    "model": {"config": {"hidden_size": 32}}, "tokenizer": "byte", "output_dir": "runs/try1",
    "data": {"train": ["runs/try1/data/train.jsonl", "hf://datasets/o/n/t.jsonl", "/abs/e.jsonl"],
             "chat_template": "chatml"}})"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_EQ(spec->data.train[0], "runs/try1/data/train.jsonl") << "ParseSpec without a folder keeps it";
  auto text = RunSpecJson(*spec);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::string cwd = std::filesystem::current_path().string();
  const auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["output_dir"], cwd + "/runs/try1");
  EXPECT_EQ(j["data"]["train"], nlohmann::json({cwd + "/runs/try1/data/train.jsonl",
                                                "hf://datasets/o/n/t.jsonl", "/abs/e.jsonl"}));
  EXPECT_EQ(j["tokenizer"], "byte");
  EXPECT_EQ(j["data"]["chat_template"], "chatml");
  EXPECT_EQ(j["resume"], "auto");

  // Read back as a file in another folder, as `inspect-data RUN/spec.json` and `run RUN/spec.json` do.
  const std::string path = TempFile("run-spec.json", *text);
  auto again = LoadSpecFile(path);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->data.train, j["data"]["train"].get<std::vector<std::string>>());
  EXPECT_EQ(again->output_dir, cwd + "/runs/try1");
  EXPECT_EQ(ToJson(*again).dump(2) + "\n", *text) << "reading spec.json back changes nothing";
}

// examples/job.yaml, which the README's Usage section runs: it parses, its data files exist and are
// the ones shipped next to it, and it trains from scratch with the byte tokenizer (runs on a CPU).
TEST(Spec, ExampleJobSpecParsesWithItsShippedData) {
  const std::string dir = std::string(SFTCTL_SOURCE_DIR) + "/examples";
  auto spec = LoadSpecFile(dir + "/job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(CheckSpecFiles(*spec).ok()) << CheckSpecFiles(*spec).ToString();
  const std::string abs = std::filesystem::absolute(dir).lexically_normal().string();
  EXPECT_EQ(spec->name, "job");
  EXPECT_EQ(spec->data.train, std::vector<std::string>({abs + "/data/train.jsonl"}));
  EXPECT_EQ(spec->data.eval, std::vector<std::string>({abs + "/data/eval.jsonl"}));
  EXPECT_EQ(spec->output_dir, abs + "/runs/job");
  EXPECT_EQ(spec->tokenizer, "byte");
  EXPECT_TRUE(spec->model.path.empty());
  EXPECT_EQ(spec->model.config["hidden_size"], 128);
  EXPECT_EQ(spec->train.max_steps, 400);
  EXPECT_TRUE(spec->eval.exact_match);
}

TEST(Spec, DataChatTemplateAndPacking) {
  auto spec = LoadSpecFile(TempFile("defaults-chat.yaml", kMinimal));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.chat_template, "auto");
  EXPECT_FALSE(spec->data.packing);
  const std::string path = TempFile(
      "chat.yaml", std::string(kMinimal) + "  chat_template: templates/chat.jinja\n  packing: true\n");
  spec = LoadSpecFile(path);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::string dir = std::filesystem::path(path).parent_path().string();
  EXPECT_EQ(spec->data.chat_template, dir + "/templates/chat.jinja");  // a FILE resolves like paths
  EXPECT_TRUE(spec->data.packing);
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ToJson(*again), ToJson(*spec));
  spec = LoadSpecFile(TempFile("llama.yaml", std::string(kMinimal) + "  chat_template: llama3\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.chat_template, "llama3");  // a built-in name is not a path
  spec = LoadSpecFile(TempFile("badpack.yaml", std::string(kMinimal) + "  packing: 3\n"));
  EXPECT_THAT(
      spec, StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'data.packing': must be true or false")));
}

// The memory knobs: train.loss_chunk_tokens, train.skip_memory_check, lora.base_dtype.
TEST(Spec, MemoryKnobs) {
  auto spec = LoadSpecFile(TempFile("mem-default.yaml", std::string(kMinimal) + "lora: {}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->train.loss_chunk_tokens, 0);
  EXPECT_FALSE(spec->train.skip_memory_check);
  EXPECT_EQ(spec->lora->base_dtype, "auto");
  spec = LoadSpecFile(TempFile("mem.yaml", std::string(kMinimal) +
                                               "train: {loss_chunk_tokens: 256, skip_memory_check: true}\n"
                                               "lora: {base_dtype: bf16}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->train.loss_chunk_tokens, 256);
  EXPECT_TRUE(spec->train.skip_memory_check);
  EXPECT_EQ(spec->lora->base_dtype, "bf16");
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ToJson(*again), ToJson(*spec));
  EXPECT_EQ(again->lora->base_dtype, "bf16");
  EXPECT_EQ(again->train.loss_chunk_tokens, 256);
  const std::pair<std::string, std::string> bad[] = {
      {"train: {loss_chunk_tokens: -1}\n", "field 'train.loss_chunk_tokens': must be >= 0, got -1"},
      {"train: {skip_memory_check: yes please}\n", "field 'train.skip_memory_check': must be true or false"},
      {"lora: {base_dtype: fp16}\n", "field 'lora.base_dtype': must be one of auto, fp32, bf16, got 'fp16'"}};
  for (const auto& [yaml, error] : bad) {
    auto r = LoadSpecFile(TempFile("mem-bad.yaml", std::string(kMinimal) + yaml));
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, HasSubstr(error))) << yaml;
  }
}

TEST(Spec, TrainGradientCheckpointing) {
  auto spec = LoadSpecFile(TempFile("gc-default.yaml", kMinimal));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_FALSE(spec->train.gradient_checkpointing);
  spec = LoadSpecFile(TempFile("gc.yaml", std::string(kMinimal) + "train: {gradient_checkpointing: true}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->train.gradient_checkpointing);
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->train.gradient_checkpointing);
  spec =
      LoadSpecFile(TempFile("gc-bad.yaml", std::string(kMinimal) + "train: {gradient_checkpointing: 1}\n"));
  EXPECT_THAT(spec, StatusIs(StatusCode::kInvalidArgument,
                             HasSubstr("field 'train.gradient_checkpointing': must be true or false")));
}

TEST(Spec, UnknownFieldNamesFieldLineAndSuggestion) {
  auto spec =
      LoadSpecFile(TempFile("typo.yaml", std::string(kMinimal) + "train:\n  batch_size: 4\n  lrr: 0.1\n"));
  EXPECT_THAT(
      spec, StatusIs(StatusCode::kInvalidArgument,
                     HasSubstr("typo.yaml:7: field 'train.lrr': unknown field (did you mean 'train.lr'?)")));
}

TEST(Spec, UnknownTopLevelField) {
  auto spec = LoadSpecFile(TempFile("top.yaml", std::string(kMinimal) + "epochz: 3\n"));
  EXPECT_THAT(spec,
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("top.yaml:5: field 'epochz': unknown field")));
}

TEST(Spec, WrongTypeNamesField) {
  auto spec =
      LoadSpecFile(TempFile("type.yaml", std::string(kMinimal) + "train:\n  batch_size: \"eight\"\n"));
  EXPECT_THAT(spec,
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("type.yaml:6: field 'train.batch_size': must be an integer, got a string")));
}

TEST(Spec, QuotedNumberStaysString) {
  auto doc = YamlToJson("a: \"12\"\nb: 12\nc: 1.5e-3\nd: yes\ne: ~\n", "x.yaml");
  ASSERT_TRUE(doc.ok());
  EXPECT_TRUE(doc->value["a"].is_string());
  EXPECT_TRUE(doc->value["b"].is_number_integer());
  EXPECT_DOUBLE_EQ(doc->value["c"].get<double>(), 1.5e-3);
  EXPECT_EQ(doc->value["d"], "yes");  // YAML 1.2: only true/false are booleans
  EXPECT_TRUE(doc->value["e"].is_null());
  EXPECT_EQ(doc->lines.at("c"), 3);
}

TEST(Spec, RangeAndChoiceErrors) {
  auto s1 = LoadSpecFile(TempFile("range.yaml", std::string(kMinimal) + "train: {batch_size: 0}\n"));
  EXPECT_THAT(
      s1, StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'train.batch_size': must be >= 1, got 0")));
  auto s2 = LoadSpecFile(TempFile("choice.yaml", std::string(kMinimal) + "precision: fp8\n"));
  EXPECT_THAT(s2, StatusIs(StatusCode::kInvalidArgument,
                           HasSubstr("field 'precision': must be one of auto, fp32, bf16, fp16, got 'fp8'")));
}

TEST(Spec, DataMaxSamples) {
  auto spec = LoadSpecFile(TempFile("max-default.yaml", kMinimal));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.max_samples, 0);
  // Unset knobs stay out of the canonical JSON, so an older agent's trainer still takes it.
  EXPECT_FALSE(ToJson(*spec)["data"].contains("max_samples"));
  const std::string with = std::string(kMinimal) + "  max_samples: 100\n  max_eval_samples: 20\n";
  spec = LoadSpecFile(TempFile("max.yaml", with));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.max_samples, 100);
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->data.max_samples, 100);
  EXPECT_EQ(again->data.max_eval_samples, 20);
  spec = LoadSpecFile(TempFile("max-bad.yaml", std::string(kMinimal) + "  max_samples: -5\n"));
  EXPECT_THAT(spec, StatusIs(StatusCode::kInvalidArgument,
                             HasSubstr("max-bad.yaml:5: field 'data.max_samples': must be >= 0, got -5")));
}

TEST(Spec, LoraFieldsDefaultsAndRoundTrip) {
  auto none = LoadSpecFile(TempFile("nolora.yaml", kMinimal));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->lora.has_value());
  EXPECT_TRUE(ToJson(*none)["lora"].is_null());
  auto defaults = LoadSpecFile(TempFile("lora-default.yaml", std::string(kMinimal) + "lora: {}\n"));
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  ASSERT_TRUE(defaults->lora.has_value());
  EXPECT_EQ(defaults->lora->r, 8);
  EXPECT_DOUBLE_EQ(defaults->lora->alpha, 16);
  EXPECT_EQ(defaults->lora->target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  auto spec = LoadSpecFile(TempFile(
      "lora.yaml", std::string(kMinimal) +
                       "lora: {r: 4, alpha: 8, dropout: 0.05, target_modules: [q_proj, o_proj, down_proj], "
                       "use_rslora: true}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->lora->r, 4);
  EXPECT_DOUBLE_EQ(spec->lora->alpha, 8);
  EXPECT_DOUBLE_EQ(spec->lora->dropout, 0.05);
  EXPECT_TRUE(spec->lora->use_rslora);
  EXPECT_EQ(spec->lora->target_modules, (std::vector<std::string>{"q_proj", "o_proj", "down_proj"}));
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ToJson(*again), ToJson(*spec));
  auto all =
      LoadSpecFile(TempFile("lora-all.yaml", std::string(kMinimal) + "lora: {target_modules: all-linear}\n"));
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->lora->target_modules.size(), 7u);
}

TEST(Spec, LoraErrorsNameTheField) {
  auto err = [](const std::string& name, const std::string& lora) {
    return LoadSpecFile(TempFile(name, std::string(kMinimal) + "lora: " + lora + "\n")).status();
  };
  auto invalid = [](const std::string& what) {
    return StatusIs(StatusCode::kInvalidArgument, HasSubstr(what));
  };
  EXPECT_THAT(err("l1.yaml", "{r: 0}"), invalid("field 'lora.r': must be >= 1, got 0"));
  EXPECT_THAT(err("l2.yaml", "{alpha: 0}"), invalid("field 'lora.alpha': must be > 0"));
  EXPECT_THAT(err("l3.yaml", "{dropout: 1.5}"),
              invalid("field 'lora.dropout': must be in [0, 0.99], got 1.5"));
  EXPECT_THAT(err("l4.yaml", "{target_modules: [q_proj, lm_head]}"),
              invalid("field 'lora.target_modules': 'lm_head' is not a projection of llama/qwen2"));
  EXPECT_THAT(err("l5.yaml", "{target_modules: []}"),
              invalid("field 'lora.target_modules': must be a non-empty list"));
  EXPECT_THAT(err("l6.yaml", "{rank: 8}"), invalid("l6.yaml:5: field 'lora.rank': unknown field"));
  EXPECT_THAT(err("l7.yaml", "8"), invalid("field 'lora': must be a mapping"));
}

TEST(Spec, DistributedAndHostsDefaultsAndRoundTrip) {
  auto defaults = LoadSpecFile(TempFile("dist-default.yaml", kMinimal));
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_DOUBLE_EQ(defaults->distributed.timeout_s, 300);
  EXPECT_DOUBLE_EQ(defaults->distributed.bucket_mb, 25);
  EXPECT_TRUE(defaults->hosts.empty());
  const auto j = ToJson(*defaults);
  EXPECT_EQ(j["distributed"], (nlohmann::json{{"timeout_s", 300.0}, {"bucket_mb", 25.0}}));
  EXPECT_EQ(j["hosts"], nlohmann::json::array());

  auto spec = LoadSpecFile(TempFile(
      "dist.yaml",
      std::string(kMinimal) + "distributed: {timeout_s: 30, bucket_mb: 0.5}\nhosts: [gpu-a, gpu-b]\n"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_DOUBLE_EQ(spec->distributed.timeout_s, 30);
  EXPECT_DOUBLE_EQ(spec->distributed.bucket_mb, 0.5);
  EXPECT_EQ(spec->hosts, (std::vector<std::string>{"gpu-a", "gpu-b"}));
  auto again = ParseSpec(ToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ToJson(*again), ToJson(*spec));
  EXPECT_EQ(again->hosts, spec->hosts);
}

TEST(Spec, DistributedErrorsNameTheField) {
  auto err = [](const std::string& name, const std::string& extra) {
    return LoadSpecFile(TempFile(name, std::string(kMinimal) + extra + "\n")).status();
  };
  auto invalid = [](const std::string& what) {
    return StatusIs(StatusCode::kInvalidArgument, HasSubstr(what));
  };
  EXPECT_THAT(err("d1.yaml", "distributed: {timeout_s: 0}"),
              invalid("field 'distributed.timeout_s': must be in [1, 86400], got 0"));
  EXPECT_THAT(err("d2.yaml", "distributed: {bucket_mb: 0}"),
              invalid("field 'distributed.bucket_mb': must be > 0"));
  EXPECT_THAT(err("d3.yaml", "distributed: {timeout_s: soon}"),
              invalid("field 'distributed.timeout_s': must be a number, got a string"));
  EXPECT_THAT(
      err("d4.yaml", "distributed: {timeout: 30}"),
      invalid(
          "d4.yaml:5: field 'distributed.timeout': unknown field (did you mean 'distributed.timeout_s'?)"));
  EXPECT_THAT(err("d5.yaml", "distributed: 30"), invalid("field 'distributed': must be a mapping"));
  EXPECT_THAT(err("d6.yaml", "hosts: gpu-a"),
              invalid("field 'hosts': must be a list of host names, got a string"));
  EXPECT_THAT(err("d7.yaml", "hosts: [gpu-a, 3]"),
              invalid("field 'hosts': must list host names, found an integer"));
  EXPECT_THAT(err("d8.yaml", "hosts: [\"\"]"), invalid("field 'hosts': host names must not be empty"));
}

TEST(Spec, ModelNeedsExactlyOneSource) {
  auto spec = LoadSpecFile(TempFile("nomodel.yaml", "model: {}\ndata: {train: a.jsonl}\n"));
  EXPECT_THAT(spec, StatusIs(StatusCode::kInvalidArgument, HasSubstr("give exactly one of model.path")));
  auto missing = LoadSpecFile(TempFile("nodata.yaml", "model: {path: m}\n"));
  EXPECT_THAT(missing, StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'data': is required")));
}

TEST(Spec, DuplicateKeyAndInvalidYaml) {
  auto dup = LoadSpecFile(TempFile("dup.yaml", std::string(kMinimal) + "seed: 1\nseed: 2\n"));
  EXPECT_THAT(dup,
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("dup.yaml:6: field 'seed' is given twice")));
  auto bad = LoadSpecFile(TempFile("bad.yaml", "model: [unclosed\n"));
  EXPECT_THAT(
      bad, StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("bad.yaml:"), HasSubstr("invalid YAML"))));
}

TEST(Spec, MissingDataFileNamesFieldAndFile) {
  auto spec = LoadSpecFile(TempFile("nofile.yaml", kMinimal));
  ASSERT_TRUE(spec.ok());
  Status s = CheckSpecFiles(*spec);
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound, AllOf(HasSubstr("field 'data.train': file '"),
                                                       HasSubstr("data/train.jsonl' does not exist"))));
}

// The fields that may hold hf:// paths are the ones the table marks (SpecField::hub), and HubPaths
// reads them from the typed spec: no JSON pointer is written down anywhere else.
TEST(Spec, HubPathsAreTheFieldsTheTableMarks) {
  const std::vector<std::pair<std::string, SpecHub>> marked = {{"tokenizer", SpecHub::kTokenizer},
                                                               {"model.path", SpecHub::kModel},
                                                               {"data.train", SpecHub::kFile},
                                                               {"data.eval", SpecHub::kFile}};
  size_t hub_fields = 0;
  for (const SpecFieldRow& row : SpecFieldRows()) {
    const SpecField* f = FindSpecField(row.path);
    ASSERT_NE(f, nullptr) << row.path;
    if (f->hub == SpecHub::kNone) continue;
    ++hub_fields;
    EXPECT_TRUE(f->is_path) << row.path << ": only a path field holds an hf:// path";
  }
  EXPECT_EQ(hub_fields, marked.size());
  for (const auto& [path, what] : marked) EXPECT_EQ(FindSpecField(path)->hub, what) << path;

  auto spec = ParseSpec(nlohmann::json::parse(R"({
    "model": {"path": "hf://org/m@v1"}, "tokenizer": "hf://org/t", "resume": "never",
    "data": {"train": ["hf://datasets/o/d/a.jsonl", "/abs/b.jsonl", "hf://datasets/o/d/c.jsonl"],
             "eval": "hf://datasets/o/d/e.jsonl", "chat_template": "chatml"}})"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::vector<SpecHubPath> paths = HubPaths(*spec);
  std::vector<std::string> got;
  for (const SpecHubPath& p : paths) got.push_back(p.field + " " + p.json_pointer + " " + p.value);
  EXPECT_EQ(got, (std::vector<std::string>{"tokenizer /tokenizer hf://org/t",
                                           "model.path /model/path hf://org/m@v1",
                                           "data.train /data/train/0 hf://datasets/o/d/a.jsonl",
                                           "data.train /data/train/2 hf://datasets/o/d/c.jsonl",
                                           "data.eval /data/eval/0 hf://datasets/o/d/e.jsonl"}));
  JobSpec resolved = *spec;
  for (const SpecHubPath& p : paths)
    ASSERT_TRUE(ReplaceHubPath(&resolved, p, "/cache" + p.json_pointer).ok());
  EXPECT_TRUE(HubPaths(resolved).empty());
  EXPECT_EQ(resolved.data.train,
            (std::vector<std::string>{"/cache/data/train/0", "/abs/b.jsonl", "/cache/data/train/2"}));
  EXPECT_EQ(resolved.model.path, "/cache/model/path");
  EXPECT_THAT(ReplaceHubPath(&resolved, paths[0], "/again"),
              StatusIs(StatusCode::kInternal, "the spec holds no hf:// path at /tokenizer"));
  auto local = ParseSpec(nlohmann::json::parse(R"({"model": {"path": "/m"}, "data": {"train": "t.jsonl"}})"));
  ASSERT_TRUE(local.ok());
  EXPECT_TRUE(HubPaths(*local).empty());
}

// `--set` overrides go into the file's JSON before its one parse, and make the spec that applying them
// to the loaded spec's canonical JSON made (OverrideSpec): the file's relative paths mean its folder,
// an override's the working directory; a list left out of the file grows from its default.
TEST(Spec, OverridesApplyToTheFileBeforeItsOneParse) {
  const std::string path =
      TempFile("over.yaml", std::string(kMinimal) + "  eval: [e.jsonl]\nlora: {r: 4}\ntokenizer: tok\n");
  const std::string dir = std::filesystem::path(path).parent_path().string();
  auto loaded = LoadSpecFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"train.lr=1e-3", "name=renamed"},
      {"data.train+=more.jsonl", "data.eval=[x.jsonl, /abs/y.jsonl]", "output_dir=runs/here"},
      {"lora.target_modules+=o_proj", "resume=ckpt/checkpoint-000010", "data.chat_template=t.jinja"},
      {"lora.target_modules=all-linear", "lora.target_modules+=q_proj", "slurm.extra_args+=--exclusive"},
      {"lora=null", "model.config.hidden_size=64", "tokenizer=byte", "checkpoint.upload_to=s3://bkt/p"}};
  for (const auto& overrides : cases) {
    auto once = LoadSpecFile(path, overrides);
    ASSERT_TRUE(once.ok()) << ::testing::PrintToString(overrides) << ": " << once.status().ToString();
    auto round_trip = OverrideSpec(*loaded, overrides);
    ASSERT_TRUE(round_trip.ok()) << round_trip.status().ToString();
    EXPECT_EQ(ToJson(*once), ToJson(*round_trip)) << ::testing::PrintToString(overrides);
  }
  auto spec = LoadSpecFile(path, {"data.train+=more.jsonl", "name=renamed"});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data.train, (std::vector<std::string>{dir + "/data/train.jsonl", "more.jsonl"}));
  EXPECT_EQ(spec->tokenizer, dir + "/tok");
  EXPECT_EQ(spec->output_dir, dir + "/runs/over") << "the file's own output_dir, as before the rename";

  // A problem in an overridden field is the command line's; one in the file's own, the file's line.
  EXPECT_THAT(LoadSpecFile(path, {"train.lr=fast"}),
              StatusIs(StatusCode::kInvalidArgument,
                       "command line: field 'train.lr': must be a number, got a string"));
  EXPECT_THAT(
      LoadSpecFile(path, {"lora+={r: 0}"}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("command line: field 'lora.r': must be >= 1")));
  const std::string bad = TempFile("over-bad.yaml", std::string(kMinimal) + "seed: -1\n");
  EXPECT_THAT(
      LoadSpecFile(bad, {"train.lr=1e-3"}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("over-bad.yaml:5: field 'seed': must be >= 0")));
  EXPECT_TRUE(LoadSpecFile(bad, {"seed=3"}).ok()) << "an override may mend the file";
  EXPECT_THAT(LoadSpecFile(path, {"train.nope=1"}),
              StatusIs(StatusCode::kInvalidArgument, "--set: unknown field 'train.nope' (see docs/spec.md)"));
}

// A spec made in code (the demo's) with no override is returned as it is: no round trip.
TEST(Spec, OverrideSpecWithoutOverridesIsTheSpecItself) {
  JobSpec spec;
  spec.name = "made";
  spec.data.train = {"relative.jsonl"};
  spec.model.config = nlohmann::json::object();
  spec.train.batch_size = 0;  // not valid as a spec: a parse would refuse it
  auto same = OverrideSpec(spec, {});
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(ToJson(*same), ToJson(spec));
  EXPECT_THAT(OverrideSpec(spec, {"seed=2"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("command line: field 'train.batch_size'")));
}

// RunSpecJson makes the paths absolute on the type, as the parse it replaced (ParseSpec of the
// canonical JSON against the working directory) did: every path field, the values kept as written kept.
TEST(Spec, RunSpecJsonResolvesWhatTheParseResolved) {
  for (const char* text : {
           R"({"model": {"path": "m"}, "tokenizer": "tok", "resume": "ckpt/c-1", "output_dir": "o",
               "data": {"train": ["a.jsonl", "/b.jsonl"], "eval": "e.jsonl", "chat_template": "t.jinja"}})",
           R"({"model": {"path": "hf://o/m"}, "tokenizer": "auto", "resume": "s3://bkt/p",
               "data": {"train": "hf://datasets/o/d/a.jsonl", "chat_template": "auto"}, "lora": {}})",
           R"({"model": {"config": {}}, "tokenizer": "byte", "resume": "never", "name": "n",
               "data": {"train": "a.jsonl", "chat_template": "llama3"}, "slurm": {}})"}) {
    auto spec = ParseSpec(nlohmann::json::parse(text));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto reparsed = ParseSpec(ToJson(*spec), std::filesystem::current_path().string());
    ASSERT_TRUE(reparsed.ok()) << reparsed.status().ToString();
    auto written = RunSpecJson(*spec);
    ASSERT_TRUE(written.ok()) << written.status().ToString();
    EXPECT_EQ(*written, ToJson(*reparsed).dump(2) + "\n") << text;
  }
}

// checkpoint.upload_to's rules are written once (common/spec/upload_to.h): the spec's check accepts
// exactly what ReadUploadTo reads, which is what the S3 and Hub code read (ParseS3Url,
// ParseHubUploadTarget ask it too).
TEST(Spec, UploadToHasOneSetOfRules) {
  struct Case {
    std::string url;
    UploadTo::Kind kind;
    std::string problem;  // "" when it reads
  };
  const std::vector<Case> cases = {
      {"", UploadTo::Kind::kNone, ""},
      {"s3://bucket", UploadTo::Kind::kS3, ""},
      {"s3://my.bucket_1/runs/a/", UploadTo::Kind::kS3, ""},
      {"hf://org/name", UploadTo::Kind::kHub, ""},
      {"hf://org/name@v2", UploadTo::Kind::kHub, ""},
      {"s3://", UploadTo::Kind::kNone, "bucket name '' is not 3-63 of a-z 0-9 . - _"},
      {"s3:///p", UploadTo::Kind::kNone, "bucket name '' is not 3-63 of a-z 0-9 . - _"},
      {"s3://ab/p", UploadTo::Kind::kNone, "bucket name 'ab' is not 3-63 of a-z 0-9 . - _"},
      {"s3://bucket/a//b", UploadTo::Kind::kNone, "empty, '.' or '..' path segment"},
      {"s3://bucket/../b", UploadTo::Kind::kNone, "empty, '.' or '..' path segment"},
      {"s3://bucket/a\tb", UploadTo::Kind::kNone, "control character in the prefix"},
      {"hf://datasets/org/name", UploadTo::Kind::kNone,
       "not a model repository hf://ORG/NAME[@REVISION] without a path"},
      {"hf://org/name/sub", UploadTo::Kind::kNone,
       "not a model repository hf://ORG/NAME[@REVISION] without a path"},
      {"hf://org", UploadTo::Kind::kNone, "not a model repository hf://ORG/NAME[@REVISION] without a path"},
      {"hf://org/", UploadTo::Kind::kNone, "not a model repository hf://ORG/NAME[@REVISION] without a path"},
      {"gs://bucket/x", UploadTo::Kind::kNone, "neither s3:// nor hf://"},
  };
  for (const Case& c : cases) {
    StatusOr<UploadTo> read = ReadUploadTo(c.url);
    if (c.problem.empty()) {
      ASSERT_TRUE(read.ok()) << c.url << ": " << read.status().ToString();
      EXPECT_EQ(read->kind, c.kind) << c.url;
    } else {
      EXPECT_THAT(read, StatusIs(StatusCode::kInvalidArgument, c.problem)) << c.url;
    }
    nlohmann::json j = {{"model", {{"path", "/m"}}},
                        {"data", {{"train", "t.jsonl"}}},
                        {"checkpoint", {{"upload_to", c.url}}}};
    auto spec = ParseSpec(j);
    EXPECT_EQ(spec.ok(), c.problem.empty()) << c.url << ": " << spec.status().ToString();
    if (!c.problem.empty()) {
      EXPECT_THAT(spec, StatusIs(StatusCode::kInvalidArgument,
                                 "field 'checkpoint.upload_to': must be s3://BUCKET[/PREFIX] or "
                                 "hf://ORG/NAME[@REVISION] (a model repository), got '" +
                                     c.url + "'"));
    }
  }
  auto s3 = ReadUploadTo("s3://my.bucket_1/runs/a/");
  ASSERT_TRUE(s3.ok());
  EXPECT_EQ(s3->s3.bucket, "my.bucket_1");
  EXPECT_EQ(s3->s3.prefix, "runs/a");
  EXPECT_THAT(ReadS3Url("hf://org/name"), StatusIs(StatusCode::kInvalidArgument, "it must start with s3://"));
}

}  // namespace
}  // namespace sftctl
