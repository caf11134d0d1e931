// Loading model.path without a host copy of the model (issue 25): the parameters are allocated where
// and in the dtype they train in before any weight is read, and each tensor of the files is copied
// straight into its parameter. Checked structurally (dtypes, values, no RNG draws) and by this
// process's peak resident set while a ~160 MB (fp32) model loads: a LoRA model with a bf16 base
// must grow the host by well under the fp32 size, a full fine-tune by well under twice it (the old
// path held the fp32 model and the file's mapped pages at once).
#include <gtest/gtest.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <map>
#include <string>

#include "common/os/file_system.h"
#include "common/os/host_memory.h"
#include "tests/trainer/test_util.h"
#include "tests/util/temp_dir.h"
#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/model/lora.h"
#include "trainer/model/model.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using sftctl::testing::TempDir;

// 8 layers, hidden 512, untied vocab 8192: about 40M parameters, 160 MB in fp32, no tensor above 17 MB.
ModelConfig LoadConfig() {
  auto c = ParseModelConfig(sftctl::testing::TinyDecoderConfig("llama", 8192, 512, 2048, /*tied=*/false, 8),
                            "model_load_test");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return *c;
}

int64_t Fp32Bytes(CausalLM& m) {
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel() * 4;
  return n;
}

// A random-init checkpoint of LoadConfig() in `dtype`, written into `dir`; returns the fp32 size.
int64_t WriteCheckpoint(const std::string& dir, torch::ScalarType dtype) {
  const ModelConfig c = LoadConfig();
  int64_t fp32_bytes = 0;
  {
    torch::manual_seed(5);
    CausalLM m(c);
    fp32_bytes = Fp32Bytes(m);
    NamedTensors w;
    for (const auto& p : m->named_parameters()) w.emplace_back(p.key(), p.value());
    HfSaveOptions o;
    o.dtype = dtype;
    Status s = SaveHfModel(FileSystem::Default(), dir, c, w, o);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
#if defined(__GLIBC__)
  malloc_trim(0);  // the writer's freed model must not be resident memory that the load reuses
#endif
  return fp32_bytes;
}

// Starts a new peak; returns the resident set it starts from (0 where the peak cannot be reset).
int64_t StartPeak() {
  torch::Tensor warm = torch::ones({1024}).to(torch::kBFloat16).sum();  // lazy runtime state first
  (void)warm;
  return ResetPeakResident() ? ResidentBytes() : 0;
}

TEST(ModelLoad, LoadedConstructionDrawsNothingAndMatchesTheRandomLayout) {
  const ModelConfig c = LoadConfig();
  torch::manual_seed(11);
  const torch::Tensor expected = torch::rand({4});
  torch::manual_seed(11);
  CausalLM loaded(c, CausalLMImpl::Init::kLoaded);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected)) << "Init::kLoaded drew from the RNG";
  CausalLM random(c);
  auto want = random->named_parameters();
  ASSERT_EQ(loaded->named_parameters().size(), want.size());
  for (const auto& p : loaded->named_parameters()) {
    ASSERT_TRUE(want.contains(p.key())) << p.key();
    EXPECT_EQ(p.value().sizes(), want[p.key()].sizes()) << p.key();
    EXPECT_EQ(p.value().scalar_type(), torch::kFloat32) << p.key();
  }
}

TEST(ModelLoad, LoraBaseLoadsStraightIntoBf16) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/model";
  const int64_t fp32_bytes = WriteCheckpoint(dir, torch::kBFloat16);
  const int64_t start = StartPeak();
  auto loaded = LoadModelDir(dir, {torch::kCPU, torch::kBFloat16});
  const int64_t growth = PeakResidentBytes() - start;
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  CausalLM m = *loaded;
  LoraSpec spec;
  spec.target_modules = {"q_proj", "v_proj", "down_proj"};
  ASSERT_TRUE(ApplyLora(m, spec).ok());
  EXPECT_EQ(StoreFrozenBase(m, torch::kBFloat16), 0) << "the loaded base is already stored in bf16";

  // The same dtypes as the old path (fp32 model, then StoreFrozenBase), and the file's exact values.
  CausalLM old(LoadConfig());
  ASSERT_TRUE(ApplyLora(old, spec).ok());
  StoreFrozenBase(old, torch::kBFloat16);
  auto want = old->named_parameters();
  auto file = LoadTensors(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  int64_t bf16 = 0;
  for (const auto& p : m->named_parameters()) {
    ASSERT_TRUE(want.contains(p.key())) << p.key();
    EXPECT_EQ(p.value().scalar_type(), want[p.key()].scalar_type()) << p.key();
    EXPECT_EQ(p.value().requires_grad(), want[p.key()].requires_grad()) << p.key();
    bf16 += p.value().scalar_type() == torch::kBFloat16;
    if (p.value().requires_grad()) continue;  // an adapter: not in the base's file
    auto it = file->find(p.key());
    ASSERT_NE(it, file->end()) << p.key();
    EXPECT_TRUE(torch::equal(p.value().to(it->second.scalar_type()), it->second)) << p.key();
  }
  EXPECT_EQ(bf16, 2 + 7 * 8) << "embedding, lm_head and 7 projections per layer";

  if (start == 0) GTEST_SKIP() << "this system cannot reset the peak resident set";
  // Now: the bf16 base (half of fp32_bytes) plus one tensor in flight. Before: the whole fp32
  // model, and the file's pages besides.
  EXPECT_LT(growth, fp32_bytes * 3 / 4) << "peak growth " << growth << " bytes, fp32 model " << fp32_bytes;
  EXPECT_GT(growth, fp32_bytes * 2 / 5) << "the bf16 base itself must be resident";
}

TEST(ModelLoad, FullFineTuneLoadsWithoutASecondCopy) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/model";
  const int64_t fp32_bytes = WriteCheckpoint(dir, torch::kFloat32);
  const int64_t start = StartPeak();
  auto loaded = LoadModelDir(dir);
  const int64_t growth = PeakResidentBytes() - start;
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  CausalLM m = *loaded;
  auto file = LoadTensors(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  for (const auto& p : m->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), torch::kFloat32) << p.key();
    ASSERT_TRUE(file->count(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), file->at(p.key()))) << p.key();
  }
  if (start == 0) GTEST_SKIP() << "this system cannot reset the peak resident set";
  // Now: the fp32 model plus about one tensor of the file. Before: the model and the whole
  // file's mapped pages (another fp32 model).
  EXPECT_LT(growth, fp32_bytes * 5 / 4) << "peak growth " << growth << " bytes, fp32 model " << fp32_bytes;
  EXPECT_GT(growth, fp32_bytes * 9 / 10) << "the fp32 model itself must be resident";
}

}  // namespace
}  // namespace sftctl::trainer
