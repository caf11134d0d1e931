// Parity with the real transformers package: every model family sftctl loads, built, initialised,
// saved and run by transformers itself (tests/reference/transformers_reference.py, which runs where
// transformers is installed: the forky root of tests/portability/forky_trainer_check.sh). The
// checkpoints are transformers' own files (config.json as transformers 5 writes it: rope_parameters,
// layer_types, tied weights left out); logits reach ~30 to ~90, soft-caps cap, windows are shorter
// than the sequence (the script checks that each feature moves the logits).
//
// Reference folder: $SFTCTL_TRANSFORMERS_REFERENCE, else <build>/transformers-reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/trainer/hf_parity.h"
#include "trainer/model/lora.h"

namespace sftctl::trainer {
namespace {

using testing::LogitsOf;
using testing::MaxAbs;
using testing::Reference;

// The bar, at a logit scale of 30 (the script scales the final norm to it), in fp32:
//  - sftctl is as exact as transformers: its logits' distance from the float64 forward is at most
//    kExactnessRatio x transformers' own fp32 distance from it, or kExactTolerance, whichever is larger;
//  - sftctl's logits are within kLogitTolerance of transformers' fp32 logits, and every argmax is the same.
// Each fp32 forward is 0.6e-5 to 2.2e-5 from the float64 one (measured on these checkpoints), so two
// of them may differ by a little more than 2e-5: transformers' own eager and sdpa paths, or the
// same path on 1 and 4 threads, differ by up to 2.1e-5 here.
constexpr double kExactTolerance = 2e-5;
constexpr double kExactnessRatio = 1.5;
constexpr double kLogitTolerance = 3e-5;
constexpr double kLossRelTolerance = 1e-6;

std::string ReferenceDir() {
  const char* env = std::getenv("SFTCTL_TRANSFORMERS_REFERENCE");
  return env && *env ? env : std::string(SFTCTL_BUILD_DIR) + "/transformers-reference";
}

// Positions whose argmax differs between `logits` and `want` ([B, T, V] each).
int64_t ArgmaxDisagreements(const torch::Tensor& logits, const torch::Tensor& want) {
  return logits.argmax(-1).ne(want.argmax(-1)).sum().item<int64_t>();
}

// The logits of `ids` against transformers' (`want`) and, when given, the float64 forward's (`exact`).
void CheckLogits(CausalLM& model, const torch::Tensor& ids, const torch::Tensor& want,
                 const torch::Tensor& exact, const std::string& what) {
  const torch::Tensor logits = LogitsOf(model, ids);
  ASSERT_EQ(logits.sizes(), want.sizes()) << what;
  const double max_abs = MaxAbs(logits, want);
  std::printf("[transformers] %s: logits max-abs error %.3g (|max| %.1f)", what.c_str(), max_abs,
              want.abs().max().item<double>());
  EXPECT_LE(max_abs, kLogitTolerance) << what;
  EXPECT_EQ(ArgmaxDisagreements(logits, want), 0) << what;
  if (exact.defined()) {
    const double ours = MaxAbs(logits, exact), theirs = MaxAbs(want, exact);
    std::printf("; from float64: sftctl %.3g, transformers %.3g", ours, theirs);
    EXPECT_LE(ours, std::max(kExactTolerance, kExactnessRatio * theirs))
        << what << ": transformers' is " << theirs;
  }
  std::printf("\n");
}

class TransformersParity : public ::testing::TestWithParam<const char*> {};

// Logits (fused CPU kernels and the composite path), argmax, and the loss with the plain and the
// chunked loss head, against transformers' eager forward in fp32 and its float64 forward. Then the
// model is saved into <family>/sftctl-saved, which transformers_reference.py --check-saved loads.
TEST_P(TransformersParity, LogitsArgmaxAndLossMatchTransformers) {
  const std::string family = GetParam();
  Reference r = testing::LoadReferenceFrom(
      ReferenceDir() + "/" + family,
      "run python3 tests/reference/transformers_reference.py --out " + ReferenceDir() +
          " where transformers is installed (tests/portability/forky_trainer_check.sh does)");
  ASSERT_TRUE(r.model);
  const torch::Tensor ids = r.tensors.at("input_ids"), labels = r.tensors.at("labels");
  const int64_t targets = labels.slice(1, 1).ne(-100).sum().item<int64_t>();
  const double want_loss = r.tensors.at("loss").item<double>();
  for (bool fused_on : {true, false}) {
    fused::SetEnabled(fused_on);
    const std::string what = family + (fused_on ? " (fused)" : " (composite)");
    CheckLogits(r.model, ids, r.tensors.at("logits"), r.tensors.at("logits_fp64"), what);
    if (r.tensors.count("short_logits")) {  // at most original_max_position_embeddings: short factors
      CheckLogits(r.model, r.tensors.at("short_input_ids"), r.tensors.at("short_logits"), torch::Tensor(),
                  what + " short factors");
    }
    for (int64_t chunk : {0, 7}) {
      torch::NoGradGuard no_grad;
      r.model->SetLossChunkTokens(chunk);
      const double loss = r.model->LossSum(ids, labels).item<double>() / static_cast<double>(targets);
      std::printf("[transformers] %s chunk %lld: loss %.7f vs %.7f\n", what.c_str(),
                  static_cast<long long>(chunk), loss, want_loss);
      EXPECT_LE(std::abs(loss - want_loss) / std::abs(want_loss), kLossRelTolerance)
          << what << " chunk " << chunk;
    }
    r.model->SetLossChunkTokens(0);
  }
  fused::SetEnabled(true);
  // What sftctl writes back, for transformers to load (transformers_reference.py --check-saved).
  NamedTensors params;
  for (const auto& p : r.model->named_parameters()) params.emplace_back(p.key(), p.value());
  const std::string saved = ReferenceDir() + "/" + family + "/sftctl-saved";
  const Status st = SaveHfModel(FileSystem::Default(), saved, r.model->config(), params);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A LoRA adapter on every projection, B drawn non-zero (PEFT starts it at zero), saved as the trainer
// saves one (SaveAdapter: PEFT's key names and adapter_config.json) into <family>/sftctl-lora with
// sftctl's adapted logits; transformers_reference.py --check-saved applies the adapter's tensors to
// transformers' model by their PEFT names (W + s B A on the module each names) and must get them.
// Odd families use rsLoRA's scale (alpha / sqrt(r)).
TEST_P(TransformersParity, LoraAdapterSavedForTransformersModules) {
  const std::string family = GetParam();
  const std::string dir = ReferenceDir() + "/" + family;
  Reference r = testing::LoadReferenceFrom(dir, "run tests/reference/transformers_reference.py first");
  ASSERT_TRUE(r.model);
  LoraSpec spec;
  spec.r = 4;
  spec.alpha = 6;
  spec.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  spec.use_rslora = family.size() % 2 == 1;
  ASSERT_TRUE(testing::ApplyDrawnLora(r.model, spec, 17).ok());
  r.model->eval();
  const torch::Tensor ids = r.tensors.at("input_ids");
  const torch::Tensor adapted = LogitsOf(r.model, ids);
  EXPECT_GT(MaxAbs(adapted, r.tensors.at("logits")), 1e-2) << "the adapter must change the logits";
  const std::string out = dir + "/sftctl-lora";
  ASSERT_TRUE(FileSystem::Default()->CreateDirs(out).ok());
  const Status saved = SaveAdapter(FileSystem::Default(), out, r.model, spec, dir);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  ASSERT_TRUE(
      SaveTensors(FileSystem::Default(), out + "/sftctl_logits.safetensors", {{"logits", adapted}}).ok());
}

// The families of transformers_reference.py's FAMILIES, each a checkpoint transformers wrote.
INSTANTIATE_TEST_SUITE_P(Families, TransformersParity,
                         ::testing::Values("llama", "qwen2", "qwen3", "qwen3_untied", "mistral",
                                           "mistral_full", "gemma2", "gemma3_text", "gemma3_nested", "phi3",
                                           "phi3_longrope", "gemma3_vision"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace sftctl::trainer
