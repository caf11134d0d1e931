// The CUDA path's policies, tested on the CPU (issue 25): which GPU each rank of a launcher takes,
// the warning when `device: auto` cannot use the GPUs the driver reports, the RNG streams in the
// checkpoint format (CUDA streams included, old checkpoints still read), the AdamW kernel per device
// and its numerics against the CPU's fused loop, NCCL without a GPU, and the spec's new knobs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <cstdlib>

#include "common/spec/spec.h"
#include "tests/trainer/test_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/optimizer.h"
#include "trainer/runtime/device.h"
#include "trainer/runtime/rng_state.h"
#include "trainer/runtime/tensor_io.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// ---- Which device each rank asks for --------------------------------------------------------

TEST(RankDevice, SingleProcessKeepsTheSpecsDevice) {
  for (const char* d : {"auto", "cpu", "cuda", "cuda:3", "mps"}) {
    auto got = RankDevice(d, /*world_size=*/1, 0, 1, /*cuda_visible=*/4);
    ASSERT_TRUE(got.ok()) << d;
    EXPECT_EQ(*got, d);
  }
}

TEST(RankDevice, EveryRankSeesAllGpusTakesItsLocalRank) {
  // 8 ranks on a host whose 8 GPUs every rank sees (sftd, torchrun).
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(*RankDevice("cuda", 8, r, 8, 8), "cuda:" + std::to_string(r));
    EXPECT_EQ(*RankDevice("auto", 8, r, 8, 8), "cuda:" + std::to_string(r));
  }
  // Two hosts of 4 ranks each: LOCAL_RANK, not RANK.
  EXPECT_EQ(*RankDevice("cuda", 8, 2, 4, 4), "cuda:2");
}

TEST(RankDevice, OneGpuShownPerRankTakesCudaZero) {
  // Slurm --gpus-per-task=1 / CUDA_VISIBLE_DEVICES per rank: each rank sees one GPU.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(*RankDevice("cuda", 4, r, 4, 1), "cuda:0") << r;
    EXPECT_EQ(*RankDevice("auto", 4, r, 4, 1), "cuda:0") << r;
  }
  // Two GPUs shown to each of 4 ranks: its own first GPU, never cuda:3 (which it cannot see).
  EXPECT_EQ(*RankDevice("cuda", 4, 3, 4, 2), "cuda:0");
}

TEST(RankDevice, AutoWithoutCudaAndCpuStayAsTheyAre) {
  EXPECT_EQ(*RankDevice("auto", 2, 1, 2, 0), "auto");
  EXPECT_EQ(*RankDevice("cpu", 2, 1, 2, 8), "cpu");
}

TEST(RankDevice, ExplicitGpuWithSeveralRanksOnAHostIsAnErrorNamingTheField) {
  EXPECT_THAT(
      RankDevice("cuda:1", 4, 0, 4, 4),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'device': 'cuda:1' would put all 4 ranks")));
  // One rank per host (multi-node): the host's cuda:N is a choice, not a collision.
  EXPECT_EQ(*RankDevice("cuda:1", 4, 0, 1, 2), "cuda:1");
}

// ---- device: auto that cannot use the driver's GPUs ----------------------------------------

TEST(CudaFallbackWarning, NothingToSayWithoutDriverGpusOrWhenLibTorchUsesThem) {
  EXPECT_EQ(CudaFallbackWarning(0, 12040, 12040, false), "");
  EXPECT_EQ(CudaFallbackWarning(2, 12040, 12040, true), "");
}

TEST(CudaFallbackWarning, NewerLibTorchThanDriverNamesBothVersions) {
  const std::string w = CudaFallbackWarning(1, 12040, 13000, false);
  EXPECT_THAT(w, HasSubstr("reports 1 GPU(s)"));
  EXPECT_THAT(w, HasSubstr("driver supports CUDA up to 12.4"));
  EXPECT_THAT(w, HasSubstr("built for CUDA 13.0, newer than the driver supports"));
  EXPECT_THAT(w, HasSubstr("Update the NVIDIA driver, or build against a LibTorch for CUDA 12.x"));
}

TEST(CudaFallbackWarning, CpuOnlyLibTorchSaysSo) {
  const std::string w = CudaFallbackWarning(8, 12080, std::nullopt, false);
  EXPECT_THAT(w, HasSubstr("reports 8 GPU(s) (its driver supports CUDA up to 12.8)"));
  EXPECT_THAT(w, HasSubstr("this LibTorch was built without CUDA"));
}

TEST(CudaFallbackWarning, SameMajorButUnusableSaysWhatToCheck) {
  const std::string w = CudaFallbackWarning(1, 12080, 12040, false);
  EXPECT_THAT(w, HasSubstr("built for CUDA 12.4 and could not initialise it"));
  EXPECT_THAT(w, Not(HasSubstr("newer than the driver")));
  EXPECT_EQ(CudaVersionText(11080), "11.8");
}

// ---- RNG streams in the checkpoint -----------------------------------------------------------

TEST(RngState, CpuStreamRestoresTheSameDraws) {
  const RngState saved = CaptureRng(torch::kCPU);
  EXPECT_FALSE(saved.cuda.defined());  // off CUDA, no CUDA stream
  const torch::Tensor first = torch::rand({16});
  RestoreRng(saved, torch::kCPU);
  EXPECT_TRUE(torch::equal(torch::rand({16}), first));
}

TEST(RngState, FormatRoundTripsThroughTheCheckpointFile) {
  sftctl::testing::TempDir dir("rng-format");
  // Rank 0 and 1 on CUDA (a stand-in 16-byte CUDA state: seed and offset), rank 2's CUDA state
  // missing: every stream comes back under its own key, absent ones stay absent.
  std::vector<RngState> ranks(3);
  for (int r = 0; r < 3; ++r) ranks[r].cpu = torch::full({8}, r + 1, torch::kUInt8);
  ranks[0].cuda = torch::arange(16, torch::kUInt8);
  ranks[1].cuda = torch::arange(16, 32, torch::kUInt8);
  const NamedTensors entries = RngTensors(ranks);
  std::vector<std::string> keys;
  for (const auto& [k, t] : entries) keys.push_back(k);
  EXPECT_THAT(keys, ::testing::ElementsAre("rng.cpu", "rng.cuda", "rng.cpu.rank1", "rng.cuda.rank1",
                                           "rng.cpu.rank2"));
  const std::string path = dir.path() + "/optimizer.safetensors";
  ASSERT_TRUE(SaveTensors(FileSystem::Default(), path, entries).ok());
  auto loaded = LoadTensors(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  for (int r = 0; r < 3; ++r) {
    const RngState got = FindRng(*loaded, r);
    ASSERT_TRUE(got.cpu.defined()) << r;
    EXPECT_TRUE(torch::equal(got.cpu, ranks[r].cpu)) << r;
    ASSERT_EQ(got.cuda.defined(), ranks[r].cuda.defined()) << r;
    if (got.cuda.defined()) {
      EXPECT_TRUE(torch::equal(got.cuda, ranks[r].cuda)) << r;
    }
  }
  EXPECT_FALSE(FindRng(*loaded, 3).cpu.defined());
}

TEST(RngState, TrainerStateCarriesTheFormatAndReadsOldCheckpoints) {
  TrainerState s;
  s.step = 7;
  const nlohmann::json j = s.ToJson();
  EXPECT_EQ(j.at("rng_format"), kRngFormat);
  auto back = TrainerState::FromJson(j, "trainer_state.json");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->rng_format, kRngFormat);
  // Written before CUDA streams were saved: no field, format 1.
  nlohmann::json old = j;
  old.erase("rng_format");
  auto old_state = TrainerState::FromJson(old, "trainer_state.json");
  ASSERT_TRUE(old_state.ok());
  EXPECT_EQ(old_state->rng_format, 1);
  EXPECT_EQ(old_state->step, 7);
  nlohmann::json future = j;
  future["rng_format"] = kRngFormat + 1;
  EXPECT_THAT(TrainerState::FromJson(future, "ckpt/trainer_state.json"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ckpt/trainer_state.json: field 'rng_format': 3")));
}

// A CPU run through the trainer: format 2, the CPU stream only; a checkpoint of format 1 (no
// rng_format) still resumes. deterministic: true on the CPU trains as usual.
TEST(RngState, CpuRunWritesFormatTwoWithoutCudaStreamsAndOldCheckpointsResume) {
  const std::string dir = sftctl::testing::MakeTempDir("rng-run");
  JobSpec spec = sftctl::testing::TinySpec(dir, 2);
  spec.device = "cpu";  // a test about the CPU pins it (device auto trains on a GPU where there is one)
  spec.threads = 1;
  spec.deterministic = true;
  spec.eval.exact_match = false;
  auto first = Train(spec, TrainOptions());
  at::globalContext().setDeterministicAlgorithms(false, false);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string ckpt = spec.output_dir + "/checkpoint-000002";
  auto tensors = LoadTensors(ckpt + "/optimizer.safetensors");
  ASSERT_TRUE(tensors.ok()) << tensors.status().ToString();
  EXPECT_EQ(tensors->count("rng.cpu"), 1u);
  for (const auto& [k, t] : *tensors) EXPECT_EQ(k.rfind("rng.cuda", 0), std::string::npos) << k;
  auto state = ReadTrainerState(ckpt);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->rng_format, kRngFormat);

  nlohmann::json old = state->ToJson();
  old.erase("rng_format");
  sftctl::testing::WriteWholeFile(ckpt + "/trainer_state.json", old.dump(2));
  spec.deterministic = false;
  spec.train.max_steps = 3;
  auto resumed = Train(spec, TrainOptions());
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->resumed_from_step, 2);
  EXPECT_EQ(resumed->steps, 3);
  auto next = ReadTrainerState(spec.output_dir + "/checkpoint-000003");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->rng_format, kRngFormat);  // rewritten in the current format
}

// ---- AdamW kernels ---------------------------------------------------------------------------

TEST(AdamWKernel, CpuKeepsItsFusedLoopCudaTakesLibTorchsFusedKernel) {
  EXPECT_EQ(PickAdamWKernel(torch::kCPU, true), AdamWKernel::kCpuFused);
  EXPECT_EQ(PickAdamWKernel(torch::kCPU, false), AdamWKernel::kCpuFused);
  EXPECT_EQ(PickAdamWKernel(torch::Device(torch::kCUDA, 0), true), AdamWKernel::kTorchFused);
  EXPECT_EQ(PickAdamWKernel(torch::Device(torch::kCUDA, 0), false), AdamWKernel::kOps);
  // CUDA builds of LibTorch 2.x have the fused kernel.
  EXPECT_EQ(TorchFusedAdamWRuns(torch::Device(torch::kCUDA, 0)), TORCH_VERSION_MAJOR >= 2);
}

// Runs `steps` AdamW steps with `kernel` on a copy of the same parameters and gradients (two
// groups: with and without weight decay); returns the parameters, moments and last gradient norm.
struct AdamWRun {
  std::vector<torch::Tensor> state;
  double grad_norm = 0;
};

AdamWRun RunAdamW(AdamWKernel kernel, int steps) {
  torch::manual_seed(42);
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const char* name : {"layer.weight", "layer.bias", "proj.weight"}) {
    const bool matrix = std::string(name).find("weight") != std::string::npos;
    params.emplace_back(name, (matrix ? torch::randn({17, 9}) : torch::randn({9})).requires_grad_(true));
  }
  TrainSpec t;
  t.weight_decay = 0.1;
  FlatAdamW opt(
      params, t, [](const std::string& n, const torch::Tensor& p) { return p.dim() == 2; }, kernel);
  EXPECT_EQ(opt.kernel(), kernel);
  AdamWRun out;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(100 + s);
    for (auto& [n, p] : params) p.mutable_grad().copy_(torch::randn(p.sizes()) * (s + 1));
    out.grad_norm = opt.GradNorm().item<double>();
    opt.Step(1e-2 * (s + 1));
  }
  out.state = opt.StateBuffers();
  return out;
}

void ExpectSameRun(const AdamWRun& a, const AdamWRun& b) {
  ASSERT_EQ(a.state.size(), b.state.size());
  for (size_t i = 0; i < a.state.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a.state[i], b.state[i], /*rtol=*/1e-5, /*atol=*/1e-6))
        << "buffer " << i << " differs by " << (a.state[i] - b.state[i]).abs().max().item<double>();
  }
  EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * a.grad_norm);
}

// The plain-ops update (CUDA without LibTorch's fused kernel) and its per-buffer norm, on the CPU.
TEST(AdamWKernel, OpsPathMatchesTheCpuFusedLoop) {
  const AdamWRun cpu = RunAdamW(AdamWKernel::kCpuFused, 5);
  const AdamWRun ops = RunAdamW(AdamWKernel::kOps, 5);
  ExpectSameRun(cpu, ops);
  EXPECT_GT(cpu.grad_norm, 0);
}

// LibTorch's fused AdamW (what CUDA runs) on the CPU, where LibTorch 2.4+ has a CPU kernel for it.
TEST(AdamWKernel, TorchFusedMatchesTheCpuFusedLoop) {
  if (!TorchFusedAdamWRuns(torch::kCPU))
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no CPU kernel for at::_fused_adamw_ (2.4+)";
  ExpectSameRun(RunAdamW(AdamWKernel::kCpuFused, 5), RunAdamW(AdamWKernel::kTorchFused, 5));
}

// ---- deterministic: true ----------------------------------------------------------------------

TEST(Determinism, OffChangesNothingOnSetsLibTorchAndCublas) {
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  ConfigureDeterminism(false);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_EQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  ConfigureDeterminism(true);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_TRUE(at::globalContext().deterministicAlgorithmsWarnOnly());
  EXPECT_TRUE(at::globalContext().deterministicCuDNN());
  EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  // A value the user set is kept.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  ConfigureDeterminism(true);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":16:8");
  at::globalContext().setDeterministicAlgorithms(false, false);
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
}

// ---- NCCL without a GPU, and the spec's knobs ------------------------------------------------

TEST(NcclWithoutGpu, JoinFailsAtOnceNamingTheDevice) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible";
  DistEnv env;
  env.world_size = 2;
  env.master_port = 1;  // never reached: the check comes before any rendezvous
  EXPECT_THAT(
      ProcessGroup::Join(env, torch::Device(torch::kCUDA, 0), 5),
      StatusIs(StatusCode::kFailedPrecondition,
               HasSubstr("multi-rank training on cuda:0 (NCCL) needs that GPU, and this rank sees 0 CUDA")));
}

TEST(SpecKnobs, DeterministicAndSaveTimeoutParseAndRoundTrip) {
  const nlohmann::json base = {{"model", {{"config", {{"model_type", "llama"}}}}},
                               {"data", {{"train", {"/dev/null"}}}}};
  auto defaults = ParseSpec(base);
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_FALSE(defaults->deterministic);
  EXPECT_EQ(defaults->checkpoint.save_timeout_s, 3600);
  EXPECT_FALSE(ToJson(*defaults).contains("deterministic"));  // older trainers still take the spec
  nlohmann::json j = base;
  j["deterministic"] = true;
  j["checkpoint"] = {{"save_timeout_s", 7200}};
  auto set = ParseSpec(j);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  auto again = ParseSpec(ToJson(*set));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->deterministic);
  EXPECT_EQ(again->checkpoint.save_timeout_s, 7200);
  j["checkpoint"] = {{"save_timeout_s", 0}};
  EXPECT_THAT(ParseSpec(j), StatusIs(StatusCode::kInvalidArgument, HasSubstr("checkpoint.save_timeout_s")));
}

}  // namespace
}  // namespace sftctl::trainer
