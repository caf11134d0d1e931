// Parity with tests/reference/hf_reference.py (transformers' math, random-init checkpoints written by
// the hf_reference fixture into <build>/hf-reference/<family>): the checks each model family's test
// runs (gemma_test, phi3_test).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/formats/safetensors.h"
#include "tests/util/test_paths.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/model/fused_ops.h"
#include "trainer/model/lora.h"
#include "trainer/model/model.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer::testing {

inline std::string HfReferenceDir() { return std::string(SFTCTL_BUILD_DIR) + "/hf-reference"; }

// One family's reference: its checkpoint loaded, and its tensors: input_ids, labels, logits, loss
// (and short_input_ids / short_logits for longrope's short factors).
struct Reference {
  CausalLM model{nullptr};
  std::map<std::string, torch::Tensor> tensors;
};

// The reference in folder `dir`; `how` says how to make it when it is missing.
inline Reference LoadReferenceFrom(const std::string& dir, const std::string& how) {
  EXPECT_TRUE(std::filesystem::exists(dir + "/reference.safetensors")) << dir << ": " << how;
  Reference r;
  auto ref = LoadTensors(dir + "/reference.safetensors");
  EXPECT_TRUE(ref.ok()) << ref.status().ToString();
  if (ref.ok()) r.tensors.insert(ref->begin(), ref->end());
  auto loaded = LoadModelDir(dir);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  if (loaded.ok()) r.model = *loaded;
  return r;
}

inline Reference LoadReference(const std::string& family) {
  return LoadReferenceFrom(
      HfReferenceDir() + "/" + family,
      "run the hf_reference fixture (ctest) or tests/reference/hf_reference.py --out " + HfReferenceDir());
}

inline double MaxAbs(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max().item<double>();
}

// Name -> shape of every tensor of safetensors file `path` (empty, with a failure, when unreadable).
inline std::map<std::string, std::vector<int64_t>> TensorShapes(const std::string& path) {
  std::map<std::string, std::vector<int64_t>> shapes;
  auto reader = safetensors::Reader::Open(path);
  EXPECT_TRUE(reader.ok()) << path << ": " << reader.status().ToString();
  if (reader.ok()) {
    for (const auto& t : (*reader)->tensors()) shapes[t.name] = t.shape;
  }
  return shapes;
}

// Saves `model` as an HF folder `out` (SaveHfModel, dtypes as they are) and returns the shapes its
// model.safetensors holds.
inline std::map<std::string, std::vector<int64_t>> SaveAndListTensors(CausalLM& model,
                                                                      const std::string& out) {
  NamedTensors params;
  for (const auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
  const Status st = SaveHfModel(FileSystem::Default(), out, model->config(), params);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return TensorShapes(out + "/model.safetensors");
}

// The model of `c` holding `from`'s weights.
inline CausalLM CopyWithConfig(CausalLM& from, const ModelConfig& c) {
  CausalLM to(c);
  torch::NoGradGuard no_grad;
  auto params = from->named_parameters();
  for (auto& p : to->named_parameters()) p.value().copy_(params[p.key()]);
  to->eval();
  return to;
}

// Applies `spec` to `model` (its A matrices drawn after manual_seed(seed)) and draws every lora_B
// from N(0, 0.2): an adapter that changes the logits (PEFT's B starts at zero).
inline Status ApplyDrawnLora(CausalLM& model, const LoraSpec& spec, uint64_t seed) {
  torch::manual_seed(seed);
  SFT_RETURN_IF_ERROR(ApplyLora(model, spec));
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters())
    if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0.0, 0.2);
  return OkStatus();
}

inline torch::Tensor LogitsOf(CausalLM& m, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  return m->Logits(m->Hidden(ids));
}

// "ok", or the error ParseModelConfig gives `j`.
inline std::string ConfigError(const nlohmann::json& j) {
  auto c = ParseModelConfig(j, "cfg.json");
  return c.ok() ? "ok" : c.status().message();
}

// Logits max-abs error <= 1e-4 and loss relative error <= 1e-5, with the plain and the chunked loss
// head (7 rows a chunk), on the fused CPU kernels and on the composite path; and the short-factor
// logits where the reference has them.
inline void CheckParity(const std::string& family) {
  Reference r = LoadReference(family);
  ASSERT_TRUE(r.model);
  const torch::Tensor ids = r.tensors.at("input_ids"), labels = r.tensors.at("labels");
  const int64_t targets = labels.slice(1, 1).ne(-100).sum().item<int64_t>();
  const double ref_loss = r.tensors.at("loss").item<double>();
  for (bool fused_on : {true, false}) {
    fused::SetEnabled(fused_on);
    torch::NoGradGuard no_grad;
    const double max_abs = MaxAbs(LogitsOf(r.model, ids), r.tensors.at("logits"));
    for (int64_t chunk : {0, 7}) {
      r.model->SetLossChunkTokens(chunk);
      const double loss = r.model->LossSum(ids, labels).item<double>() / static_cast<double>(targets);
      const double rel = std::abs(loss - ref_loss) / std::abs(ref_loss);
      std::printf("[parity] %s (%s, chunk %lld): logits max-abs error %.3g, loss %.7f vs %.7f\n",
                  family.c_str(), fused_on ? "fused" : "composite", static_cast<long long>(chunk), max_abs,
                  loss, ref_loss);
      EXPECT_LE(rel, 1e-5) << family << " chunk " << chunk;
    }
    r.model->SetLossChunkTokens(0);
    EXPECT_LE(max_abs, 1e-4) << family << (fused_on ? " fused" : " composite");
    if (r.tensors.count("short_logits")) {  // at most original_max_position_embeddings: short factors
      const double short_abs =
          MaxAbs(LogitsOf(r.model, r.tensors.at("short_input_ids")), r.tensors.at("short_logits"));
      std::printf("[parity] %s (%s) short factors: logits max-abs error %.3g\n", family.c_str(),
                  fused_on ? "fused" : "composite", short_abs);
      EXPECT_LE(short_abs, 1e-4) << family << " short factors";
    }
  }
  fused::SetEnabled(true);
}

}  // namespace sftctl::trainer::testing
