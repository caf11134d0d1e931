// Generation: the KV cache against full recompute (tokens and per-step logits) for every
// model_type, batching with left padding, sampling and its seeds, stop ids and stop strings,
// and the prompt records of `generate --prompts` / `eval --generate`.
#include "trainer/model/generate.h"

#include <gtest/gtest.h>

#include <map>

#include "common/data/generation_prompts.h"
#include "tests/trainer/test_util.h"
#include "tests/util/status_matchers.h"
#include "trainer/model/kv_cache.h"
#include "trainer/model/sampling.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;

// A tiny random model of `model_type`: GQA (4 query heads over 2 KV heads), 2 layers; qwen2
// has q/k/v biases, qwen3 q/k norms and head_dim 12, mistral a sliding window of 5. The wider
// init (0.3) keeps greedy choices clear of near ties.
CausalLM TinyModel(const std::string& model_type, uint64_t seed = 1) {
  json cfg = {{"model_type", model_type}, {"vocab_size", 64},
              {"hidden_size", 32},        {"intermediate_size", 64},
              {"num_hidden_layers", 2},   {"num_attention_heads", 4},
              {"num_key_value_heads", 2}, {"max_position_embeddings", 96},
              {"initializer_range", 0.3}};
  if (model_type == "qwen3") cfg["head_dim"] = 12;
  if (model_type == "mistral") cfg["sliding_window"] = 5;
  auto c = ParseModelConfig(cfg, "test");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  torch::manual_seed(seed);
  CausalLM m(*c);
  m->eval();
  return m;
}

DevicePlan Cpu() { return DevicePlan{}; }

// Per prompt, the logits of each step (captured through on_logits).
using StepLogits = std::map<size_t, std::vector<torch::Tensor>>;

std::vector<Generation> Gen(CausalLM& m, const std::vector<std::vector<int32_t>>& prompts, GenerateOptions o,
                            StepLogits* logits = nullptr) {
  if (logits) {
    o.on_logits = [logits](const std::vector<size_t>& rows, const torch::Tensor& l) {
      for (size_t r = 0; r < rows.size(); ++r) (*logits)[rows[r]].push_back(l[r].clone());
    };
  }
  return Generate(m, prompts, o, Cpu());
}

double MaxDiff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, size_t steps) {
  double worst = 0;
  for (size_t k = 0; k < steps; ++k) worst = std::max(worst, (a[k] - b[k]).abs().max().item<double>());
  return worst;
}

class CacheVsRecompute : public ::testing::TestWithParam<std::string> {};

// 7 prompt tokens + 24 new ones: longer than mistral's window of 5 from the first step.
TEST_P(CacheVsRecompute, SameTokensAndLogitsEveryStep) {
  CausalLM m = TinyModel(GetParam());
  const std::vector<std::vector<int32_t>> prompt = {{3, 14, 15, 9, 26, 5, 35}};
  GenerateOptions o;
  o.max_new_tokens = 24;
  StepLogits cached, full;
  const auto a = Gen(m, prompt, o, &cached);
  o.use_cache = false;
  const auto b = Gen(m, prompt, o, &full);
  ASSERT_EQ(a[0].tokens.size(), 24u);
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  EXPECT_EQ(a[0].stop, StopReason::kLength);
  ASSERT_EQ(cached[0].size(), 24u);
  ASSERT_EQ(full[0].size(), 24u);
  // Relative to the logits' size: a few fp32 ulps apart (the kernels sum in another order; LibTorch
  // 2.6's attention differs from 1.13's in the last bits).
  const double scale = std::max(1.0, full[0][0].abs().max().item<double>());
  EXPECT_LT(MaxDiff(cached[0], full[0], 24), 1e-5 * scale) << "largest logit " << scale;
  // Not vacuous: the steps' logits differ from each other by far more than the tolerance.
  EXPECT_GT((cached[0][0] - cached[0][23]).abs().max().item<double>(), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(ModelTypes, CacheVsRecompute,
                         ::testing::Values("llama", "qwen2", "qwen3", "mistral"));

// The cache applies mistral's window: the same weights without it give other logits once the
// sequence is longer than the window.
TEST(KvCache, SlidingWindowChangesCachedLogits) {
  CausalLM windowed = TinyModel("mistral");
  ModelConfig c = windowed->config();
  c.sliding_window = 0;
  CausalLM full(c);
  {
    torch::NoGradGuard no_grad;
    auto from = windowed->named_parameters();
    for (auto& p : full->named_parameters()) p.value().copy_(from[p.key()]);
  }
  GenerateOptions o;
  o.max_new_tokens = 8;
  StepLogits a, b;
  Gen(windowed, {{3, 14, 15, 9, 26, 5, 35}}, o, &a);
  Gen(full, {{3, 14, 15, 9, 26, 5, 35}}, o, &b);
  EXPECT_GT((a[0][0] - b[0][0]).abs().max().item<double>(), 1e-3);
}

TEST(KvCache, LeftPadAttentionMaskAndPositions) {
  // Row 0 has 2 pad slots; queries in slots 3 and 4 of 5, window 2.
  auto [pos, mask] = LeftPadAttention(torch::tensor({2, 0}, torch::kInt64), 3, 2, 5, 2);
  EXPECT_TRUE(torch::equal(pos, torch::tensor({1, 2, 3, 4}, torch::kInt64).view({2, 2})));
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{2, 1, 2, 5}));
  const auto m = mask.to(torch::kInt64);
  // Slot 3 sees slots 2, 3 (window 2); slot 4 sees 3, 4. Pad slots 0, 1 of row 0 are never seen.
  EXPECT_TRUE(
      torch::equal(m[0][0], torch::tensor({0, 0, 1, 1, 0, 0, 0, 0, 1, 1}, torch::kInt64).view({2, 5})));
  EXPECT_TRUE(
      torch::equal(m[1][0], torch::tensor({0, 0, 1, 1, 0, 0, 0, 0, 1, 1}, torch::kInt64).view({2, 5})));
  // A pad slot's query sees only itself.
  auto [p2, m2] = LeftPadAttention(torch::tensor({2}, torch::kInt64), 0, 3, 3, 0);
  EXPECT_TRUE(torch::equal(m2.to(torch::kInt64)[0][0],
                           torch::tensor({1, 0, 0, 0, 1, 0, 0, 0, 1}, torch::kInt64).view({3, 3})));
  EXPECT_TRUE(torch::equal(p2, torch::tensor({0, 0, 0}, torch::kInt64).view({1, 3})));
}

class BatchedVsAlone : public ::testing::TestWithParam<std::string> {};

// Prompts of lengths 3, 9, 6 and 1 in one left-padded batch generate what each generates alone,
// with the cache and with recompute (mistral: the window crosses the padding).
TEST_P(BatchedVsAlone, SameTokensAndLogits) {
  CausalLM m = TinyModel(GetParam(), 7);
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 6, 7}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {40, 41, 42, 43, 44, 45}, {17}};
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "cache" : "recompute");
    GenerateOptions o;
    o.max_new_tokens = 12;
    o.use_cache = cache;
    StepLogits batched;
    const auto all = Gen(m, prompts, o, &batched);
    for (size_t i = 0; i < prompts.size(); ++i) {
      StepLogits alone;
      const auto one = Gen(m, {prompts[i]}, o, &alone);
      EXPECT_EQ(all[i].tokens, one[0].tokens) << "prompt " << i;
      // Relative to the logits' size, and looser than cache vs recompute: a batched row goes through
      // matmuls of other shapes (other blockings, other summation orders) and a softmax over padded
      // positions, so it lands some hundred fp32 ulps away (1.06e-5 absolute seen on a fresh machine).
      double scale = 1.0;
      for (const auto& step : alone[0]) scale = std::max(scale, step.abs().max().item<double>());
      EXPECT_LT(MaxDiff(batched[i], alone[0], 12), 5e-5 * scale)
          << "prompt " << i << ", largest logit " << scale;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ModelTypes, BatchedVsAlone, ::testing::Values("llama", "mistral"));

TEST(Sampling, SeedsTopPAndTopK) {
  CausalLM m = TinyModel("qwen2", 3);
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {9, 8}};
  GenerateOptions greedy;
  greedy.max_new_tokens = 16;
  const auto g = Gen(m, prompts, greedy);
  GenerateOptions hot = greedy;
  hot.sampling.temperature = 5.0;
  hot.seed = 11;
  const auto a = Gen(m, prompts, hot), b = Gen(m, prompts, hot);
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  EXPECT_EQ(a[1].tokens, b[1].tokens);
  EXPECT_NE(a[0].tokens, g[0].tokens);
  hot.seed = 12;
  const auto c = Gen(m, prompts, hot);
  EXPECT_NE(a[0].tokens, c[0].tokens);
  EXPECT_NE(a[1].tokens, c[1].tokens);
  // A prompt's samples do not depend on its batch: prompt 1 alone is sampled with seed + 1.
  hot.seed = 13;
  EXPECT_EQ(Gen(m, {prompts[1]}, hot)[0].tokens, c[1].tokens);
  // top_p tiny and top_k 1 leave the most likely token only.
  GenerateOptions nucleus = hot;
  nucleus.sampling.top_p = 1e-6;
  const auto p = Gen(m, prompts, nucleus);
  EXPECT_EQ(p[0].tokens, g[0].tokens);
  EXPECT_EQ(p[1].tokens, g[1].tokens);
  GenerateOptions topk = hot;
  topk.sampling.top_k = 1;
  EXPECT_EQ(Gen(m, prompts, topk)[0].tokens, g[0].tokens);
}

TEST(Sampling, TokenSamplerFrequenciesAndFilters) {
  // probabilities 0.1, 0.6, 0.3
  const torch::Tensor logits = torch::log(torch::tensor({0.1f, 0.6f, 0.3f}));
  std::vector<int> counts(3, 0);
  TokenSampler plain({1.0, 1.0, 0}, 5);
  for (int i = 0; i < 6000; ++i) ++counts[plain.Next(logits)];
  EXPECT_NEAR(counts[0] / 6000.0, 0.1, 0.02);
  EXPECT_NEAR(counts[1] / 6000.0, 0.6, 0.02);
  EXPECT_NEAR(counts[2] / 6000.0, 0.3, 0.02);
  // top_p 0.8 keeps {1, 2} (0.6 + 0.3 >= 0.8), renormalised to 2/3 and 1/3.
  counts.assign(3, 0);
  TokenSampler nucleus({1.0, 0.8, 0}, 5);
  for (int i = 0; i < 6000; ++i) ++counts[nucleus.Next(logits)];
  EXPECT_EQ(counts[0], 0);
  EXPECT_NEAR(counts[1] / 6000.0, 2.0 / 3, 0.02);
  // top_k 2 keeps {1, 2} as well; greedy takes 1.
  TokenSampler topk({1.0, 1.0, 2}, 5);
  for (int i = 0; i < 500; ++i) EXPECT_NE(topk.Next(logits), 0);
  TokenSampler greedy({0.0, 1.0, 0}, 5);
  EXPECT_EQ(greedy.Next(logits), 1);
}

TEST(Stops, EosAndStopStringEndWithTheirReason) {
  CausalLM m = TinyModel("llama", 5);
  const std::vector<std::vector<int32_t>> prompt = {{10, 20, 30}};
  GenerateOptions o;
  o.max_new_tokens = 20;
  const std::vector<int32_t> free_run = Gen(m, prompt, o)[0].tokens;
  ASSERT_EQ(free_run.size(), 20u);
  // EOS: the 6th token's id ends the run where that id first occurs, and is kept as the last token.
  const int32_t eos = free_run[5];
  const size_t first = std::find(free_run.begin(), free_run.end(), eos) - free_run.begin();
  o.stop_ids = {eos};
  const Generation e = Gen(m, prompt, o)[0];
  EXPECT_EQ(e.stop, StopReason::kEos);
  EXPECT_EQ(e.tokens, std::vector<int32_t>(free_run.begin(), free_run.begin() + first + 1));
  // A stop string made of the text of tokens 8 and 9 ends the run where it first occurs.
  o.stop_ids.clear();
  o.detokenize = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>('0' + id);
    return s;
  };
  const std::string text = o.detokenize(free_run);
  const std::string stop = text.substr(8, 2);
  o.stop_strings = {stop};
  const Generation s = Gen(m, prompt, o)[0];
  EXPECT_EQ(s.stop, StopReason::kStop);
  EXPECT_EQ(s.tokens.size(), text.find(stop) + 2);
  EXPECT_EQ(CutAtStopString(o.detokenize(s.tokens), {stop}), text.substr(0, text.find(stop)));
  EXPECT_EQ(CutAtStopString("abcXYdefXY", {"def", "Y"}), "abcX");
  EXPECT_EQ(Gen(m, prompt, GenerateOptions{})[0].stop, StopReason::kLength);
}

// ---- Prompt records (common/data/generation_prompts.h) -------------------------------------------

TEST(Prompts, ChatRenderingIdsReferencesAndErrors) {
  testing::TempDir dir("gen-prompts");
  // A model folder's tokenizer_config.json with a chat template; the byte tokenizer encodes it.
  testing::WriteWholeFile(dir.path() + "/tokenizer_config.json",
                          json{{"chat_template",
                                "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                                "{% if add_generation_prompt %}<assistant>{% endif %}"}}
                              .dump());
  ByteTokenizer tok;
  PromptOptions opt;
  opt.chat = true;
  opt.system = "Be brief";
  opt.tokenizer_dir = dir.path();
  PromptReader reader(tok, opt);
  auto p = reader.FromText("Hi", "--prompt");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->text, "<system>Be brief<user>Hi<assistant>");
  EXPECT_EQ(p->ids, tok.Encode("<system>Be brief<user>Hi<assistant>"));
  // A conversation's final assistant turn is its reference; a given system message is kept.
  auto c = reader.FromRecord(
      json::parse(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                                   {"role": "assistant", "content": "A"}]})"),
      "f.jsonl:1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->text, "<system>S<user>Q<assistant>");
  EXPECT_EQ(c->reference, "A");
  // Plain prompts with a completion as reference.
  PromptReader plain(tok, PromptOptions{});
  auto q = plain.FromRecord(json::parse(R"({"prompt": "2+2=", "completion": "4"})"), "f.jsonl:2");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->text, "2+2=");
  EXPECT_EQ(q->reference, "4");
  EXPECT_THAT(
      plain.FromRecord(json::parse(R"({"text": "x"})"), "f.jsonl:3").status(),
      testing::StatusIs(StatusCode::kInvalidArgument, "f.jsonl:3: needs field 'prompt' or 'messages'"));
  EXPECT_THAT(plain.FromRecord(json::parse(R"({"prompt": ""})"), "f.jsonl:4").status(),
              testing::StatusIs(StatusCode::kInvalidArgument, "f.jsonl:4: the prompt is empty"));
  PromptOptions need;
  need.need_reference = true;
  PromptReader scoring(tok, need);
  EXPECT_THAT(
      scoring.FromRecord(json::parse(R"({"prompt": "x"})"), "f.jsonl:5").status(),
      testing::StatusIs(StatusCode::kInvalidArgument,
                        "f.jsonl:5: no reference to score against (field 'reference', 'completion' or a "
                        "final assistant message)"));
  testing::WriteWholeFile(dir.path() + "/p.jsonl", "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"\n");
  EXPECT_THAT(
      plain.ReadFile(dir.path() + "/p.jsonl").status(),
      testing::StatusIs(StatusCode::kInvalidArgument, ::testing::StartsWith(dir.path() + "/p.jsonl:3: ")));
}

}  // namespace
}  // namespace sftctl::trainer
