// Gemma 2 and Gemma 3 (text): parity with the reference implementation of transformers' math
// (tests/reference/hf_reference.py, run by the hf_reference fixture into <build>/hf-reference),
// that soft-capping and the per-layer windows change the result, config errors that name the
// field, LoRA's target names, the KV cache, and a save/load round trip in the HF layout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "common/formats/safetensors.h"
#include "tests/trainer/hf_parity.h"
#include "tests/trainer/test_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/kv_cache.h"
#include "trainer/model/lora.h"
#include "trainer/model/model.h"
#include "trainer/tools/gguf_export.h"
#include "trainer/tools/hf_tools.h"
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

TEST(GemmaParity, Gemma2SoftCapsSlidingWindowTiedF32) { CheckParity("gemma2"); }
TEST(GemmaParity, Gemma3QkNormLocalRopeLinearScalingUntiedBf16) { CheckParity("gemma3_text"); }
TEST(GemmaParity, Gemma3NestedRopeParametersLayerTypesF32) { CheckParity("gemma3_nested"); }

// Without the soft-caps or the window the same weights miss the reference by far more than the
// tolerance, so the parity above checks each of them.
TEST(GemmaParity, SoftCapsAndWindowChangeTheLogits) {
  Reference r = LoadReference("gemma2");
  ASSERT_TRUE(r.model);
  const ModelConfig& c = r.model->config();
  ASSERT_EQ(c.attn_logit_softcapping, 2.0);
  ASSERT_EQ(c.final_logit_softcapping, 3.0);
  ASSERT_EQ(c.sliding_window, 5);
  ASSERT_EQ(c.sliding_layers, std::vector<bool>({true, false, true}));  // the even layers, as transformers
  std::vector<std::pair<std::string, ModelConfig>> ablations(3, {"", c});
  ablations[0].first = "attention soft-cap";
  ablations[0].second.attn_logit_softcapping = 0;
  ablations[1].first = "final soft-cap";
  ablations[1].second.final_logit_softcapping = 0;
  ablations[2].first = "sliding window";
  ablations[2].second.sliding_window = 0;
  for (auto& [what, ablated_config] : ablations) {
    CausalLM ablated = CopyWithConfig(r.model, ablated_config);
    for (bool fused_on : {true, false}) {
      fused::SetEnabled(fused_on);
      torch::NoGradGuard no_grad;
      const torch::Tensor logits = ablated->Logits(ablated->Hidden(r.tensors.at("input_ids")));
      EXPECT_GT(MaxAbs(logits, r.tensors.at("logits")), 1e-2) << what << " fused " << fused_on;
    }
    fused::SetEnabled(true);
  }
  // The final cap bounds the logits.
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = r.model->Logits(r.model->Hidden(r.tensors.at("input_ids")));
  EXPECT_LT(logits.abs().max().item<double>(), 3.0);
}

// The chunked loss head's backward through the soft-cap equals autograd's through the plain path.
TEST(GemmaParity, ChunkedSoftCappedLossGradientsMatchThePlainPath) {
  Reference r = LoadReference("gemma2");
  ASSERT_TRUE(r.model);
  const torch::Tensor ids = r.tensors.at("input_ids"), labels = r.tensors.at("labels");
  std::vector<torch::Tensor> grads[2];
  for (int i = 0; i < 2; ++i) {
    r.model->SetLossChunkTokens(i == 0 ? 0 : 7);
    r.model->zero_grad();
    r.model->LossSum(ids, labels).backward();
    for (const auto& p : r.model->parameters()) grads[i].push_back(p.grad().clone());
  }
  r.model->SetLossChunkTokens(0);
  for (size_t k = 0; k < grads[0].size(); ++k) {
    EXPECT_TRUE(torch::allclose(grads[0][k], grads[1][k], 1e-4, 1e-5)) << k;
  }
}

// ---- Config -------------------------------------------------------------------------------

json TinyGemma(const std::string& type) {
  return {{"model_type", type},
          {"vocab_size", 64},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 4},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 8},
          {"max_position_embeddings", 32},
          {"sliding_window", 4},
          {"query_pre_attn_scalar", 8}};
}

TEST(GemmaConfig, DefaultsFollowTransformers) {
  json j = TinyGemma("gemma2");
  for (const char* key : {"head_dim", "query_pre_attn_scalar", "sliding_window"}) j.erase(key);
  auto c = ParseModelConfig(j, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->query_pre_attn_scalar, 256);
  EXPECT_EQ(c->attn_logit_softcapping, 50);
  EXPECT_EQ(c->final_logit_softcapping, 30);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->sliding_layers, std::vector<bool>({true, false, true, false}));
  EXPECT_EQ(ArchitectureName("gemma2"), "Gemma2ForCausalLM");
  json g3 = TinyGemma("gemma3_text");
  g3["num_hidden_layers"] = 7;
  c = ParseModelConfig(g3, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->attn_logit_softcapping, 0);
  EXPECT_EQ(c->final_logit_softcapping, 0);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_local_theta, 1e4);
  EXPECT_EQ(c->sliding_layers, std::vector<bool>({true, true, true, true, true, false, true}));  // pattern 6
  EXPECT_EQ(ArchitectureName("gemma3_text"), "Gemma3ForCausalLM");
}

TEST(GemmaConfig, ErrorsNameTheField) {
  json j = TinyGemma("gemma2");
  j["layer_types"] = {"sliding_attention", "full_attention", "chunked_attention", "full_attention"};
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'layer_types': \"chunked_attention\" is not supported (sliding_attention, "
            "full_attention)");
  j["layer_types"] = {"sliding_attention"};
  EXPECT_EQ(ConfigError(j), "cfg.json: field 'layer_types': has 1 entries, num_hidden_layers is 4");
  j.erase("layer_types");
  j["hidden_activation"] = "gelu";
  EXPECT_EQ(ConfigError(j),
            "cfg.json: field 'hidden_activation': 'gelu' is not supported (gelu_pytorch_tanh)");
  j.erase("hidden_activation");
  j["hidden_act"] = "gelu";  // transformers' Gemma ignores hidden_act
  EXPECT_EQ(ConfigError(j), "ok");
  j["attn_logit_softcapping"] = -1.0;
  EXPECT_EQ(ConfigError(j), "cfg.json: field 'attn_logit_softcapping': must be > 0 or null, got -1.0");
  j["attn_logit_softcapping"] = nullptr;
  EXPECT_EQ(ParseModelConfig(j, "cfg.json")->attn_logit_softcapping, 0);
  json g3 = TinyGemma("gemma3_text");
  g3["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  EXPECT_EQ(ConfigError(g3),
            "cfg.json: field 'rope_scaling.rope_type': 'yarn' is not supported (default, llama3, linear)");
  g3.erase("rope_scaling");
  g3["rope_parameters"] = {{"full_attention", {{"rope_type", "dynamic"}, {"factor", 2.0}}}};
  EXPECT_EQ(
      ConfigError(g3),
      "cfg.json: field 'rope_parameters.full_attention.rope_type': 'dynamic' is not supported (default, "
      "llama3, linear)");
  g3["rope_parameters"] = {{"global_attention", {{"rope_type", "default"}}}};
  EXPECT_EQ(ConfigError(g3),
            "cfg.json: field 'rope_parameters': 'global_attention' is not a layer type (sliding_attention, "
            "full_attention)");
  g3.erase("rope_parameters");
  g3["use_bidirectional_attention"] = true;
  EXPECT_EQ(ConfigError(g3),
            "cfg.json: field 'use_bidirectional_attention': true is not supported (an encoder, not a causal "
            "language model)");
  json llama = TinyGemma("llama");
  llama["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
  EXPECT_EQ(
      ConfigError(llama),
      "cfg.json: field 'rope_parameters': per-layer-type RoPE (full_attention / sliding_attention) is read "
      "for gemma3_text only");
  // A Gemma 3 vision checkpoint (4B and larger): its text tower's errors name text_config's fields.
  json vision = {{"model_type", "gemma3"}, {"text_config", TinyGemma("gemma3_text")}};
  EXPECT_EQ(ConfigError(vision), "ok");
  vision["text_config"].erase("hidden_size");
  EXPECT_EQ(ConfigError(vision), "cfg.json: field 'text_config.hidden_size': is required");
  vision["text_config"] = TinyGemma("gemma3_text");
  vision["text_config"]["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 8.0}};
  EXPECT_EQ(ConfigError(vision),
            "cfg.json: field 'text_config.rope_scaling.rope_type': 'yarn' is not supported (default, llama3, "
            "linear)");
  vision["text_config"] = TinyGemma("llama");
  EXPECT_EQ(ConfigError(vision),
            "cfg.json: field 'text_config.model_type': \"llama\" is not supported (gemma3_text)");
  vision["text_config"] = "gemma3_text";
  EXPECT_EQ(ConfigError(vision), "cfg.json: field 'text_config': must be an object, got \"gemma3_text\"");
  vision.erase("text_config");
  EXPECT_EQ(ConfigError(vision),
            "cfg.json: field 'text_config': is required for model_type 'gemma3' "
            "(Gemma3ForConditionalGeneration: the text model's config)");
}

// text_config with only the sizes takes Gemma3TextConfig's defaults; ids and tying come from the top
// level when text_config lacks them (tie_word_embeddings: the top level rules, default true).
TEST(GemmaConfig, VisionCheckpointReadsItsTextConfig) {
  json text = TinyGemma("gemma3_text");
  for (const char* key : {"model_type", "head_dim", "query_pre_attn_scalar", "sliding_window"})
    text.erase(key);
  json j = {{"model_type", "gemma3"},   {"architectures", {"Gemma3ForConditionalGeneration"}},
            {"text_config", text},      {"vision_config", {{"hidden_size", 8}}},
            {"mm_tokens_per_image", 4}, {"eos_token_id", json::array({1, 6})}};
  auto c = ParseModelConfig(j, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model_type, "gemma3_text");
  EXPECT_EQ(c->wrapper.model_type, "gemma3");
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>({1, 6}));
  EXPECT_EQ(ArchitectureName("gemma3"), "Gemma3ForConditionalGeneration");
  // Written back as the wrapper: top level unchanged but torch_dtype, text_config with its tower's keys.
  const json out = ModelConfigToJson(*c, "bfloat16");
  EXPECT_EQ(out.at("architectures"), j.at("architectures"));
  EXPECT_EQ(out.at("model_type"), "gemma3");
  EXPECT_EQ(out.at("vision_config"), j.at("vision_config"));
  EXPECT_EQ(out.at("eos_token_id"), j.at("eos_token_id"));
  EXPECT_EQ(out.at("torch_dtype"), "bfloat16");
  EXPECT_EQ(out.at("text_config").at("model_type"), "gemma3_text");
  EXPECT_EQ(out.at("text_config").at("head_dim"), 256);
  for (const char* key : {"architectures", "eos_token_id", "tie_word_embeddings"})
    EXPECT_FALSE(out.at("text_config").contains(key)) << key;
  auto again = ParseModelConfig(out, "cfg.json");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->sliding_layers, c->sliding_layers);
  j["tie_word_embeddings"] = false;
  j["text_config"]["tie_word_embeddings"] = true;
  EXPECT_FALSE(ParseModelConfig(j, "cfg.json")->tie_word_embeddings);
  j.erase("tie_word_embeddings");
  j["text_config"]["tie_word_embeddings"] = false;
  EXPECT_FALSE(ParseModelConfig(j, "cfg.json")->tie_word_embeddings);
}

// ---- Training, LoRA, generation, saving --------------------------------------------------

TEST(GemmaModel, FullFineTuneAndLoraTrainTheirParameters) {
  for (const std::string type : {"gemma2", "gemma3_text"}) {
    auto c = ParseModelConfig(TinyGemma(type), "cfg.json");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    torch::manual_seed(1);
    CausalLM full(*c);
    const torch::Tensor ids = torch::randint(0, 64, {2, 12}, torch::kInt64);
    full->LossSum(ids, ids).backward();
    for (const auto& p : full->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << type << " " << p.key();
      EXPECT_TRUE(p.value().grad().isfinite().all().item<bool>()) << type << " " << p.key();
    }
    // Gemma's norms start at zero: (1 + w) is one.
    EXPECT_EQ(full->named_parameters()["model.layers.0.post_feedforward_layernorm.weight"]
                  .abs()
                  .sum()
                  .item<double>(),
              0.0);
    CausalLM lora(*c);
    LoraSpec spec;
    spec.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    ASSERT_TRUE(ApplyLora(lora, spec).ok());
    lora->LossSum(ids, ids).backward();
    int64_t adapters = 0;
    for (const auto& p : lora->named_parameters()) {
      const bool is_lora = p.key().find(".lora_") != std::string::npos;
      EXPECT_EQ(p.value().requires_grad(), is_lora) << p.key();
      if (is_lora) ++adapters;
    }
    EXPECT_EQ(adapters, 4 * 7 * 2);
    auto names = lora->named_parameters();
    EXPECT_TRUE(names.contains("model.layers.3.self_attn.q_proj.lora_A.weight"));
    EXPECT_TRUE(names.contains("model.layers.3.mlp.down_proj.lora_B.weight"));
  }
}

// The KV cache (each layer its window, its RoPE, the caps) gives the logits of a full forward,
// and a left-padded row attends as the unpadded one.
TEST(GemmaModel, CachedAndPaddedGenerationMatchTheFullForward) {
  for (const std::string type : {"gemma2", "gemma3_text"}) {
    ModelConfig c = *ParseModelConfig(TinyGemma(type), "cfg.json");
    c.attn_logit_softcapping = 1.5;
    c.final_logit_softcapping = 2.0;
    torch::manual_seed(2);
    CausalLM m(c);
    m->eval();
    torch::NoGradGuard no_grad;
    const int64_t T = 12, P = 9;
    const torch::Tensor ids = torch::randint(0, 64, {2, T}, torch::kInt64);
    const torch::Tensor full = m->Logits(m->Hidden(ids));
    KvCache cache(c.num_hidden_layers, {0, 0}, T, c.sliding_window, torch::kCPU, true);
    torch::Tensor step = m->Logits(m->HiddenCached(ids.slice(1, 0, P), cache));
    EXPECT_LT(MaxAbs(step, full.slice(1, 0, P)), 1e-5) << type;
    for (int64_t t = P; t < T; ++t) {
      step = m->Logits(m->HiddenCached(ids.slice(1, t, t + 1), cache));
      EXPECT_LT(MaxAbs(step, full.slice(1, t, t + 1)), 1e-5) << type << " t " << t;
    }
    // Row 1 left-padded by 3: its last T - 3 logits equal the unpadded forward of those tokens.
    const torch::Tensor pad = torch::tensor(std::vector<int64_t>{0, 3}, torch::kInt64);
    auto [positions, mask] = LeftPadAttention(pad, 0, T, T, c.SharedWindow());
    const torch::Tensor padded = m->Logits(m->Hidden(ids, positions, mask));
    const torch::Tensor alone = m->Logits(m->Hidden(ids.slice(0, 1, 2).slice(1, 3)));
    EXPECT_LT(MaxAbs(padded.slice(0, 1, 2).slice(1, 3), alone), 1e-5) << type;
  }
}

TEST(GemmaModel, SaveAndLoadKeepTheHfLayout) {
  for (const std::string family : {"gemma2", "gemma3_text", "gemma3_nested"}) {
    const std::string src = testing::HfReferenceDir() + "/" + family;
    Reference r = LoadReference(family);
    ASSERT_TRUE(r.model);
    const std::string out = sftctl::testing::MakeTempDir("gemma-save") + "/" + family;
    EXPECT_EQ(testing::SaveAndListTensors(r.model, out), testing::TensorShapes(src + "/model.safetensors"))
        << family;
    std::ifstream in(out + "/config.json");
    const json cfg = json::parse(in), ref_cfg = json::parse(std::ifstream(src + "/config.json"));
    for (const char* key :
         {"architectures", "model_type", "query_pre_attn_scalar", "sliding_window", "hidden_activation",
          "attn_logit_softcapping", "final_logit_softcapping", "tie_word_embeddings", "rope_parameters",
          "rope_scaling", "rope_local_base_freq"}) {
      if (ref_cfg.contains(key)) {
        EXPECT_EQ(cfg.at(key), ref_cfg.at(key)) << family << " " << key;
      }
    }
    // An int, as transformers 5's strict Gemma configs require (20.0 fails from_pretrained).
    EXPECT_TRUE(cfg.at("query_pre_attn_scalar").is_number_integer())
        << family << " " << cfg.at("query_pre_attn_scalar");
    auto back = LoadModelDir(out);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    CausalLM b = *back;
    EXPECT_EQ(b->config().sliding_layers, r.model->config().sliding_layers);
    torch::NoGradGuard no_grad;
    const torch::Tensor ids = r.tensors.at("input_ids");
    EXPECT_TRUE(torch::equal(b->Logits(b->Hidden(ids)), r.model->Logits(r.model->Hidden(ids)))) << family;
  }
}

// ---- Gemma3ForConditionalGeneration (a vision checkpoint's text tower) ---------------------

// A vision checkpoint made from hf-reference/<family> (a gemma3_text checkpoint): its text weights
// under transformers 4.x's names (`legacy`: language_model.model.X, language_model.lm_head.weight) or
// transformers >= 4.52's (model.language_model.X, lm_head.weight), plus a fake vision tower and
// projector (F32 and BF16), in `shard_bytes` shards.
struct VisionCheckpoint {
  std::string dir;
  std::map<std::string, torch::Tensor> tensors;  // every tensor of its files, by the files' names
  json config;
};

std::string WrapperName(const std::string& name, bool legacy) {
  if (legacy) return "language_model." + name;
  return name.rfind("model.", 0) == 0 ? "model.language_model." + name.substr(6) : name;
}

VisionCheckpoint MakeVisionCheckpointFrom(const std::string& src, bool legacy, int64_t shard_bytes) {
  VisionCheckpoint v;
  v.dir = sftctl::testing::MakeTempDir("gemma3-vision") + "/" + fs::path(src).filename().string() +
          (legacy ? "-legacy" : "");
  fs::create_directories(v.dir);
  json text = json::parse(std::ifstream(src + "/config.json"));
  text.erase("architectures");
  v.config = {{"architectures", {"Gemma3ForConditionalGeneration"}},
              {"model_type", "gemma3"},
              {"text_config", text},
              {"vision_config",
               {{"model_type", "siglip_vision_model"},
                {"hidden_size", 8},
                {"num_hidden_layers", 1},
                {"image_size", 28},
                {"patch_size", 14}}},
              {"mm_tokens_per_image", 4},
              {"image_token_index", 62},
              {"tie_word_embeddings", text.value("tie_word_embeddings", true)},
              {"torch_dtype", "float32"}};
  std::ofstream(v.dir + "/config.json") << v.config.dump(2);
  const std::string tower = legacy ? "" : "model.";
  torch::manual_seed(5);
  const int64_t hidden = text.at("hidden_size").get<int64_t>();
  v.tensors[tower + "vision_tower.vision_model.embeddings.patch_embedding.weight"] =
      torch::randn({8, 3, 14, 14});
  v.tensors[tower + "vision_tower.vision_model.post_layernorm.weight"] =
      torch::randn({8}).to(torch::kBFloat16);
  v.tensors[tower + "multi_modal_projector.mm_input_projection_weight"] = torch::randn({8, hidden});
  auto text_tensors = LoadTensors(src + "/model.safetensors");
  EXPECT_TRUE(text_tensors.ok()) << text_tensors.status().ToString();
  for (auto& [name, t] : *text_tensors) v.tensors[WrapperName(name, legacy)] = t;
  NamedTensors all(v.tensors.begin(), v.tensors.end());
  HfSaveOptions o;
  o.max_shard_bytes = shard_bytes;
  EXPECT_TRUE(SaveHfWeights(FileSystem::Default(), v.dir, all, false, o).ok());
  return v;
}

VisionCheckpoint MakeVisionCheckpoint(const std::string& family, bool legacy, int64_t shard_bytes) {
  return MakeVisionCheckpointFrom(testing::HfReferenceDir() + "/" + family, legacy, shard_bytes);
}

// Every tensor of a model folder (one file or shards + index), by name.
std::map<std::string, torch::Tensor> FolderTensors(const std::string& dir) {
  if (fs::exists(dir + "/model.safetensors")) return *LoadTensors(dir + "/model.safetensors");
  std::map<std::string, torch::Tensor> out;
  const json index = json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index.at("weight_map").items()) files.insert(file.get<std::string>());
  for (const std::string& f : files) {
    auto t = LoadTensors(dir + "/" + f);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) out.insert(t->begin(), t->end());
  }
  return out;
}

struct VisionCase {
  std::string family;  // gemma3_text: untied, BF16; gemma3_nested: tied, F32
  bool legacy;
  int64_t shard_bytes;
};
const VisionCase kVisionCases[] = {
    {"gemma3_text", true, kDefaultMaxShardBytes},
    {"gemma3_text", false, 20'000},
    {"gemma3_nested", false, kDefaultMaxShardBytes},
    {"gemma3_nested", true, 20'000},
};

// The text tower loads in both layouts (the vision tensors left out) with the text model's logits;
// a save keeps every tensor name of the source, the vision tensors' bytes (a bf16 export too),
// the wrapper's config, and loads back to the same logits.
TEST(GemmaVision, LoadsTheTextTowerAndSavesTheWholeCheckpoint) {
  for (const VisionCase& vc : kVisionCases) {
    const std::string what = vc.family + (vc.legacy ? " language_model.model." : " model.language_model.") +
                             (vc.shard_bytes < kDefaultMaxShardBytes ? " sharded" : "");
    const VisionCheckpoint v = MakeVisionCheckpoint(vc.family, vc.legacy, vc.shard_bytes);
    Reference r = LoadReference(vc.family);
    ASSERT_TRUE(r.model);
    auto loaded = LoadModelDir(v.dir);
    ASSERT_TRUE(loaded.ok()) << what << ": " << loaded.status().ToString();
    CausalLM m = *loaded;
    EXPECT_EQ(m->config().wrapper.model_type, "gemma3") << what;
    EXPECT_EQ(m->config().wrapper.source_dir, v.dir) << what;
    const torch::Tensor ids = r.tensors.at("input_ids");
    const torch::Tensor want = LogitsOf(r.model, ids);
    EXPECT_TRUE(torch::equal(LogitsOf(m, ids), want)) << what;
    for (auto dtype :
         {std::optional<torch::ScalarType>(), std::optional<torch::ScalarType>(torch::kBFloat16)}) {
      const std::string out = sftctl::testing::MakeTempDir("gemma3-vision-save") + "/out";
      NamedTensors params;
      for (const auto& p : m->named_parameters()) params.emplace_back(p.key(), p.value());
      HfSaveOptions o;
      o.dtype = dtype;
      const Status st = SaveHfModel(FileSystem::Default(), out, m->config(), params, o);
      ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
      const auto saved = FolderTensors(out);
      std::set<std::string> names, want_names;
      for (const auto& [name, t] : saved) names.insert(name);
      for (const auto& [name, t] : v.tensors) want_names.insert(name);
      EXPECT_EQ(names, want_names) << what;
      for (const auto& [name, t] : v.tensors) {
        if (!saved.count(name)) continue;
        const torch::Tensor& got = saved.at(name);
        if (name.find("vision_tower") != std::string::npos || name.find("multi_modal") != std::string::npos) {
          EXPECT_EQ(got.scalar_type(), t.scalar_type()) << what << " " << name;
          EXPECT_TRUE(torch::equal(got, t)) << what << " " << name;
        } else if (!dtype) {
          EXPECT_TRUE(torch::equal(got, t.to(got.scalar_type()))) << what << " " << name;
        }
      }
      const json cfg = json::parse(std::ifstream(out + "/config.json"));
      for (const char* key : {"architectures", "model_type", "vision_config", "mm_tokens_per_image",
                              "image_token_index", "tie_word_embeddings"})
        EXPECT_EQ(cfg.at(key), v.config.at(key)) << what << " " << key;
      EXPECT_EQ(cfg.at("torch_dtype"), dtype ? "bfloat16" : "float32") << what;
      EXPECT_EQ(cfg.at("text_config").at("model_type"), "gemma3_text") << what;
      EXPECT_EQ(cfg.at("text_config").at("hidden_size"), v.config.at("text_config").at("hidden_size"))
          << what;
      if (dtype) continue;
      auto back = LoadModelDir(out);
      ASSERT_TRUE(back.ok()) << what << ": " << back.status().ToString();
      CausalLM b = *back;
      EXPECT_TRUE(torch::equal(LogitsOf(b, ids), want)) << what;
    }
  }
}

// PEFT's keys for Gemma3ForConditionalGeneration: transformers' module paths under
// base_model.model.model.language_model.; adapters in that form and in transformers 4.x's
// (base_model.model.language_model.model.) load back into the same parameters.
TEST(GemmaVision, LoraAdapterKeysAreTransformersModulePaths) {
  const VisionCheckpoint v = MakeVisionCheckpoint("gemma3_nested", false, kDefaultMaxShardBytes);
  auto loaded = LoadModelDir(v.dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  CausalLM m = *loaded;
  LoraSpec spec;
  spec.target_modules = {"q_proj", "v_proj", "down_proj"};
  ASSERT_TRUE(testing::ApplyDrawnLora(m, spec, 3).ok());
  const NamedTensors keys = AdapterTensors(m);
  ASSERT_FALSE(keys.empty());
  for (const auto& [key, t] : keys)
    EXPECT_EQ(key.rfind("base_model.model.model.language_model.layers.", 0), 0u) << key;
  const std::string dir = sftctl::testing::MakeTempDir("gemma3-vision-lora");
  ASSERT_TRUE(SaveAdapter(FileSystem::Default(), dir, m, spec, v.dir).ok());
  auto tensors = *LoadTensors(dir + "/adapter_model.safetensors");
  EXPECT_TRUE(tensors.count("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"));
  // transformers 4.x's module paths.
  NamedTensors legacy;
  for (const auto& [key, t] : tensors) {
    const std::string rest = key.substr(std::string("base_model.model.model.language_model.").size());
    legacy.emplace_back("base_model.model.language_model.model." + rest, t);
  }
  const std::string legacy_dir = sftctl::testing::MakeTempDir("gemma3-vision-lora-legacy");
  ASSERT_TRUE(SaveTensors(FileSystem::Default(), legacy_dir + "/adapter_model.safetensors", legacy).ok());
  fs::copy_file(dir + "/adapter_config.json", legacy_dir + "/adapter_config.json");
  const torch::Tensor ids = torch::randint(0, 64, {2, 10}, torch::kInt64);
  m->eval();
  const torch::Tensor want = LogitsOf(m, ids);
  for (const std::string& d : {dir, legacy_dir}) {
    auto a = LoadAdapter(d);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_TRUE(a->tensors.count("model.layers.0.self_attn.q_proj.lora_A.weight")) << d;
    CausalLM fresh = *LoadModelDir(v.dir);
    ASSERT_TRUE(ApplyLora(fresh, a->spec).ok());
    ASSERT_TRUE(LoadAdapterInto(fresh, *a, d).ok());
    fresh->eval();
    EXPECT_TRUE(torch::equal(LogitsOf(fresh, ids), want)) << d;
  }
}

// `export --merge` of an adapter on a vision checkpoint: the merged text tower under the source's
// (transformers 4.x) names, every other tensor copied, the adapted logits.
TEST(GemmaVision, ExportMergesTheAdapterIntoTheWrapper) {
  const VisionCheckpoint v = MakeVisionCheckpoint("gemma3_nested", /*legacy=*/true, 20'000);
  CausalLM m = *LoadModelDir(v.dir);
  LoraSpec spec;
  spec.target_modules = {"q_proj", "o_proj", "up_proj"};
  ASSERT_TRUE(testing::ApplyDrawnLora(m, spec, 6).ok());
  const std::string adapter = sftctl::testing::MakeTempDir("gemma3-vision-adapter");
  ASSERT_TRUE(SaveAdapter(FileSystem::Default(), adapter, m, spec, v.dir).ok());
  m->eval();
  const torch::Tensor ids = torch::randint(0, 64, {2, 10}, torch::kInt64);
  const torch::Tensor want = LogitsOf(m, ids);
  ExportOptions o;
  o.model_dir = v.dir;
  o.adapter_dir = adapter;
  o.merge = true;
  o.out_dir = sftctl::testing::MakeTempDir("gemma3-vision-export") + "/merged";
  const Status st = ExportModel(o);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::set<std::string> names, want_names;
  for (const auto& [name, t] : FolderTensors(o.out_dir)) names.insert(name);
  for (const auto& [name, t] : v.tensors) want_names.insert(name);
  EXPECT_EQ(names, want_names);
  CausalLM merged = *LoadModelDir(o.out_dir);
  EXPECT_LT(MaxAbs(LogitsOf(merged, ids), want), 1e-4);
}

// GGUF export of a vision checkpoint's text tower names the wrapper's field: text_config.X.
TEST(GemmaVision, GgufRefusalNamesTheTextConfigField) {
  const VisionCheckpoint v = MakeVisionCheckpoint("gemma3_text", /*legacy=*/false, kDefaultMaxShardBytes);
  ASSERT_EQ(v.config["text_config"]["query_pre_attn_scalar"], 32);  // head_dim 16: llama.cpp would use 16
  GgufExportOptions o;
  o.model_dir = v.dir;
  o.out_path = sftctl::testing::MakeTempDir("gemma3-vision-gguf") + "/out.gguf";
  EXPECT_THAT(ExportGguf(o),
              ::sftctl::testing::StatusIs(
                  StatusCode::kInvalidArgument,
                  ::testing::HasSubstr(v.dir + "/config.json: field 'text_config.query_pre_attn_scalar': "
                                               "32: llama.cpp's gemma3 reads no attention scale")));
  EXPECT_FALSE(fs::exists(o.out_path));
}

// The trainer's checkpoints of a vision checkpoint: a full fine-tune writes the whole wrapper (every
// tensor name of the source, the vision tower's bytes, its config) and a LoRA run PEFT's keys.
TEST(GemmaVision, TrainerCheckpointsKeepTheWrapper) {
  json text = TinyGemma("gemma3_text");
  text["vocab_size"] = 320;  // above the byte tokenizer's
  auto c = ParseModelConfig(text, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  torch::manual_seed(4);
  CausalLM base(*c);
  const std::string src = sftctl::testing::MakeTempDir("gemma3-vision-train") + "/text";
  NamedTensors params;
  for (const auto& p : base->named_parameters()) params.emplace_back(p.key(), p.value());
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), src, *c, params).ok());
  for (bool lora : {false, true}) {
    const VisionCheckpoint v = MakeVisionCheckpointFrom(src, /*legacy=*/lora, kDefaultMaxShardBytes);
    const std::string dir = sftctl::testing::MakeTempDir("gemma3-vision-run");
    JobSpec spec = sftctl::testing::TinySpec(dir, 2);
    spec.model.config = nullptr;
    spec.model.path = v.dir;
    spec.eval.exact_match = false;
    if (lora) spec.lora = LoraSpec();
    StatusOr<TrainResult> r = Train(spec, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const std::string ckpt = r->checkpoint_dir;
    const json cfg = json::parse(std::ifstream(ckpt + "/config.json"));
    EXPECT_EQ(cfg.at("architectures"), v.config.at("architectures")) << lora;
    EXPECT_EQ(cfg.at("vision_config"), v.config.at("vision_config")) << lora;
    if (lora) {
      auto adapter = *LoadTensors(ckpt + "/adapter_model.safetensors");
      EXPECT_TRUE(
          adapter.count("base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"));
      continue;
    }
    const auto saved = FolderTensors(ckpt);
    std::set<std::string> names, want_names;
    for (const auto& [name, t] : saved) names.insert(name);
    for (const auto& [name, t] : v.tensors) want_names.insert(name);
    EXPECT_EQ(names, want_names);
    for (const auto& [name, t] : v.tensors) {
      if (name.find("language_model") == std::string::npos && saved.count(name)) {
        EXPECT_TRUE(torch::equal(saved.at(name), t)) << name;
      }
    }
    // The text tower trained: its weights moved.
    const std::string embed = "model.language_model.embed_tokens.weight";
    ASSERT_TRUE(saved.count(embed));
    EXPECT_FALSE(torch::equal(saved.at(embed), v.tensors.at(embed)));
  }
}

}  // namespace
}  // namespace sftctl::trainer
