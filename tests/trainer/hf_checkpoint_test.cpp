// HF checkpoints: parity with the transformers reference, sharded/single loading, save_pretrained
// layout, config parsing and the errors for broken folders.
//
// The reference checkpoints and outputs come from tests/reference/hf_reference.py, run by the
// hf_reference fixture into <build>/hf-reference (see tests/trainer/CMakeLists.txt).
#include "trainer/checkpoint/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/formats/safetensors.h"
#include "tests/trainer/test_util.h"
#include "tests/util/test_paths.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/model.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sftctl::testing::MakeTempDir;
using sftctl::testing::WriteWholeFile;

const std::string kRefDir = std::string(SFTCTL_BUILD_DIR) + "/hf-reference";

NamedTensors Params(CausalLM& m) {
  NamedTensors out;
  for (const auto& p : m->named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void WriteJson(const std::string& path, const json& j) { WriteWholeFile(path, j.dump(2)); }

void CopyDir(const std::string& from, const std::string& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from))
    fs::copy_file(e.path(), fs::path(to) / e.path().filename(), fs::copy_options::overwrite_existing);
}

void ExpectSameParams(CausalLM& a, CausalLM& b) {
  auto pb = b->named_parameters();
  ASSERT_EQ(a->named_parameters().size(), pb.size());
  for (const auto& p : a->named_parameters()) {
    ASSERT_TRUE(pb.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), pb[p.key()])) << p.key();
  }
}

// ---- Parity with the reference implementation of transformers' math --------------------

// Runs on the fused CPU kernels (the default) and, with `fused` false, on the composite path.
void CheckParityOn(const std::string& family, bool fused_on) {
  fused::SetEnabled(fused_on);
  const std::string dir = kRefDir + "/" + family;
  ASSERT_TRUE(fs::exists(dir + "/reference.safetensors"))
      << "run the hf_reference fixture (ctest) or tests/reference/hf_reference.py --out " << kRefDir;
  auto ref = LoadTensors(dir + "/reference.safetensors");
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  auto loaded = LoadModelDir(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  CausalLM model = *loaded;
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = ref->at("input_ids"), labels = ref->at("labels");
  const torch::Tensor logits = model->Logits(model->Hidden(ids)).to(torch::kFloat32);
  const torch::Tensor ref_logits = ref->at("logits");
  ASSERT_EQ(logits.sizes(), ref_logits.sizes());
  const double max_abs = (logits - ref_logits).abs().max().item<double>();
  const int64_t targets = labels.slice(1, 1).ne(-100).sum().item<int64_t>();
  const double loss = model->LossSum(ids, labels).item<double>() / static_cast<double>(targets);
  const double ref_loss = ref->at("loss").item<double>();
  const double rel = std::abs(loss - ref_loss) / std::abs(ref_loss);
  std::printf(
      "[parity] %s (%s): logits max-abs error %.3g (|logits| max %.3g), loss %.7f vs reference %.7f, "
      "relative error %.3g\n",
      family.c_str(), fused_on ? "fused" : "composite", max_abs, ref_logits.abs().max().item<double>(), loss,
      ref_loss, rel);
  EXPECT_LE(max_abs, 1e-4) << family;
  EXPECT_LE(rel, 1e-5) << family;
  fused::SetEnabled(true);
}

void CheckParity(const std::string& family) {
  CheckParityOn(family, true);
  CheckParityOn(family, false);
}

TEST(HfParity, LlamaGqaHeadDimLlama3RopeBf16) { CheckParity("llama"); }
TEST(HfParity, Qwen2BiasTiedShardedF32) { CheckParity("qwen2"); }
TEST(HfParity, Qwen3QkNormHeadDimTiedShardedF32) { CheckParity("qwen3"); }
TEST(HfParity, Qwen3UntiedLayerTypesBf16) { CheckParity("qwen3_untied"); }
TEST(HfParity, MistralSlidingWindowUntiedBf16) { CheckParity("mistral"); }
TEST(HfParity, MistralNullSlidingWindowTiedF32) { CheckParity("mistral_full"); }

// The parity tests above would pass vacuously if q_norm/k_norm or the window changed nothing:
// without them the same weights miss the reference by far more than the tolerance.
TEST(HfParity, QkNormAndSlidingWindowChangeTheLogits) {
  for (const std::string family : {"qwen3", "mistral"}) {
    const std::string src = kRefDir + "/" + family;
    auto ref = LoadTensors(src + "/reference.safetensors");
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    auto loaded = LoadModelDir(src);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    CausalLM model = *loaded;
    ModelConfig c = model->config();
    if (family == "qwen3") {
      ASSERT_TRUE(c.qk_norm);
      c.qk_norm = false;
    } else {
      ASSERT_EQ(c.sliding_window, 7);
      c.sliding_window = 0;
    }
    CausalLM ablated(c);
    {
      torch::NoGradGuard no_grad;
      auto from = model->named_parameters();
      for (auto& p : ablated->named_parameters()) p.value().copy_(from[p.key()]);
    }
    ablated->eval();
    for (bool fused_on : {true, false}) {
      fused::SetEnabled(fused_on);
      torch::NoGradGuard no_grad;
      const torch::Tensor logits = ablated->Logits(ablated->Hidden(ref->at("input_ids")));
      EXPECT_GT((logits - ref->at("logits")).abs().max().item<double>(), 1e-2) << family << " " << fused_on;
      fused::SetEnabled(true);
    }
  }
}

// ---- Loading and saving -----------------------------------------------------------------

TEST(HfCheckpoint, ShardedLoadEqualsSingleFileAndRoundTripIsBitExact) {
  const std::string tmp = MakeTempDir("hf-shards");
  auto sharded = LoadModelDir(kRefDir + "/qwen2");  // 3 shards + index
  ASSERT_TRUE(sharded.ok()) << sharded.status().ToString();
  CausalLM a = *sharded;
  // Save as one file, then as many shards; both load back bit-exactly.
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), tmp + "/single", a->config(), Params(a)).ok());
  EXPECT_TRUE(fs::exists(tmp + "/single/model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp + "/single/model.safetensors.index.json"));
  HfSaveOptions small;
  small.max_shard_bytes = 40'000;
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), tmp + "/multi", a->config(), Params(a), small).ok());
  EXPECT_FALSE(fs::exists(tmp + "/multi/model.safetensors"));
  const json index = ReadJson(tmp + "/multi/model.safetensors.index.json");
  std::set<std::string> files;
  int64_t total = 0;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  for (const auto& p : a->named_parameters()) total += p.value().numel() * 4;
  EXPECT_GT(files.size(), 3u);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_TRUE(files.count("model-00001-of-" + std::string(5 - std::to_string(files.size()).size(), '0') +
                          std::to_string(files.size()) + ".safetensors"));
  for (const std::string& d : {tmp + "/single", tmp + "/multi"}) {
    auto b = LoadModelDir(d);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    CausalLM bm = *b;
    ExpectSameParams(a, bm);
    auto reader =
        safetensors::Reader::Open(d == tmp + "/single" ? d + "/model.safetensors" : d + "/" + *files.begin());
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ((*reader)->metadata().at("format"), "pt");
  }
}

TEST(HfCheckpoint, TiedSaveOmitsLmHeadAndWritesGenerationConfig) {
  const std::string tmp = MakeTempDir("hf-tied");
  CausalLM a = *LoadModelDir(kRefDir + "/qwen2");
  ASSERT_TRUE(a->config().tie_word_embeddings);
  NamedTensors weights = Params(a);
  // Even if a caller hands lm_head over (e.g. an untied copy), a tied save drops it.
  weights.emplace_back("lm_head.weight", a->model->embed_tokens->weight);
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), tmp, a->config(), weights).ok());
  auto reader = safetensors::Reader::Open(tmp + "/model.safetensors");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->Find("lm_head.weight"), nullptr);
  EXPECT_NE((*reader)->Find("model.embed_tokens.weight"), nullptr);
  const json gen = ReadJson(tmp + "/generation_config.json");
  EXPECT_EQ(gen["eos_token_id"], 141);
  EXPECT_EQ(gen["bos_token_id"], 140);
  const json cfg = ReadJson(tmp + "/config.json");
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["rope_parameters"]["rope_theta"], 1000000.0);
  // Untied llama: lm_head is saved; eos list kept.
  CausalLM l = *LoadModelDir(kRefDir + "/llama");
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), tmp + "/llama", l->config(), Params(l)).ok());
  auto lr = safetensors::Reader::Open(tmp + "/llama/model.safetensors");
  ASSERT_TRUE(lr.ok());
  EXPECT_NE((*lr)->Find("lm_head.weight"), nullptr);
  EXPECT_EQ(ReadJson(tmp + "/llama/generation_config.json")["eos_token_id"], json({2, 3}));
  EXPECT_EQ(ReadJson(tmp + "/llama/config.json")["rope_scaling"]["rope_type"], "llama3");
}

// What transformers / vLLM dispatch on (model_type, architectures) and the keys that shape
// the model come back, and the saved folder loads into the same weights and logits.
TEST(HfCheckpoint, Qwen3AndMistralSaveTheirArchitectureAndLoadBack) {
  const std::string tmp = MakeTempDir("hf-archs");
  for (const std::string family : {"qwen3", "qwen3_untied", "mistral", "mistral_full"}) {
    SCOPED_TRACE(family);
    CausalLM a = *LoadModelDir(kRefDir + "/" + family);
    const std::string out = tmp + "/" + family;
    ASSERT_TRUE(SaveHfModel(FileSystem::Default(), out, a->config(), Params(a)).ok());
    const json cfg = ReadJson(out + "/config.json");
    const bool qwen3 = family.rfind("qwen3", 0) == 0;
    EXPECT_EQ(cfg["model_type"], qwen3 ? "qwen3" : "mistral");
    EXPECT_EQ(cfg["architectures"], json({qwen3 ? "Qwen3ForCausalLM" : "MistralForCausalLM"}));
    if (qwen3) {
      EXPECT_EQ(cfg["head_dim"], family == "qwen3" ? 16 : 12);
      EXPECT_EQ(cfg["attention_bias"], false);
      EXPECT_EQ(cfg["use_sliding_window"], false);
    } else {
      EXPECT_EQ(cfg["sliding_window"], family == "mistral" ? json(7) : json(nullptr));
      EXPECT_FALSE(cfg.contains("attention_bias"));
    }
    auto reader = safetensors::Reader::Open(out + "/model.safetensors");
    ASSERT_TRUE(reader.ok());
    const bool tied = family == "qwen3" || family == "mistral_full";
    EXPECT_EQ((*reader)->Find("lm_head.weight") == nullptr, tied);
    EXPECT_EQ((*reader)->Find("model.layers.1.self_attn.q_norm.weight") != nullptr, qwen3);
    EXPECT_EQ((*reader)->Find("model.layers.1.self_attn.k_norm.weight") != nullptr, qwen3);
    EXPECT_EQ((*reader)->Find("model.layers.0.self_attn.q_proj.bias"), nullptr);
    EXPECT_EQ((*reader)->Find("model.layers.0.self_attn.o_proj.bias"), nullptr);
    auto b = LoadModelDir(out);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    CausalLM bm = *b;
    EXPECT_EQ(bm->config().qk_norm, a->config().qk_norm);
    EXPECT_EQ(bm->config().sliding_window, a->config().sliding_window);
    ExpectSameParams(a, bm);
  }
}

TEST(HfCheckpoint, Bf16SaveRoundsAndLoadsBack) {
  const std::string tmp = MakeTempDir("hf-bf16");
  CausalLM a = *LoadModelDir(kRefDir + "/qwen2");
  HfSaveOptions o;
  o.dtype = torch::kBFloat16;
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), tmp, a->config(), Params(a), o).ok());
  EXPECT_EQ(ReadJson(tmp + "/config.json")["torch_dtype"], "bfloat16");
  auto reader = safetensors::Reader::Open(tmp + "/model.safetensors");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->Find("model.norm.weight")->dtype, safetensors::DType::kBF16);
  CausalLM b = *LoadModelDir(tmp);
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value().to(torch::kBFloat16).to(torch::kFloat32), pb[p.key()])) << p.key();
  }
}

// ---- Broken folders: specific errors naming the file and the tensor ------------------------

std::string LoadError(const std::string& dir) {
  auto m = LoadModelDir(dir);
  return m.ok() ? std::string("(loaded)") : m.status().ToString();
}

TEST(HfCheckpointErrors, MissingShard) {
  const std::string d = MakeTempDir("hf-err") + "/m";
  CopyDir(kRefDir + "/qwen2", d);
  fs::remove(d + "/model-00002-of-00003.safetensors");
  const std::string e = LoadError(d);
  EXPECT_NE(e.find("model.safetensors.index.json"), std::string::npos) << e;
  EXPECT_NE(e.find("shard 'model-00002-of-00003.safetensors'"), std::string::npos) << e;
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
}

TEST(HfCheckpointErrors, IndexNamesTensorMissingFromShard) {
  const std::string d = MakeTempDir("hf-err") + "/m";
  CopyDir(kRefDir + "/qwen2", d);
  json index = ReadJson(d + "/model.safetensors.index.json");
  const std::string where = index["weight_map"]["model.norm.weight"];
  const std::string other = where == "model-00001-of-00003.safetensors" ? "model-00002-of-00003.safetensors"
                                                                        : "model-00001-of-00003.safetensors";
  index["weight_map"]["model.norm.weight"] = other;
  WriteJson(d + "/model.safetensors.index.json", index);
  const std::string e = LoadError(d);
  EXPECT_NE(e.find("names 'model.norm.weight' in shard '" + other + "', which has no such tensor"),
            std::string::npos)
      << e;
  // A tensor absent from the index altogether.
  index["weight_map"].erase("model.norm.weight");
  WriteJson(d + "/model.safetensors.index.json", index);
  const std::string e2 = LoadError(d);
  EXPECT_NE(e2.find("missing tensor 'model.norm.weight'"), std::string::npos) << e2;
  EXPECT_NE(e2.find("model.safetensors.index.json"), std::string::npos) << e2;
}

TEST(HfCheckpointErrors, ShapeMismatchAndMissingTensor) {
  const std::string d = MakeTempDir("hf-err") + "/m";
  CopyDir(kRefDir + "/llama", d);
  json cfg = ReadJson(d + "/config.json");
  cfg["intermediate_size"] = 100;
  WriteJson(d + "/config.json", cfg);
  const std::string e = LoadError(d);
  EXPECT_NE(e.find(d + "/model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], "
                       "the model expects [100, 64]"),
            std::string::npos)
      << e;
  cfg["intermediate_size"] = 96;
  cfg["num_hidden_layers"] = 3;
  WriteJson(d + "/config.json", cfg);
  const std::string e2 = LoadError(d);
  EXPECT_NE(e2.find("model.safetensors: missing tensor 'model.layers.2."), std::string::npos) << e2;
}

TEST(HfCheckpointErrors, UnsupportedDtypeAndNoWeights) {
  const std::string d = MakeTempDir("hf-err");
  auto cfg = ParseModelConfig({{"model_type", "llama"},
                               {"vocab_size", 8},
                               {"hidden_size", 4},
                               {"intermediate_size", 8},
                               {"num_hidden_layers", 1},
                               {"num_attention_heads", 2}},
                              "test");
  ASSERT_TRUE(cfg.ok());
  CausalLM m(*cfg);
  NamedTensors w = Params(m);
  for (auto& [name, t] : w) {
    if (name == "model.norm.weight") t = t.to(torch::kInt32);
  }
  ASSERT_TRUE(SaveHfModel(FileSystem::Default(), d, *cfg, w).ok());
  const std::string e = LoadError(d);
  EXPECT_NE(
      e.find(d + "/model.safetensors: tensor 'model.norm.weight' has dtype I32, which is not supported"),
      std::string::npos)
      << e;
  fs::remove(d + "/model.safetensors");
  const std::string e2 = LoadError(d);
  EXPECT_NE(e2.find("has neither model.safetensors nor model.safetensors.index.json"), std::string::npos)
      << e2;
}

// ---- config.json ------------------------------------------------------------------------

json BaseConfig() {
  return {{"model_type", "llama"},   {"vocab_size", 32},       {"hidden_size", 64},
          {"intermediate_size", 96}, {"num_hidden_layers", 1}, {"num_attention_heads", 4}};
}

TEST(HfConfig, RopeScalingLlama3LegacyAndRopeParameters) {
  json j = BaseConfig();
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  auto c = ParseModelConfig(j, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->rope_scaling.type, "llama3");
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  // The same in the newer "rope_parameters" form (theta inside).
  json k = BaseConfig();
  k["rope_parameters"] = j["rope_scaling"];
  k["rope_parameters"]["rope_theta"] = 500000.0;
  auto c2 = ParseModelConfig(k, "cfg.json");
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_EQ(c2->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c2->rope_theta, 500000.0);
  EXPECT_EQ(RopeInvFreq(*c), RopeInvFreq(*c2));
  // Low frequencies are divided by the factor, high ones kept.
  json d = BaseConfig();
  d["rope_theta"] = 500000.0;
  auto plain = RopeInvFreq(*ParseModelConfig(d, "cfg.json"));
  auto scaled = RopeInvFreq(*c);
  EXPECT_EQ(plain.front(), scaled.front());
  EXPECT_FLOAT_EQ(plain.back() / 8, scaled.back());
  // Legacy "type" key; a default rope_parameters.
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  EXPECT_TRUE(ParseModelConfig(j, "cfg.json").ok());
  json e = BaseConfig();
  e["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_DOUBLE_EQ(ParseModelConfig(e, "cfg.json")->rope_theta, 1e6);
}

TEST(HfConfig, HeadDimAndAttentionBias) {
  json j = BaseConfig();
  j["head_dim"] = 24;
  j["attention_bias"] = true;
  j["num_key_value_heads"] = 2;
  auto c = ParseModelConfig(j, "cfg.json");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->head_dim, 24);
  EXPECT_TRUE(c->attention_bias);
  CausalLM m(*c);
  auto p = m->named_parameters();
  EXPECT_EQ(p["model.layers.0.self_attn.q_proj.weight"].sizes(), torch::IntArrayRef({96, 64}));
  EXPECT_EQ(p["model.layers.0.self_attn.k_proj.bias"].sizes(), torch::IntArrayRef({48}));
  // transformers' LlamaAttention biases o_proj too when attention_bias is set.
  EXPECT_EQ(p["model.layers.0.self_attn.o_proj.bias"].sizes(), torch::IntArrayRef({64}));
  j["model_type"] = "qwen2";
  j.erase("attention_bias");
  auto q = ParseModelConfig(j, "cfg.json");
  EXPECT_TRUE(q->attention_bias);
  EXPECT_FALSE(q->o_proj_bias);
  CausalLM qm(*q);
  EXPECT_FALSE(qm->named_parameters().contains("model.layers.0.self_attn.o_proj.bias"));
  EXPECT_TRUE(qm->named_parameters().contains("model.layers.0.self_attn.v_proj.bias"));
  EXPECT_EQ(ParseModelConfig(BaseConfig(), "cfg.json")->head_dim, 16);
}

TEST(HfConfig, Qwen3NormsAndBiases) {
  json j = BaseConfig();
  j["model_type"] = "qwen3";
  j["head_dim"] = 8;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["layer_types"] = {"full_attention"};
  auto c = ParseModelConfig(j, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->sliding_window, 0);
  CausalLM m(*c);
  auto p = m->named_parameters();
  EXPECT_EQ(p["model.layers.0.self_attn.q_norm.weight"].sizes(), torch::IntArrayRef({8}));
  EXPECT_EQ(p["model.layers.0.self_attn.k_norm.weight"].sizes(), torch::IntArrayRef({8}));
  EXPECT_EQ(p["model.layers.0.self_attn.q_norm.weight"].sum().item<double>(), 8.0);  // ones, as HF
  EXPECT_FALSE(p.contains("model.layers.0.self_attn.q_proj.bias"));
  // attention_bias biases all four projections, as Qwen3Attention does.
  j["attention_bias"] = true;
  CausalLM b(*ParseModelConfig(j, "cfg.json"));
  for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    EXPECT_TRUE(b->named_parameters().contains(std::string("model.layers.0.self_attn.") + n + ".bias")) << n;
  }
}

TEST(HfConfig, MistralSlidingWindow) {
  json j = BaseConfig();
  j["model_type"] = "mistral";
  EXPECT_EQ(ParseModelConfig(j, "cfg.json")->sliding_window, 4096);  // MistralConfig's default
  j["sliding_window"] = nullptr;
  EXPECT_EQ(ParseModelConfig(j, "cfg.json")->sliding_window, 0);  // full attention
  j["sliding_window"] = 7;
  j["attention_bias"] = false;
  auto c = ParseModelConfig(j, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sliding_window, 7);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(ModelConfigToJson(*c)["sliding_window"], 7);
  c->sliding_window = 0;
  EXPECT_EQ(ModelConfigToJson(*c)["sliding_window"], nullptr);
  EXPECT_EQ(ModelConfigToJson(*c)["architectures"], json({"MistralForCausalLM"}));
}

TEST(HfConfig, ErrorsNameFileAndField) {
  auto err = [](json j) {
    auto c = ParseModelConfig(j, "/m/config.json");
    return c.ok() ? std::string("(ok)") : c.status().message();
  };
  json j = BaseConfig();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_EQ(
      err(j),
      "/m/config.json: field 'rope_scaling.rope_type': 'yarn' is not supported (default, llama3, linear)");
  j["rope_scaling"] = {
      {"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  EXPECT_EQ(err(j), "/m/config.json: field 'rope_scaling.original_max_position_embeddings': is required");
  j = BaseConfig();
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", "8"}};
  EXPECT_EQ(err(j), "/m/config.json: field 'rope_parameters.factor': must be a number, got \"8\"");
  j = BaseConfig();
  j["head_dim"] = 7;
  EXPECT_EQ(err(j), "/m/config.json: field 'head_dim': must be even and > 0 for RoPE, got 7");
  j = BaseConfig();
  j["attention_bias"] = "yes";
  EXPECT_EQ(err(j), "/m/config.json: field 'attention_bias': must be a boolean, got \"yes\"");
  j = BaseConfig();
  j.erase("hidden_size");
  EXPECT_EQ(err(j), "/m/config.json: field 'hidden_size': is required");
  j = BaseConfig();
  j["model_type"] = "gpt2";
  EXPECT_EQ(err(j),
            "/m/config.json: field 'model_type': 'gpt2' is not supported (llama, qwen2, qwen3, mistral, gemma2, gemma3_text, phi3)");
  j = BaseConfig();
  j["model_type"] = "qwen3";
  EXPECT_EQ(err(j),
            "/m/config.json: field 'head_dim': is required for qwen3 (transformers defaults it to 128, not "
            "hidden_size / num_attention_heads)");
  j["head_dim"] = 16;
  j["use_sliding_window"] = true;
  EXPECT_EQ(err(j),
            "/m/config.json: field 'use_sliding_window': true is not supported for qwen3 (its per-layer "
            "sliding windows are not implemented; mistral's is)");
  j["model_type"] = "qwen2";
  EXPECT_NE(err(j).find("field 'use_sliding_window': true is not supported for qwen2"), std::string::npos);
  j["use_sliding_window"] = false;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_EQ(
      err(j),
      "/m/config.json: field 'layer_types': \"sliding_attention\" is not supported (full_attention only; "
      "set use_sliding_window false)");
  j = BaseConfig();
  j["model_type"] = "mistral";
  j["sliding_window"] = 0;
  EXPECT_EQ(err(j), "/m/config.json: field 'sliding_window': must be > 0 or null, got 0");
  j["sliding_window"] = 16;
  j["attention_bias"] = true;
  EXPECT_EQ(err(j),
            "/m/config.json: field 'attention_bias': true is not supported for mistral (it has no biases)");
  j.erase("attention_bias");
  j["sliding_window"] = "4096";
  EXPECT_EQ(err(j), "/m/config.json: field 'sliding_window': must be an integer, got \"4096\"");
  j = BaseConfig();
  j["mlp_bias"] = true;
  EXPECT_EQ(err(j), "/m/config.json: field 'mlp_bias': true is not supported");
  j = BaseConfig();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(err(j).find("field 'num_key_value_heads'"), std::string::npos);
}

}  // namespace
}  // namespace sftctl::trainer
