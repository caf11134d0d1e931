// Phi-3 / Phi-3.5 / Phi-4 (model_type phi3): parity with the reference implementation of
// transformers' math (tests/reference/hf_reference.py, run by the hf_reference fixture into
// <build>/hf-reference) for the fused qkv_proj / gate_up_proj layout, partial rotary and longrope
// (both its factor sets), that longrope, its long factors, partial rotary and the window change
// the result, config errors that name the field, LoRA on PEFT's fused modules, the KV cache, the
// memory estimate's count, and a save/load round trip in the fused HF layout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "common/formats/safetensors.h"
#include "tests/trainer/hf_parity.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/generate.h"
#include "trainer/model/kv_cache.h"
#include "trainer/model/lora.h"
#include "trainer/model/model.h"
#include "trainer/training/memory_estimate.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::CheckParity;
using testing::ConfigError;
using testing::CopyWithConfig;
using testing::LoadReference;
using testing::LogitsOf;
using testing::MaxAbs;
using testing::Reference;

// ---- Parity -------------------------------------------------------------------------------

TEST(Phi3Parity, PlainFusedLayoutUntiedBf16) {
  CheckParity("phi3");
  Reference r = LoadReference("phi3");
  ASSERT_TRUE(r.model);
  const ModelConfig& c = r.model->config();
  EXPECT_TRUE(c.fused_projections);
  EXPECT_EQ(c.RotaryDim(), c.head_dim);
  EXPECT_FALSE(c.longrope());
}

TEST(Phi3Parity, PartialRotaryLongRopeSlidingWindowTiedF32) {
  CheckParity("phi3_longrope");
  Reference r = LoadReference("phi3_longrope");
  ASSERT_TRUE(r.model);
  const ModelConfig& c = r.model->config();
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.RotaryDim(), 12);
  EXPECT_TRUE(c.longrope());
  EXPECT_EQ(c.original_max_position_embeddings, 16);
  EXPECT_EQ(c.sliding_window, 7);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_NEAR(c.rope_scaling.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(16.0)), 1e-12);
  EXPECT_EQ(r.tensors.at("input_ids").size(1), 24);  // > 16: the long factors
  EXPECT_EQ(r.tensors.at("short_input_ids").size(1), 16);
}

// Without longrope, with the short factors where the long ones apply, with full rotary instead of
// partial, or without the window, the same weights miss the reference by far more than the
// tolerance, so the parity above checks each of them.
TEST(Phi3Parity, LongRopePartialRotaryAndWindowChangeTheLogits) {
  Reference r = LoadReference("phi3_longrope");
  ASSERT_TRUE(r.model);
  const ModelConfig& c = r.model->config();
  const torch::Tensor ids = r.tensors.at("input_ids"), ref = r.tensors.at("logits");
  ModelConfig no_longrope = c;
  no_longrope.rope_scaling = RopeScaling();
  ModelConfig short_only = c;
  short_only.rope_scaling.long_factor = c.rope_scaling.short_factor;
  ModelConfig no_window = c;
  no_window.sliding_window = 0;
  for (bool fused_on : {true, false}) {
    fused::SetEnabled(fused_on);
    for (auto& [what, ablated_config] : std::vector<std::pair<std::string, ModelConfig>>{
             {"longrope", no_longrope}, {"long factors", short_only}, {"sliding window", no_window}}) {
      CausalLM ablated = CopyWithConfig(r.model, ablated_config);
      EXPECT_GT(MaxAbs(LogitsOf(ablated, ids), ref), 1e-2) << what << " fused " << fused_on;
    }
    // Partial rotary: the same model without longrope, rotating 12 of 16 values vs all 16.
    ModelConfig full_rotary = no_longrope;
    full_rotary.partial_rotary_factor = 1.0;
    CausalLM partial = CopyWithConfig(r.model, no_longrope), full = CopyWithConfig(r.model, full_rotary);
    EXPECT_GT(MaxAbs(LogitsOf(partial, ids), LogitsOf(full, ids)), 1e-2)
        << "partial rotary fused " << fused_on;
  }
  fused::SetEnabled(true);
  // The factors follow the longest position, as transformers: explicit positions 0..23 take the
  // long ones like none, and the same 16 tokens at positions 8..23 do too (not the short ones).
  const torch::Tensor positions = torch::arange(24, torch::kInt64).unsqueeze(0).expand({3, 24});
  torch::NoGradGuard no_grad;
  EXPECT_LE(MaxAbs(r.model->Logits(r.model->Hidden(ids, positions)), ref), 1e-4);
  const torch::Tensor short_ids = r.tensors.at("short_input_ids");
  const torch::Tensor shifted = torch::arange(8, 24, torch::kInt64).unsqueeze(0).expand({3, 16});
  EXPECT_GT(MaxAbs(r.model->Logits(r.model->Hidden(short_ids, shifted)), r.tensors.at("short_logits")), 1e-2);
}

// The loss's gradients reach every parameter of the fused layout, finite.
TEST(Phi3Parity, FullFineTuneGradientsReachTheFusedProjections) {
  Reference r = LoadReference("phi3_longrope");
  ASSERT_TRUE(r.model);
  r.model->LossSum(r.tensors.at("input_ids"), r.tensors.at("labels")).backward();
  for (const auto& p : r.model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(p.value().grad().isfinite().all().item<bool>()) << p.key();
    EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0) << p.key();
  }
}

// ---- Config -------------------------------------------------------------------------------

// A Phi-4-mini-shaped config, tiny: partial rotary 0.75, longrope, 4 heads of 16.
json TinyPhi3() {
  return {{"model_type", "phi3"},
          {"architectures", {"Phi3ForCausalLM"}},
          {"vocab_size", 64},
          {"hidden_size", 64},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 32},
          {"original_max_position_embeddings", 8},
          {"partial_rotary_factor", 0.75},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"type", "longrope"},
            {"short_factor", {1.0, 1.5, 2.0, 3.0, 4.0, 6.0}},
            {"long_factor", {1.0, 2.0, 4.0, 8.0, 16.0, 32.0}}}},
          {"sliding_window", 6},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", true}};
}

TEST(Phi3Config, ReadsPhi3Keys) {
  auto c = ParseModelConfig(TinyPhi3(), "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->fused_projections);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->RotaryDim(), 12);
  EXPECT_EQ(c->sliding_window, 6);
  EXPECT_EQ(c->original_max_position_embeddings, 8);
  EXPECT_EQ(c->rope_scaling.type, "longrope");
  EXPECT_EQ(c->rope_scaling.long_factor.size(), 6u);
  EXPECT_NEAR(c->rope_scaling.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(8.0)), 1e-12);
  EXPECT_FALSE(c->UsesLongFactors(8));
  EXPECT_TRUE(c->UsesLongFactors(9));
  EXPECT_EQ(ArchitectureName("phi3"), "Phi3ForCausalLM");
  EXPECT_EQ(RopeInvFreq(*c).size(), 6u);
  // Long factors divide each frequency: inv_freq_long[i] * long[i] == inv_freq_short[i] * short[i].
  const std::vector<float> s = RopeInvFreq(*c, false), l = RopeInvFreq(*c, true);
  EXPECT_NEAR(l[5] * 32.0, s[5] * 6.0, 1e-6);
  // Phi3Config's defaults: full rotary, original 4096, no window; an attention_factor given is kept.
  json j = TinyPhi3();
  for (const char* key : {"partial_rotary_factor", "original_max_position_embeddings", "sliding_window"})
    j.erase(key);
  j["rope_scaling"] = nullptr;
  c = ParseModelConfig(j, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->RotaryDim(), 16);
  EXPECT_EQ(c->original_max_position_embeddings, 4096);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_FALSE(c->longrope());
  j = TinyPhi3();
  j["rope_scaling"]["attention_factor"] = 1.25;
  j["rope_scaling"]["rope_type"] = "longrope";
  EXPECT_EQ(ParseModelConfig(j, "cfg.json")->rope_scaling.attention_factor, 1.25);
  // max_position_embeddings == original: no scaling of cos/sin.
  j = TinyPhi3();
  j["original_max_position_embeddings"] = 32;
  EXPECT_EQ(ParseModelConfig(j, "cfg.json")->rope_scaling.attention_factor, 1.0);
}

TEST(Phi3Config, ErrorsNameTheField) {
  json j = TinyPhi3();
  j["rope_scaling"]["type"] = "yarn";
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'rope_scaling.type': 'yarn' is not supported for phi3 (default, longrope)");
  j = TinyPhi3();
  j["rope_scaling"].erase("type");
  j["rope_scaling"]["rope_type"] = "dynamic";
  EXPECT_EQ(
      ConfigError(j),
      "cfg.json: field 'rope_scaling.rope_type': 'dynamic' is not supported for phi3 (default, longrope)");
  j = TinyPhi3();
  j["rope_scaling"]["short_factor"] = {1.0, 2.0, 3.0, 4.0,
                                       5.0, 6.0, 7.0, 8.0};  // head_dim / 2, not rotary_dim / 2
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'rope_scaling.short_factor': has 8 entries, rotary_dim / 2 is 6 (head_dim 16 x "
            "partial_rotary_factor)");
  j = TinyPhi3();
  j["rope_scaling"]["long_factor"] = {1.0, 2.0};
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'rope_scaling.long_factor': has 2 entries, rotary_dim / 2 is 6 (head_dim 16 x "
            "partial_rotary_factor)");
  j = TinyPhi3();
  j["rope_scaling"].erase("long_factor");
  EXPECT_EQ(ConfigError(j), "cfg.json: field 'rope_scaling.long_factor': is required");
  j = TinyPhi3();
  j["rope_scaling"]["short_factor"][2] = "x";
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'rope_scaling.short_factor': must hold numbers > 0, found \"x\"");
  for (double bad : {0.0, -0.5, 1.5}) {
    j = TinyPhi3();
    j["partial_rotary_factor"] = bad;
    EXPECT_EQ(ConfigError(j),
              "cfg.json: field 'partial_rotary_factor': must be in (0, 1], got " + json(bad).dump());
  }
  j = TinyPhi3();
  j["partial_rotary_factor"] = 0.5625;  // 16 * 0.5625 = 9: odd
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(
      ConfigError(j),
      "cfg.json: field 'partial_rotary_factor': gives a rotary dimension of 9 (head_dim 16), which must "
      "be even and > 0");
  j = TinyPhi3();
  j["sliding_window"] = 0;
  EXPECT_EQ(ConfigError(j), "cfg.json: field 'sliding_window': must be > 0 or null, got 0");
  j = TinyPhi3();
  j["attention_bias"] = true;
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'attention_bias': true is not supported for phi3 (it has no biases)");
  j = TinyPhi3();
  j["hidden_act"] = "gelu";
  EXPECT_EQ(ConfigError(j), "cfg.json: field 'hidden_act': 'gelu' is not supported (silu)");
  j["model_type"] = "phi";
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'model_type': 'phi' is not supported (llama, qwen2, qwen3, mistral, gemma2, "
            "gemma3_text, phi3)");
  // longrope stays phi3's: other families keep their list.
  j = TinyPhi3();
  j["model_type"] = "llama";
  EXPECT_EQ(
      ConfigError(j),
      "cfg.json: field 'rope_scaling.rope_type': 'longrope' is not supported (default, llama3, linear)");
}

// ---- LoRA ---------------------------------------------------------------------------------

TEST(Phi3Lora, AdaptsPeftsFusedModulesWithOneAAndOneB) {
  ModelConfig c = *ParseModelConfig(TinyPhi3(), "cfg.json");
  torch::manual_seed(3);
  CausalLM model(c);
  LoraSpec spec;
  spec.r = 4;
  spec.alpha = 8;
  spec.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  EXPECT_EQ(LoraTargetsFor(spec.target_modules, c),
            std::vector<std::string>({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  ASSERT_TRUE(ApplyLora(model, spec).ok());
  auto params = model->named_parameters();
  const int64_t C = 64, QKV = (4 + 2 * 2) * 16, I = 48;
  EXPECT_EQ(params["model.layers.1.self_attn.qkv_proj.lora_A.weight"].sizes(), torch::IntArrayRef({4, C}));
  EXPECT_EQ(params["model.layers.1.self_attn.qkv_proj.lora_B.weight"].sizes(), torch::IntArrayRef({QKV, 4}));
  EXPECT_EQ(params["model.layers.1.mlp.gate_up_proj.lora_A.weight"].sizes(), torch::IntArrayRef({4, C}));
  EXPECT_EQ(params["model.layers.1.mlp.gate_up_proj.lora_B.weight"].sizes(), torch::IntArrayRef({2 * I, 4}));
  int64_t adapters = 0;
  for (const auto& p : params) {
    EXPECT_EQ(p.key().find("q_proj.lora"), std::string::npos) << p.key();
    const bool is_lora = p.key().find(".lora_") != std::string::npos;
    EXPECT_EQ(p.value().requires_grad(), is_lora) << p.key();
    if (is_lora) ++adapters;
  }
  EXPECT_EQ(adapters, 2 * 4 * 2);  // layers x modules x {A, B}
  // The memory estimate counts the same adapters and parameters as the model has.
  const ParameterCount count = CountParameters(c, spec);
  int64_t total = 0, trainable = 0;
  for (const auto& p : params) {
    total += p.value().numel();
    if (p.value().requires_grad()) trainable += p.value().numel();
  }
  EXPECT_EQ(count.total, total);
  EXPECT_EQ(count.trainable, trainable);

  // Non-zero B: the adapted forward equals the merged weights' (W + s B A over the fused output),
  // with fused CPU kernels and without.
  torch::NoGradGuard no_grad;
  for (auto& p : params) {
    if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0.0, 0.05);
  }
  const torch::Tensor ids = torch::randint(0, 64, {2, 11}, torch::kInt64);
  model->eval();
  const torch::Tensor adapted = LogitsOf(model, ids);
  Adapter a;
  a.spec = spec;
  NamedTensors base;
  for (const auto& p : params) {
    if (p.key().find(".lora_") != std::string::npos)
      a.tensors[p.key()] = p.value().clone();
    else
      base.emplace_back(p.key(), p.value().clone());
  }
  CausalLM unadapted(c);  // the base weights alone: the adapter must change the output
  unadapted->eval();
  {
    std::map<std::string, torch::Tensor> base_by_name(base.begin(), base.end());
    for (auto& p : unadapted->named_parameters()) p.value().copy_(base_by_name.at(p.key()));
  }
  EXPECT_GT(MaxAbs(adapted, LogitsOf(unadapted, ids)), 1e-3);
  ASSERT_TRUE(MergeAdapter(a, base).ok());
  CausalLM merged(c);
  merged->eval();
  std::map<std::string, torch::Tensor> by_name(base.begin(), base.end());
  for (auto& p : merged->named_parameters()) p.value().copy_(by_name.at(p.key()));
  for (bool fused_on : {true, false}) {
    fused::SetEnabled(fused_on);
    EXPECT_LT(MaxAbs(LogitsOf(model, ids), LogitsOf(merged, ids)), 1e-4) << fused_on;
  }
  fused::SetEnabled(true);
}

TEST(Phi3Lora, AdapterFilesFollowPeftsLayout) {
  ModelConfig c = *ParseModelConfig(TinyPhi3(), "cfg.json");
  CausalLM model(c);
  LoraSpec spec;  // the spec's default, q_proj and v_proj: PEFT's phi3 default, qkv_proj
  spec.r = 2;
  spec.alpha = 4;
  ASSERT_TRUE(ApplyLora(model, spec).ok());
  const std::string dir = sftctl::testing::MakeTempDir("phi3-adapter");
  ASSERT_TRUE(SaveAdapter(FileSystem::Default(), dir, model, spec, "base").ok());
  auto reader = safetensors::Reader::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(reader.ok());
  std::set<std::string> keys;
  for (const auto& t : (*reader)->tensors()) keys.insert(t.name);
  std::set<std::string> expected;
  for (int layer = 0; layer < 2; ++layer) {
    for (const char* ab : {"lora_A", "lora_B"}) {
      expected.insert("base_model.model.model.layers." + std::to_string(layer) + ".self_attn.qkv_proj." + ab +
                      ".weight");
    }
  }
  EXPECT_EQ(keys, expected);
  const json cfg = json::parse(std::ifstream(dir + "/adapter_config.json"));
  EXPECT_EQ(cfg.at("target_modules"), json({"qkv_proj"}));
  // PEFT's own phi3 adapter config reads back and applies.
  auto loaded = LoadAdapter(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->spec.target_modules, std::vector<std::string>({"qkv_proj"}));
  CausalLM again(c);
  ASSERT_TRUE(ApplyLora(again, loaded->spec).ok());
  EXPECT_TRUE(LoadAdapterInto(again, *loaded, dir).ok());
  json peft = AdapterConfigJson(spec, "base");
  peft["target_modules"] = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};
  auto parsed = ParseAdapterConfig(peft, "adapter_config.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  CausalLM all(c);
  ASSERT_TRUE(ApplyLora(all, *parsed).ok());
  EXPECT_TRUE(all->named_parameters().contains("model.layers.0.mlp.gate_up_proj.lora_B.weight"));
}

// A training checkpoint's adapter_config.json names the fused modules though the run's spec names
// llama's (the trainer maps the spec's LoraSpec to the model's modules with LoraSpecFor).
TEST(Phi3Lora, TrainingCheckpointAdapterConfigNamesTheFusedModules) {
  ModelConfig c = *ParseModelConfig(TinyPhi3(), "cfg.json");
  CausalLM model(c);
  LoraSpec spec;
  spec.target_modules = {"q_proj", "v_proj", "up_proj"};
  ASSERT_TRUE(ApplyLora(model, spec).ok());
  CheckpointContents contents;
  contents.config = ModelConfigToJson(c);
  contents.adapter = AdapterTensors(model);
  // As the trainer writes it (trainer.cpp: the spec's names mapped to the model's by LoraSpecFor).
  contents.adapter_config = AdapterConfigJson(LoraSpecFor(spec, c), "base");
  contents.state.step = 1;
  CheckpointManager manager(FileSystem::Default(), sftctl::testing::MakeTempDir("phi3-ckpt"), 2);
  auto dir = manager.Save(contents);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const json cfg = json::parse(std::ifstream(*dir + "/adapter_config.json"));
  EXPECT_EQ(cfg.at("target_modules"), json({"qkv_proj", "gate_up_proj"}));
  auto loaded = LoadAdapter(*dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  CausalLM again(c);
  ASSERT_TRUE(ApplyLora(again, loaded->spec).ok());
  EXPECT_TRUE(LoadAdapterInto(again, *loaded, *dir).ok());
}

// ---- Generation and saving ----------------------------------------------------------------

// The KV cache gives the logits of a full forward: full rotary (the fused CPU path) and partial
// rotary + longrope (long factors on every call: the prompt is past the switch point already) with
// a sliding window shorter than the sequence.
TEST(Phi3Model, CachedGenerationMatchesTheFullForward) {
  json plain = TinyPhi3();
  plain["partial_rotary_factor"] = 1.0;
  plain["rope_scaling"] = nullptr;
  plain["sliding_window"] = nullptr;
  for (const json& j : {plain, TinyPhi3()}) {
    ModelConfig c = *ParseModelConfig(j, "cfg.json");
    torch::manual_seed(4);
    CausalLM m(c);
    m->eval();
    torch::NoGradGuard no_grad;
    const int64_t T = 14, P = 9;
    const torch::Tensor ids = torch::randint(0, 64, {2, T}, torch::kInt64);
    const torch::Tensor full = m->Logits(m->Hidden(ids));
    KvCache cache(c.num_hidden_layers, {0, 0}, T, c.sliding_window, torch::kCPU);
    torch::Tensor step = m->Logits(m->HiddenCached(ids.slice(1, 0, P), cache));
    EXPECT_LT(MaxAbs(step, full.slice(1, 0, P)), 1e-5) << j.dump();
    for (int64_t t = P; t < T; ++t) {
      step = m->Logits(m->HiddenCached(ids.slice(1, t, t + 1), cache));
      EXPECT_LT(MaxAbs(step, full.slice(1, t, t + 1)), 1e-5) << "t " << t << " " << j.dump();
    }
  }
}

// Generation that grows past original_max_position_embeddings (8 here): from then on every position
// is rotated by longrope's long factors, so the keys cached with the short ones are stale. As
// transformers' Phi-3 generate does, the cache is rebuilt once at the crossing: the cached
// generation then gives the logits of the whole sequence run again at every step (use_cache false).
TEST(Phi3Model, GenerationCrossingTheOriginalLengthRebuildsTheCache) {
  ModelConfig c = *ParseModelConfig(TinyPhi3(), "cfg.json");
  ASSERT_TRUE(c.longrope());
  ASSERT_EQ(c.original_max_position_embeddings, 8);
  torch::manual_seed(9);
  CausalLM m(c);
  m->eval();
  torch::NoGradGuard no_grad;
  const std::vector<std::vector<int32_t>> prompts = {{3, 9, 27, 17, 51}, {5, 7, 11}};  // 5 + 10 > 8 + 1
  auto run = [&](bool use_cache) {
    GenerateOptions o;
    o.max_new_tokens = 10;
    o.use_cache = use_cache;
    std::vector<torch::Tensor> logits;
    o.on_logits = [&](const std::vector<size_t>&, const torch::Tensor& l) { logits.push_back(l.clone()); };
    const std::vector<Generation> g = Generate(m, prompts, o, DevicePlan{});
    return std::make_pair(g, logits);
  };
  const auto [cached, cached_logits] = run(true);
  const auto [full, full_logits] = run(false);
  ASSERT_EQ(cached_logits.size(), full_logits.size());
  ASSERT_EQ(cached_logits.size(), 10u);
  for (size_t k = 0; k < full_logits.size(); ++k)
    EXPECT_LT(MaxAbs(cached_logits[k], full_logits[k]), 1e-5) << "step " << k;
  for (size_t p = 0; p < prompts.size(); ++p) EXPECT_EQ(cached[p].tokens, full[p].tokens) << "prompt " << p;

  // The control: a cache extended past the crossing with its short-factor keys gives other logits
  // (by 3e-4 here, 30 times the bar above).
  const torch::Tensor ids = torch::randint(0, 64, {1, 12}, torch::kInt64);
  const torch::Tensor whole = m->Logits(m->Hidden(ids));
  KvCache stale(c.num_hidden_layers, {0}, 12, c.sliding_window, torch::kCPU);
  m->HiddenCached(ids.slice(1, 0, 8), stale);
  const torch::Tensor next = m->Logits(m->HiddenCached(ids.slice(1, 8, 9), stale));
  EXPECT_GT(MaxAbs(next, whole.slice(1, 8, 9)), 1e-4) << "the long factors change the cached keys' rotation";
}

TEST(Phi3Model, SaveAndLoadKeepTheFusedHfLayout) {
  for (const std::string family : {"phi3", "phi3_longrope"}) {
    const std::string src = testing::HfReferenceDir() + "/" + family;
    Reference r = LoadReference(family);
    ASSERT_TRUE(r.model);
    const std::string out = sftctl::testing::MakeTempDir("phi3-save") + "/" + family;
    const auto saved = testing::SaveAndListTensors(r.model, out);
    EXPECT_EQ(saved, testing::TensorShapes(src + "/model.safetensors")) << family;
    // Fused as the checkpoint has them: [(H + 2 KV) D, C] and [2 F, C], no q_proj.
    EXPECT_EQ(saved.at("model.layers.0.self_attn.qkv_proj.weight"),
              std::vector<int64_t>({(4 + 2 * 2) * 16, 64}));
    EXPECT_EQ(saved.at("model.layers.0.mlp.gate_up_proj.weight"), std::vector<int64_t>({2 * 80, 64}));
    EXPECT_TRUE(saved.count("model.layers.1.self_attn.qkv_proj.weight")) << family;
    EXPECT_TRUE(saved.count("model.layers.1.mlp.gate_up_proj.weight")) << family;
    EXPECT_FALSE(saved.count("model.layers.1.self_attn.q_proj.weight")) << family;
    const json cfg = json::parse(std::ifstream(out + "/config.json"));
    const json ref_cfg = json::parse(std::ifstream(src + "/config.json"));
    for (const char* key : {"architectures", "model_type", "partial_rotary_factor", "rope_scaling",
                            "original_max_position_embeddings", "max_position_embeddings", "sliding_window",
                            "tie_word_embeddings", "rope_theta", "hidden_act"}) {
      EXPECT_EQ(cfg.at(key), ref_cfg.at(key)) << family << " " << key;
    }
    EXPECT_EQ(cfg.at("architectures"), json({"Phi3ForCausalLM"}));
    auto back = LoadModelDir(out);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    CausalLM b = *back;
    const torch::Tensor ids = r.tensors.at("input_ids");
    EXPECT_TRUE(torch::equal(LogitsOf(b, ids), LogitsOf(r.model, ids))) << family;
  }
  // A longrope config built in code writes its rope_scaling.
  ModelConfig c = *ParseModelConfig(TinyPhi3(), "cfg.json");
  c.original = json::object();
  const json written = ModelConfigToJson(c);
  EXPECT_EQ(written.at("rope_scaling").at("type"), "longrope");
  EXPECT_EQ(written.at("rope_scaling").at("long_factor").size(), 6u);
  EXPECT_EQ(written.at("partial_rotary_factor"), 0.75);
  auto reparsed = ParseModelConfig(written, "written.json");
  ASSERT_TRUE(reparsed.ok()) << reparsed.status().ToString();
  EXPECT_EQ(reparsed->rope_scaling.short_factor, c.rope_scaling.short_factor);
}

}  // namespace
}  // namespace sftctl::trainer
