// SFT data: format detection, malformed-line errors (file:line + problem), loss masks, pad ==
// eos, truncation/dropped counts, the on-disk token cache (memory bounded by the index), and
// packing (same loss as unpacked).
#include "trainer/training/data.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "tests/trainer/test_util.h"
#include "tests/util/status_matchers.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using sftctl::testing::MakeTempDir;
using ::sftctl::testing::StatusIs;
using sftctl::testing::TinySpec;
using sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;

// A spec training on `jsonl` (written to dir/data/train.jsonl) with the byte tokenizer.
JobSpec SpecWith(const std::string& dir, const std::string& jsonl) {
  JobSpec s = TinySpec(dir, 1);
  WriteWholeFile(dir + "/data/train.jsonl", jsonl);
  s.data.eval.clear();
  return s;
}

Status LoadError(const std::string& jsonl, const std::string& format = "auto") {
  const std::string dir = MakeTempDir("data-err");
  JobSpec spec = SpecWith(dir, jsonl);
  spec.data.format = format;
  spec.data.chat_template = "chatml";
  ByteTokenizer tok;
  auto d = LoadDataset(spec, tok);
  return d.ok() ? OkStatus() : d.status();
}

TEST(DataFormat, MalformedLinesNameFileLineAndProblem) {
  const std::string ok_pc = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
  const std::string ok_chat =
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
      "\n";
  struct Case {
    std::string jsonl, format, expected;
  };
  const std::vector<Case> cases = {
      {ok_pc + "{\"prompt\": \"a\", \"completion\": \n", "auto", "train.jsonl:2: invalid JSON"},
      {ok_pc + "[1, 2]\n", "auto", "train.jsonl:2: each line must be a JSON object"},
      {ok_pc + "{\"input\": \"x\"}\n", "auto", "train.jsonl:2: cannot tell the format"},
      {ok_pc + "{\"text\": \"x\", \"prompt\": \"y\"}\n", "auto", "train.jsonl:2: ambiguous record"},
      {"{\"text\": \"x\"}\n" + ok_pc, "auto",
       "train.jsonl:2: record is 'prompt_completion' but the file is 'text' (formats cannot be mixed"},
      {ok_pc + ok_chat, "auto", "train.jsonl:2: record is 'messages' but the file is 'prompt_completion'"},
      {ok_pc, "text", "train.jsonl:1: record is 'prompt_completion' but data.format is 'text'"},
      {ok_pc + "{\"prompt\": \"a\"}\n", "auto", "train.jsonl:2: missing field 'completion'"},
      {ok_pc + "{\"prompt\": 3, \"completion\": \"b\"}\n", "auto",
       "train.jsonl:2: field 'prompt' must be a string"},
      {"{\"text\": null}\n", "auto", "train.jsonl:1: field 'text' must be a string"},
      {"{\"messages\": \"hi\"}\n", "auto", "train.jsonl:1: field 'messages' must be a list"},
      {"{\"messages\": []}\n", "auto", "train.jsonl:1: field 'messages' is empty"},
      {"{\"messages\": [\"hi\"]}\n", "auto", "train.jsonl:1: messages[0] must be an object"},
      {ok_chat + R"({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "a"}]})"
                 "\n",
       "auto", "train.jsonl:2: messages[0]: field 'role' must be system, user or assistant, got 'tool'"},
      {R"({"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]})"
       "\n",
       "auto", "train.jsonl:1: messages[0]: missing field 'content'"},
      {R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 5}]})"
       "\n",
       "auto", "train.jsonl:1: messages[1]: field 'content' must be a string"},
      {ok_chat + R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]})"
                 "\n",
       "auto", "train.jsonl:2: the conversation has no assistant message"},
      {"\n  \n", "auto", "train.jsonl' is empty"},
  };
  for (const auto& c : cases) {
    Status s = LoadError(c.jsonl, c.format);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.expected)));
  }
  EXPECT_TRUE(LoadError(ok_pc + "\n" + ok_pc).ok()) << "blank lines are skipped";
  EXPECT_TRUE(LoadError(ok_chat + ok_chat).ok());
}

TEST(DataFormat, MessagesWithoutAChatTemplateSayHowToChooseOne) {
  const std::string dir = MakeTempDir("data-notmpl");
  JobSpec spec = SpecWith(
      dir, R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"
           "\n");
  ByteTokenizer tok;
  auto d = LoadDataset(spec, tok);
  EXPECT_THAT(d, StatusIs(StatusCode::kFailedPrecondition,
                          HasSubstr("train.jsonl:1: 'messages' data needs a chat template")));
}

// Decoded trained tokens (positions >= 1) and untrained ones of one sample.
std::pair<std::string, std::string> Split(const SampleView& s) {
  std::string trained, rest;
  for (int64_t t = 0; t < s.size(); ++t) {
    const int32_t id = s.id(t);
    std::string piece = id == ByteTokenizer::kEndId ? "<END>" : std::string(1, static_cast<char>(id));
    (t > 0 && s.trained(t) ? trained : rest) += piece;
  }
  return {trained, rest};
}

TEST(DataMask, TextPromptCompletionAndChatML) {
  ByteTokenizer tok;
  const std::string dir = MakeTempDir("data-mask");
  JobSpec spec = SpecWith(dir, "{\"text\": \"abc\"}\n");
  auto d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(Split(d->train[0]), std::make_pair(std::string("bc<END>"), std::string("a")));
  EXPECT_EQ(d->train[0].prompt_len(), 0);

  WriteWholeFile(dir + "/data/train.jsonl", "{\"prompt\": \"Q?\", \"completion\": \"42\"}\n");
  d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(Split(d->train[0]), std::make_pair(std::string("42<END>"), std::string("Q?")));
  EXPECT_EQ(d->train[0].prompt_len(), 2);

  WriteWholeFile(dir + "/data/train.jsonl",
                 R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},)"
                 R"( {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},)"
                 R"( {"role": "assistant", "content": "A2"}]})"
                 "\n");
  spec.data.chat_template = "chatml";
  d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto [trained, rest] = Split(d->train[0]);
  EXPECT_EQ(trained, "A1<|im_end|>A2<|im_end|>");
  EXPECT_EQ(rest,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\n\n"
            "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n\n");

  spec.data.chat_template = "llama3";
  d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(Split(d->train[0]).first, "A1<|eot_id|>A2<|eot_id|>");
}

TEST(DataMask, PadEqualToEosKeepsTheEndTokenTrained) {
  ByteTokenizer tok;
  const std::string dir = MakeTempDir("data-pad");
  JobSpec spec = SpecWith(dir,
                          "{\"prompt\": \"a\", \"completion\": \"bcdef\"}\n"
                          "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  auto d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok());
  const int32_t eos = ByteTokenizer::kEndId;
  Batch b = Collate(d->train, {0, 1}, /*pad_id=*/eos);
  auto labels = b.labels.accessor<int64_t, 2>();
  auto ids = b.input_ids.accessor<int64_t, 2>();
  // Row 1: "a" "b" <END> then padding with the same id: the real end is a target, pads are not.
  EXPECT_EQ(ids[1][2], eos);
  EXPECT_EQ(labels[1][2], eos);
  for (int64_t t = 3; t < b.input_ids.size(1); ++t) {
    EXPECT_EQ(ids[1][t], eos);
    EXPECT_EQ(labels[1][t], kIgnoreLabel);
  }
  EXPECT_EQ(labels[0][6], eos);
  EXPECT_EQ(b.targets, 6 + 2);
}

TEST(DataStats, TruncatedAndDroppedAreCounted) {
  ByteTokenizer tok;
  const std::string dir = MakeTempDir("data-trunc");
  JobSpec spec = SpecWith(dir,
                          "{\"prompt\": \"0123456789\", \"completion\": \"x\"}\n"  // prompt fills: dropped
                          "{\"prompt\": \"01\", \"completion\": \"xyzxyzxyz\"}\n"  // truncated, kept
                          "{\"prompt\": \"01\", \"completion\": \"x\"}\n");        // as is
  spec.data.max_seq_len = 8;
  auto d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train_stats.samples, 3);
  EXPECT_EQ(d->train_stats.truncated, 2);
  EXPECT_EQ(d->train_stats.dropped, 1);
  ASSERT_EQ(d->train.size(), 2u);
  EXPECT_EQ(d->train[0].size(), 8);
  EXPECT_EQ(d->train_stats.tokens, 8 + 4);
  EXPECT_EQ(d->train_stats.trained_tokens, 6 + 2);

  // Nothing trainable at all is an error, not an empty run.
  WriteWholeFile(dir + "/data/train.jsonl", "{\"prompt\": \"0123456789\", \"completion\": \"x\"}\n");
  d = LoadDataset(spec, tok);
  EXPECT_THAT(
      d, StatusIs(StatusCode::kInvalidArgument, HasSubstr("no sample has a trainable token (all 1 dropped")));
}

TEST(DataLimits, MaxSamplesKeepsTheFirstKeptSamplesAndReadsNoFurther) {
  ByteTokenizer tok;
  const std::string dir = MakeTempDir("data-max");
  JobSpec spec = SpecWith(dir,
                          "{\"prompt\": \"0123456789\", \"completion\": \"x\"}\n"  // dropped: not counted
                          "{\"prompt\": \"a\", \"completion\": \"1\"}\n"
                          "{\"prompt\": \"b\", \"completion\": \"2\"}\n");
  spec.data.max_seq_len = 8;
  // The limit is reached on the second file's third record: its malformed fourth line is never
  // read, and the third file is not opened.
  WriteWholeFile(dir + "/data/more.jsonl",
                 "{\"prompt\": \"c\", \"completion\": \"3\"}\n{\"prompt\": \"d\", \"completion\": \"4\"}\n"
                 "{\"prompt\": \"e\", \"completion\": \"5\"}\nnot json\n");
  spec.data.train.push_back(dir + "/data/more.jsonl");
  spec.data.train.push_back(dir + "/data/absent.jsonl");
  spec.data.max_samples = 5;
  auto d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->train.size(), 5u);
  EXPECT_EQ(d->train_stats.samples, 6);  // records read, the dropped one included
  EXPECT_EQ(d->train_stats.dropped, 1);
  // The kept samples are the first five in file order: the last one is record "e" -> "5".
  EXPECT_EQ(tok.Decode(d->train[4].ids(), /*skip_special=*/true), "e5");
  EXPECT_EQ(tok.Decode(d->train[0].ids(), /*skip_special=*/true), "a1");

  // Without the limit the same files fail on the malformed line: the limit really stopped reading.
  spec.data.max_samples = 0;
  auto all = LoadDataset(spec, tok);
  EXPECT_THAT(all, StatusIs(StatusCode::kInvalidArgument, HasSubstr("more.jsonl:4")));
}

TEST(DataLimits, MaxEvalSamplesCapsTheEvalFiles) {
  ByteTokenizer tok;
  const std::string dir = MakeTempDir("data-max-eval");
  JobSpec spec = TinySpec(dir, 1);  // 96 train and 16 eval records
  spec.data.max_eval_samples = 4;
  auto d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->eval.size(), 4u);
  EXPECT_EQ(d->train.size(), 96u);
}

// Loads `spec` in a forked child and returns how much its peak RSS grew, in KiB (-1: the load
// failed). A child starts from the parent's pages, so earlier tests do not hide the growth.
long PeakRssGrowthOfLoadKb(const JobSpec& spec, const Tokenizer& tok) {
  int fds[2];
  if (::pipe(fds) != 0) return -3;
  const pid_t pid = ::fork();
  if (pid < 0) return -3;
  if (pid == 0) {
    struct rusage before, after;
    ::getrusage(RUSAGE_SELF, &before);
    auto d = LoadDataset(spec, tok);
    ::getrusage(RUSAGE_SELF, &after);
    long grown_kb = d.ok() ? after.ru_maxrss - before.ru_maxrss : -1;
    if (::write(fds[1], &grown_kb, sizeof(grown_kb)) != sizeof(grown_kb)) ::_exit(2);
    ::_exit(0);
  }
  ::close(fds[1]);
  long grown_kb = -2;
  if (::read(fds[0], &grown_kb, sizeof(grown_kb)) != static_cast<ssize_t>(sizeof(grown_kb))) grown_kb = -2;
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return grown_kb;
}

TEST(DataCache, OnlyTheIndexIsInMemory) {
  ByteTokenizer tok;
  const std::string dir = MakeTempDir("data-cache");
  std::string jsonl;
  const int n = 40000;
  const int text_bytes = 400;  // + END = 401 tokens, under the spec's 512
  for (int i = 0; i < n; ++i)
    jsonl += "{\"text\": \"" + std::string(text_bytes, static_cast<char>('a' + i % 26)) + "\"}\n";
  JobSpec spec = SpecWith(dir, jsonl);
  spec.data.eval_fraction = 0.1;
  const long grown_kb = PeakRssGrowthOfLoadKb(spec, tok);
  ASSERT_GE(grown_kb, 0) << "LoadDataset failed in the child";
  // The JSONL is ~16 MiB and its tokens ~64 MiB; holding either in RAM grows the peak RSS by at
  // least 16 MiB. What may grow is the per-sample index and split (~1 MiB here) plus buffers and
  // allocator arenas: about 4 MiB in all, measured with glibc 2.36 and 2.41.
  EXPECT_LT(grown_kb, 8 * 1024) << "peak RSS grew by " << grown_kb << " KiB";

  auto d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->train.size() + d->eval.size(), static_cast<size_t>(n));
  EXPECT_EQ(d->eval.size(), static_cast<size_t>(n / 10));
  const TokenCache* cache = d->train.cache();
  EXPECT_LE(cache->index_bytes(), sizeof(uint64_t) * (n + 1));
  EXPECT_EQ(cache->total_tokens(), static_cast<int64_t>(n) * (text_bytes + 1));
  EXPECT_EQ(std::filesystem::file_size(cache->path()), static_cast<uintmax_t>(cache->total_tokens()) * 4);
  EXPECT_EQ(cache->path(), spec.output_dir + "/data-cache/train.tokens");
}

// Also for qwen3 (q/k norms) and mistral, whose sliding window (16) is shorter than the samples
// (about 19 tokens), so it applies within each packed sample on top of the block mask, yet through
// two layers reaches back far enough that a missing block mask would leak into trained tokens.
class Packing : public ::testing::TestWithParam<std::string> {};

TEST_P(Packing, PackedLossEqualsUnpacked) {
  ByteTokenizer tok;
  const std::string dir = MakeTempDir("data-pack");
  JobSpec spec = TinySpec(dir, 1);
  spec.model.config["model_type"] = GetParam();
  if (GetParam() == "qwen3") spec.model.config["head_dim"] = 8;
  if (GetParam() == "mistral") spec.model.config["sliding_window"] = 16;
  spec.model.config["max_position_embeddings"] = 64;
  spec.data.max_seq_len = 64;
  auto d = LoadDataset(spec, tok);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  torch::manual_seed(3);
  auto model = BuildModel(spec, tok);
  ASSERT_TRUE(model.ok());
  CausalLM m = *model;
  torch::NoGradGuard g;
  const std::vector<int64_t> idx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  Batch plain = Collate(d->train, idx, ByteTokenizer::kPadId);
  Batch packed = Collate(d->train, idx, ByteTokenizer::kPadId, spec.data.max_seq_len);
  ASSERT_TRUE(packed.segments.defined() && packed.positions.defined());
  EXPECT_LT(packed.input_ids.size(0), plain.input_ids.size(0)) << "several samples share a row";
  EXPECT_LE(packed.input_ids.size(1), spec.data.max_seq_len);
  EXPECT_EQ(packed.targets, plain.targets);
  EXPECT_EQ(packed.tokens, plain.tokens);
  // Positions restart per sample.
  EXPECT_EQ(packed.positions[0][0].item<int64_t>(), 0);
  EXPECT_EQ(packed.positions[0][d->train[0].size()].item<int64_t>(), 0);
  const double a = m->LossSum(plain.input_ids, plain.labels).item<double>();
  const double b =
      m->LossSum(packed.input_ids, packed.labels, packed.positions, PackedAttentionMask(packed.segments))
          .item<double>();
  EXPECT_NEAR(a, b, 1e-5 * std::abs(a));
  // Without the block mask, attention would leak across samples and change the loss.
  const double leaky = m->LossSum(packed.input_ids, packed.labels, packed.positions).item<double>();
  EXPECT_GT(std::abs(leaky - a), 1e-4 * std::abs(a));
  if (GetParam() == "mistral") {
    // ... and the window changes the loss (it is not wider than the samples).
    JobSpec full = spec;
    full.model.config["sliding_window"] = nullptr;
    torch::manual_seed(3);
    CausalLM wide = *BuildModel(full, tok);
    const double unwindowed = wide->LossSum(plain.input_ids, plain.labels).item<double>();
    EXPECT_GT(std::abs(unwindowed - a), 1e-4 * std::abs(a));
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, Packing, ::testing::Values("llama", "qwen3", "mistral"));

TEST(PackingTraining, TrainingWithPackingRuns) {
  const std::string dir = MakeTempDir("data-pack-train");
  JobSpec spec = TinySpec(dir, 3);
  spec.data.packing = true;
  spec.model.config["max_position_embeddings"] = 64;
  spec.data.max_seq_len = 64;
  auto r = Train(spec, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->steps, 3);
  EXPECT_TRUE(std::isfinite(r->last_loss));
}

}  // namespace
}  // namespace sftctl::trainer
