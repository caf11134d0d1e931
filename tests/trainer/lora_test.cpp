// LoRA: PEFT adapter format, B = 0 equals the base, merge math, training, resume, export, eval.
#include "trainer/model/lora.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/formats/safetensors.h"
#include "tests/trainer/test_util.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/tools/hf_tools.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::StepLosses;
using sftctl::testing::TinySpec;
using sftctl::testing::WriteWholeFile;

// A tiny model of `type`; qwen2 and qwen3 tied, qwen3 with its q/k norms, mistral with a
// sliding window (5) shorter than Ids()' 12 positions.
ModelConfig SmallConfig(const std::string& type) {
  const bool tied = type == "qwen2" || type == "qwen3";
  json j = {{"model_type", type},          {"vocab_size", 64},
            {"hidden_size", 32},           {"intermediate_size", 48},
            {"num_hidden_layers", 2},      {"num_attention_heads", 4},
            {"num_key_value_heads", 2},    {"max_position_embeddings", 32},
            {"tie_word_embeddings", tied}, {"eos_token_id", 2}};
  if (type == "qwen3") j["head_dim"] = 12;
  if (type == "mistral") j["sliding_window"] = 5;
  return *ParseModelConfig(j, "test");
}

LoraSpec Spec(std::vector<std::string> targets = {"q_proj", "v_proj"}, int64_t r = 4, double alpha = 8) {
  LoraSpec s;
  s.r = r;
  s.alpha = alpha;
  s.target_modules = std::move(targets);
  return s;
}

torch::Tensor Ids() { return torch::randint(0, 64, {2, 12}, torch::TensorOptions().dtype(torch::kInt64)); }

torch::Tensor Logits(CausalLM& m, const torch::Tensor& ids) {
  torch::NoGradGuard g;
  m->eval();
  return m->Logits(m->Hidden(ids));
}

CausalLM CopyOf(CausalLM& a) {
  CausalLM b(a->config());
  torch::NoGradGuard g;
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    if (pb.contains(p.key())) pb[p.key()].copy_(p.value());
  }
  return b;
}

TEST(Lora, ZeroBEqualsBaseAndOnlyAdaptersTrain) {
  for (const std::string type : {"llama", "qwen2", "qwen3", "mistral"}) {
    torch::manual_seed(1);
    CausalLM base(SmallConfig(type));
    CausalLM lora = CopyOf(base);
    ASSERT_TRUE(
        ApplyLora(lora, Spec({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}))
            .ok());
    const torch::Tensor ids = Ids();
    const double diff = (Logits(base, ids) - Logits(lora, ids)).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << type;
    int64_t trainable = 0;
    for (const auto& p : lora->named_parameters()) {
      const bool is_lora = p.key().find(".lora_") != std::string::npos;
      EXPECT_EQ(p.value().requires_grad(), is_lora) << p.key();
      if (is_lora) trainable += p.value().numel();
      if (p.key().find(".lora_B.") != std::string::npos) {
        EXPECT_EQ(p.value().abs().sum().item<double>(), 0.0);
      }
      if (p.key().find(".lora_A.") != std::string::npos) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(p.value().size(1)));
        EXPECT_LE(p.value().abs().max().item<double>(), bound) << p.key();
        EXPECT_GT(p.value().abs().max().item<double>(), 0.5 * bound) << p.key();
      }
    }
    // 2 layers x (q 4x32+64x4, k 4x32+16x4 ... ): just check it is a small fraction.
    EXPECT_GT(trainable, 0);
    // The loss reaches every B (A's gradient is zero while B is), through qwen3's q/k norms too.
    lora->train();
    lora->LossSum(ids, ids).backward();
    int64_t with_grad = 0;
    for (const auto& p : lora->named_parameters()) {
      if (p.key().find(".lora_B.") == std::string::npos) continue;
      ASSERT_TRUE(p.value().grad().defined()) << type << " " << p.key();
      EXPECT_GT(p.value().grad().abs().sum().item<double>(), 0.0) << type << " " << p.key();
      ++with_grad;
    }
    EXPECT_EQ(with_grad, 2 * 7) << type;
  }
}

TEST(Lora, AdapterKeysAndConfigParseAsDocumented) {
  torch::manual_seed(2);
  CausalLM m(SmallConfig("llama"));
  LoraSpec spec = Spec();
  spec.dropout = 0.05;
  ASSERT_TRUE(ApplyLora(m, spec).ok());
  const std::string dir = MakeTempDir("lora-keys");
  ASSERT_TRUE(SaveAdapter(FileSystem::Default(), dir, m, spec, "/models/base").ok());
  auto reader = safetensors::Reader::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->metadata().at("format"), "pt");
  std::set<std::string> keys;
  for (const auto& t : (*reader)->tensors()) keys.insert(t.name);
  std::set<std::string> expected;
  for (int l = 0; l < 2; ++l) {
    for (const char* p : {"q_proj", "v_proj"}) {
      for (const char* ab : {"lora_A", "lora_B"}) {
        expected.insert("base_model.model.model.layers." + std::to_string(l) + ".self_attn." + p + "." + ab +
                        ".weight");
      }
    }
  }
  EXPECT_EQ(keys, expected);
  const auto* a = (*reader)->Find("base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight");
  const auto* b = (*reader)->Find("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
  EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 32}));  // [r, in]
  EXPECT_EQ(b->shape, (std::vector<int64_t>{16, 4}));  // [out, r]: 2 KV heads x head_dim 8
  std::ifstream in(dir + "/adapter_config.json");
  const json cfg = json::parse(in);
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["task_type"], "CAUSAL_LM");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8);
  EXPECT_DOUBLE_EQ(cfg["lora_dropout"].get<double>(), 0.05);
  EXPECT_EQ(cfg["target_modules"], json({"q_proj", "v_proj"}));
  EXPECT_EQ(cfg["base_model_name_or_path"], "/models/base");
  EXPECT_EQ(cfg["bias"], "none");
  EXPECT_EQ(cfg["fan_in_fan_out"], false);
  EXPECT_TRUE(cfg["modules_to_save"].is_null());
  EXPECT_EQ(cfg["use_dora"], false);
  EXPECT_EQ(cfg["use_rslora"], false);
  for (const char* k : {"init_lora_weights", "inference_mode", "rank_pattern", "alpha_pattern"})
    EXPECT_TRUE(cfg.contains(k)) << k;
  auto loaded = LoadAdapter(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->spec.r, 4);
  EXPECT_EQ(loaded->base_model, "/models/base");
  EXPECT_EQ(loaded->tensors.size(), 8u);
  EXPECT_TRUE(loaded->tensors.count("model.layers.1.self_attn.q_proj.lora_B.weight"));
}

TEST(Lora, BadAdapterConfigFieldsAreNamed) {
  json good = AdapterConfigJson(Spec(), "");
  auto err = [&](const std::string& key, const json& value) {
    json j = good;
    j[key] = value;
    auto s = ParseAdapterConfig(j, "a/adapter_config.json");
    return s.ok() ? std::string("(ok)") : s.status().message();
  };
  EXPECT_EQ(err("use_dora", true),
            "a/adapter_config.json: field 'use_dora': DoRA adapters are not supported");
  EXPECT_NE(err("modules_to_save", json({"lm_head"})).find("field 'modules_to_save'"), std::string::npos);
  EXPECT_NE(err("peft_type", "IA3").find("field 'peft_type': must be \"LORA\""), std::string::npos);
  EXPECT_NE(err("r", 0).find("field 'r': must be an integer >= 1"), std::string::npos);
  EXPECT_NE(err("target_modules", json({"embed_tokens"})).find("field 'target_modules': 'embed_tokens'"),
            std::string::npos);
  EXPECT_NE(err("bias", "all").find("field 'bias'"), std::string::npos);
  EXPECT_EQ(err("use_rslora", true), "(ok)");
}

TEST(Lora, MergedWeightsEqualWPlusScaledBA) {
  for (bool rslora : {false, true}) {
    torch::manual_seed(3);
    CausalLM m(SmallConfig("qwen2"));
    CausalLM base = CopyOf(m);
    LoraSpec spec = Spec({"q_proj", "o_proj", "down_proj"}, 4, 16);
    spec.use_rslora = rslora;
    ASSERT_TRUE(ApplyLora(m, spec).ok());
    {
      torch::NoGradGuard g;
      for (auto& p : m->named_parameters()) {
        if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0, 0.1);
      }
    }
    const std::string dir = MakeTempDir("lora-merge");
    ASSERT_TRUE(SaveAdapter(FileSystem::Default(), dir, m, spec, "").ok());
    auto adapter = LoadAdapter(dir);
    ASSERT_TRUE(adapter.ok());
    NamedTensors params;
    for (const auto& p : base->named_parameters()) params.emplace_back(p.key(), p.value());
    ASSERT_TRUE(MergeAdapter(*adapter, params).ok());
    const double scale = rslora ? 16 / 2.0 : 16 / 4.0;
    EXPECT_DOUBLE_EQ(LoraScale(spec), scale);
    auto pm = m->named_parameters();
    auto pb = base->named_parameters();
    for (const std::string path : {"model.layers.1.self_attn.q_proj", "model.layers.0.mlp.down_proj"}) {
      const torch::Tensor expect = pm[path + ".weight"] + scale * torch::matmul(pm[path + ".lora_B.weight"],
                                                                                pm[path + ".lora_A.weight"]);
      EXPECT_LE((pb[path + ".weight"] - expect).abs().max().item<double>(), 1e-6) << path;
    }
    EXPECT_TRUE(torch::equal(pb["model.layers.0.self_attn.k_proj.weight"],
                             pm["model.layers.0.self_attn.k_proj.weight"]));
    // The merged model computes what the adapted one does.
    const torch::Tensor ids = Ids();
    EXPECT_LE((Logits(m, ids) - Logits(base, ids)).abs().max().item<double>(), 1e-4);
  }
}

TEST(Lora, LossFallsResumesExactlyAndExportsMerged) {
  const std::string dir = MakeTempDir("lora-train");
  auto spec_for = [&](const std::string& sub) {
    JobSpec s = TinySpec(dir + "/" + sub, 24);
    s.lora = Spec({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, 8, 16);
    s.train.lr = 2e-2;
    // A frozen base with HF's tiny init (0.02) and frozen final norm bounds the logits to about
    // +-0.6 at hidden 32, so no adapter could lower the loss much; a wider init stands in for a
    // pretrained base whose embeddings carry signal.
    s.model.config["initializer_range"] = 0.3;
    s.checkpoint.interval = 12;
    s.eval.exact_match = false;
    return s;
  };
  JobSpec full = spec_for("full");
  auto r_full = Train(full, {});
  ASSERT_TRUE(r_full.ok()) << r_full.status().ToString();
  const auto losses = StepLosses(full.output_dir);
  ASSERT_EQ(losses.size(), 24u);
  const double first = (losses[0] + losses[1] + losses[2]) / 3,
               last = (losses[21] + losses[22] + losses[23]) / 3;
  std::printf("[lora] TinySpec loss %.4f -> %.4f over 24 steps\n", first, last);
  EXPECT_LT(last, 0.75 * first);
  EXPECT_LT(last, 0.6 * std::log(258.0));  // well below a uniform guess over the byte vocabulary
  const std::string ckpt = full.output_dir + "/checkpoint-000024";
  EXPECT_TRUE(fs::exists(ckpt + "/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(ckpt + "/adapter_config.json"));
  EXPECT_TRUE(fs::exists(ckpt + "/model.safetensors"));  // from-scratch base is saved too
  for (const auto& r : ReadMetrics(full.output_dir + "/metrics.jsonl")) {
    if (r["event"] == "start") {
      EXPECT_LT(r["trainable_parameters"].get<int64_t>(), r["parameters"].get<int64_t>());
    }
  }
  // The base weights did not move.
  auto w12 = LoadTensors(full.output_dir + "/checkpoint-000012/model.safetensors");
  auto w24 = LoadTensors(ckpt + "/model.safetensors");
  ASSERT_TRUE(w12.ok() && w24.ok());
  for (const auto& [name, t] : *w12) EXPECT_TRUE(torch::equal(t, w24->at(name))) << name;

  // Interrupted at 12 and resumed: the same losses and adapter, bit for bit.
  JobSpec part = spec_for("part");
  TrainOptions stop;
  stop.hooks.stop_after_step = 12;
  ASSERT_TRUE(Train(part, stop).ok());
  auto r2 = Train(part, {});
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->resumed_from_step, 12);
  const auto losses_part = StepLosses(part.output_dir);
  ASSERT_EQ(losses_part.size(), 24u);
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(losses[i], losses_part[i]) << "step " << i + 1;
  auto a_full = LoadTensors(ckpt + "/adapter_model.safetensors");
  auto a_part = LoadTensors(part.output_dir + "/checkpoint-000024/adapter_model.safetensors");
  ASSERT_TRUE(a_full.ok() && a_part.ok());
  for (const auto& [name, t] : *a_full) EXPECT_TRUE(torch::equal(t, a_part->at(name))) << name;

  // export --merge: a plain HF folder whose logits equal the adapted model's.
  ExportOptions ex;
  ex.model_dir = ckpt;
  ex.adapter_dir = ckpt;
  ex.merge = true;
  ex.out_dir = dir + "/merged";
  Status s = ExportModel(ex);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(fs::exists(ex.out_dir + "/adapter_config.json"));
  EXPECT_TRUE(fs::exists(ex.out_dir + "/generation_config.json"));
  EXPECT_TRUE(fs::exists(ex.out_dir + "/sftctl_tokenizer.json"));
  auto merged = LoadModelDir(ex.out_dir);
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  auto adapted = LoadModelMaybeAdapter(ckpt);
  ASSERT_TRUE(adapted.ok()) << adapted.status().ToString();
  const torch::Tensor ids = torch::randint(0, 200, {2, 16}, torch::TensorOptions().dtype(torch::kInt64));
  CausalLM mm = *merged, am = *adapted;
  EXPECT_LE((Logits(mm, ids) - Logits(am, ids)).abs().max().item<double>(), 1e-4);
  EXPECT_EQ(ExportModel(ex).code(), StatusCode::kAlreadyExists);

  // eval on the merged and on the adapted model agree; the dump holds the first batch.
  EvalModelOptions eo;
  eo.model_dir = ex.out_dir;
  eo.data_file = dir + "/full/data/eval.jsonl";
  eo.dump_logits = dir + "/logits.safetensors";
  eo.batch_size = 4;
  // fp32 on any device: on CUDA the default (auto) runs under bf16 autocast, where W + sBA and
  // W x + sB(A x) round differently (8e-4 apart on an H100).
  eo.precision = "fp32";
  auto e1 = EvalModel(eo);
  ASSERT_TRUE(e1.ok()) << e1.status().ToString();
  eo.model_dir = ckpt;
  eo.dump_logits.clear();
  auto e2 = EvalModel(eo);
  ASSERT_TRUE(e2.ok()) << e2.status().ToString();
  EXPECT_EQ(e1->samples, 16);
  EXPECT_NEAR(e1->loss, e2->loss, 1e-5);
  EXPECT_NEAR(e1->perplexity, std::exp(e1->loss), 1e-9);
  auto dump = LoadTensors(dir + "/logits.safetensors");
  ASSERT_TRUE(dump.ok());
  EXPECT_EQ(dump->at("logits").size(0), 4);
  EXPECT_EQ(dump->at("logits").size(2), mm->config().vocab_size);
  EXPECT_EQ(dump->at("input_ids").sizes(), dump->at("labels").sizes());
}

}  // namespace
}  // namespace sftctl::trainer
