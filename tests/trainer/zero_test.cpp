// ZeRO sharding of the optimizer state (distributed.shard, trainer/distributed/optimizer.h): the
// shard layout as a unit, sharded AdamW steps against an unsharded one in-process, the sharded
// checkpoint's per-rank files read back at other world sizes, and then the real sftctl-trainer as
// 2 ranks: shard: optimizer trains what shard: none does (losses, gradient norms, weights; with
// gradient accumulation, clipping and LoRA), resumes bit-exactly, and continues on 1 rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/os/file_system.h"
#include "tests/trainer/rank_launch.h"
#include "tests/trainer/test_util.h"
#include "tests/util/status_matchers.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/optimizer_shards.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/optimizer.h"
#include "trainer/runtime/tensor_io.h"
#include "trainer/training/memory_estimate.h"

namespace sftctl::trainer {
namespace {

using ::sftctl::testing::MakeTempDir;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::trainer::testing::Events;
using ::sftctl::trainer::testing::MaxRelDiff;
using ::sftctl::trainer::testing::ProcSpec;
using ::sftctl::trainer::testing::RunJob;
using ::sftctl::trainer::testing::Weights;
using ::testing::HasSubstr;

// ---- The layout ---------------------------------------------------------------------------

TEST(ShardLayout, EqualAlignedShardsCoverTheBufferOnce) {
  EXPECT_EQ(MakeShardLayout(100, 1).shard, 100);  // one rank: no padding
  EXPECT_EQ(MakeShardLayout(100, 1).padded(), 100);
  const ShardLayout two = MakeShardLayout(100, 2);
  EXPECT_EQ(two.shard, 64);  // ceil(100 / 2) = 50, aligned to 16
  EXPECT_EQ(two.padded(), 128);
  EXPECT_EQ(two.Owned(0), (std::pair<int64_t, int64_t>{0, 64}));
  EXPECT_EQ(two.Owned(1), (std::pair<int64_t, int64_t>{64, 100}));
  // More ranks than aligned shards: the last ones own nothing.
  const ShardLayout tiny = MakeShardLayout(20, 4);
  EXPECT_EQ(tiny.shard, 16);
  EXPECT_EQ(tiny.Owned(1), (std::pair<int64_t, int64_t>{16, 20}));
  EXPECT_EQ(tiny.Owned(2), (std::pair<int64_t, int64_t>{20, 20}));
  EXPECT_EQ(tiny.Owned(3), (std::pair<int64_t, int64_t>{20, 20}));
  EXPECT_EQ(MakeShardLayout(0, 3).padded(), 0);
  for (int64_t numel : {1, 15, 16, 17, 1000, 4099}) {
    for (int world : {1, 2, 3, 4, 7}) {
      const ShardLayout l = MakeShardLayout(numel, world);
      EXPECT_EQ(l.shard % (world > 1 ? kShardAlign : 1), 0);
      EXPECT_GE(l.padded(), numel);
      EXPECT_LT(l.padded() - numel, world * kShardAlign + world);
      int64_t at = 0;
      for (int r = 0; r < world; ++r) {
        const auto [lo, hi] = l.Owned(r);
        EXPECT_EQ(lo, at) << numel << " over " << world << ", rank " << r;
        EXPECT_LE(hi - lo, l.shard);
        at = hi;
      }
      EXPECT_EQ(at, numel) << numel << " over " << world;
    }
  }
}

// ---- In-process: sharded steps and checkpoints ----------------------------------------------

// Parameters of a few shapes (odd sizes, so shards split parameters), seeded.
std::vector<std::pair<std::string, torch::Tensor>> MakeParams() {
  torch::manual_seed(7);
  std::vector<std::pair<std::string, torch::Tensor>> ps;
  for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"a.weight", {13, 7}}, {"a.bias", {13}}, {"b.weight", {5, 11}}, {"norm.weight", {9}}}) {
    ps.emplace_back(name, torch::randn(shape).requires_grad_(true));
  }
  return ps;
}

std::vector<std::pair<std::string, torch::Tensor>> Clone(
    const std::vector<std::pair<std::string, torch::Tensor>>& ps) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [n, p] : ps) out.emplace_back(n, p.detach().clone().requires_grad_(true));
  return out;
}

bool Decays(const std::string& name, const torch::Tensor& p) { return p.dim() >= 2 && name != "norm.weight"; }

TrainSpec AdamSpec() {
  TrainSpec t;
  t.weight_decay = 0.1;
  return t;
}

// Gives every optimizer the same gradients (seeded by `step`).
void SetGrads(const std::vector<std::vector<std::pair<std::string, torch::Tensor>>*>& sets, int step) {
  torch::manual_seed(100 + step);
  const auto& first = *sets[0];
  for (size_t i = 0; i < first.size(); ++i) {
    torch::Tensor g = torch::randn(first[i].second.sizes());
    for (auto* s : sets) (*s)[i].second.mutable_grad().copy_(g);
  }
}

// What GatherParameters does between ranks: every rank's slice of each buffer to every rank.
void ExchangeShards(std::vector<FlatAdamW*> ranks) {
  torch::NoGradGuard no_grad;
  const auto layouts = ranks[0]->Layouts();
  for (size_t g = 0; g < layouts.size(); ++g) {
    const int64_t s = layouts[g].shard;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const torch::Tensor own = ranks[r]->ParamBuffers()[g].narrow(0, r * s, s);
      for (size_t o = 0; o < ranks.size(); ++o)
        if (o != r) ranks[o]->ParamBuffers()[g].narrow(0, r * s, s).copy_(own);
    }
  }
}

// Both CPU kernels: the fused loop (bit-equal per element) and the tensor ops of other devices.
class ShardedAdamW : public ::testing::TestWithParam<AdamWKernel> {};

TEST_P(ShardedAdamW, ShardsStepLikeTheWholeOptimizer) {
  const AdamWKernel kernel = GetParam();
  auto whole_p = MakeParams(), r0_p = Clone(whole_p), r1_p = Clone(whole_p), r2_p = Clone(whole_p);
  FlatAdamW whole(whole_p, AdamSpec(), Decays, kernel);
  std::vector<std::unique_ptr<FlatAdamW>> ranks;
  for (int r = 0; r < 3; ++r) {
    auto* ps = r == 0 ? &r0_p : r == 1 ? &r1_p : &r2_p;
    ranks.push_back(std::make_unique<FlatAdamW>(*ps, AdamSpec(), Decays, kernel, Sharding{r, 3}));
  }
  EXPECT_TRUE(ranks[0]->sharded());
  EXPECT_FALSE(whole.sharded());
  ASSERT_EQ(ranks[0]->Layouts().size(), 2u);  // decay and no-decay
  EXPECT_LT(ranks[0]->MomentBuffers()[0].numel(), whole.MomentBuffers()[0].numel());
  for (int step = 0; step < 4; ++step) {
    SetGrads({&whole_p, &r0_p, &r1_p, &r2_p}, step);
    const double norm = whole.GradNorm().item<double>();
    whole.ClipGradNorm(whole.GradNorm(), 1.0);
    whole.Step(1e-2);
    for (auto& r : ranks) {
      EXPECT_EQ(r->GradNorm().item<double>(), norm);  // the full, reduced gradients: the same sums
      r->ClipGradNorm(r->GradNorm(), 1.0);
      r->Step(1e-2);
    }
    ExchangeShards({ranks[0].get(), ranks[1].get(), ranks[2].get()});
    for (size_t i = 0; i < whole_p.size(); ++i) {
      for (auto* ps : {&r0_p, &r1_p, &r2_p}) {
        const torch::Tensor &want = whole_p[i].second, &got = (*ps)[i].second;
        // ATen's vectorised ops may round a slice's tail differently from the whole buffer's.
        EXPECT_TRUE(kernel == AdamWKernel::kCpuFused ? torch::equal(want, got)
                                                     : torch::allclose(want, got, /*rtol=*/1e-6, /*atol=*/0))
            << whole_p[i].first << " step " << step;
      }
    }
  }
  // The padding past the parameters stays zero.
  const auto layouts = ranks[1]->Layouts();
  for (size_t g = 0; g < layouts.size(); ++g) {
    const auto buf = ranks[1]->ParamBuffers()[g];
    EXPECT_EQ(buf.numel(), layouts[g].padded());
    EXPECT_EQ(
        buf.narrow(0, layouts[g].numel, layouts[g].padded() - layouts[g].numel).abs().sum().item<double>(),
        0);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ShardedAdamW, ::testing::Values(AdamWKernel::kCpuFused, AdamWKernel::kOps),
                         [](const auto& info) {
                           return std::string(AdamWKernelName(info.param)) == "ops" ? "ops" : "cpu_fused";
                         });

// Writes the shard files and manifest of `ranks` (one optimizer per rank) into `dir`.
void WriteShards(const std::vector<std::unique_ptr<FlatAdamW>>& ranks, const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  ASSERT_TRUE(fs->CreateDirs(dir).ok());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const Sharding& s = ranks[r]->sharding();
    ASSERT_TRUE(
        SaveTensors(fs, JoinPath(dir, OptimizerShardFileName(s.rank, s.world)), ranks[r]->ShardStateTensors())
            .ok());
  }
  ASSERT_TRUE(
      WriteFileAtomic(fs, JoinPath(dir, kOptimizerShardManifest), ranks[0]->ShardManifest().ToJson().dump(2))
          .ok());
}

// A trained sharded optimizer's moments, written by 2 ranks, read back by 3 ranks and by one
// unsharded optimizer: every element lands where the whole optimizer has it.
TEST(ShardedCheckpoint, ReshardsToAnyWorldSizeExactly) {
  auto whole_p = MakeParams();
  FlatAdamW whole(whole_p, AdamSpec(), Decays);
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> rank_p = {Clone(whole_p), Clone(whole_p)};
  std::vector<std::unique_ptr<FlatAdamW>> two;
  for (int r = 0; r < 2; ++r)
    two.push_back(
        std::make_unique<FlatAdamW>(rank_p[r], AdamSpec(), Decays, AdamWKernel::kAuto, Sharding{r, 2}));
  for (int step = 0; step < 3; ++step) {
    SetGrads({&whole_p, &rank_p[0], &rank_p[1]}, step);
    whole.Step(1e-2);
    for (auto& o : two) o->Step(1e-2);
  }
  const std::string dir = MakeTempDir("zero-reshard") + "/checkpoint-000003";
  WriteShards(two, dir);
  auto opened = ShardedMoments::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ((*opened)->manifest().world_size, 2);
  EXPECT_EQ((*opened)->manifest().files.size(), 2u);

  // Unsharded: the per-parameter tensors equal the whole optimizer's.
  auto one_p = Clone(whole_p);
  FlatAdamW one(one_p, AdamSpec(), Decays);
  ASSERT_TRUE(one.LoadMoments((*opened)->Reader(), 3).ok());
  const auto want = whole.StateTensors(), got = one.StateTensors();
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(torch::equal(want[i].second, got[i].second)) << want[i].first;

  // Three ranks: each shard equals the whole optimizer's slice; rank 0 can read every rank's.
  for (int r = 0; r < 3; ++r) {
    auto p = Clone(whole_p);
    FlatAdamW three(p, AdamSpec(), Decays, AdamWKernel::kAuto, Sharding{r, 3});
    ASSERT_TRUE(three.LoadMoments((*opened)->Reader(), 3).ok());
    const auto mine = three.MomentBuffers();
    const auto all = whole.MomentBuffers();
    const auto layouts = three.Layouts();
    for (size_t g = 0; g < layouts.size(); ++g) {
      const auto [lo, hi] = layouts[g].Owned(r);
      for (int k = 0; k < 2; ++k) {
        EXPECT_TRUE(
            torch::equal(mine[2 * g + k].narrow(0, 0, hi - lo), all[2 * g + k].narrow(0, lo, hi - lo)))
            << "rank " << r << " group " << g;
        EXPECT_EQ(mine[2 * g + k].narrow(0, hi - lo, layouts[g].shard - (hi - lo)).abs().sum().item<double>(),
                  0);
      }
    }
  }
}

TEST(ShardedCheckpoint, ManifestErrorsNameTheField) {
  auto p = MakeParams();
  FlatAdamW o(p, AdamSpec(), Decays, AdamWKernel::kAuto, Sharding{0, 2});
  nlohmann::json j = o.ShardManifest().ToJson();
  ASSERT_TRUE(OptimizerShardManifest::FromJson(j, "m.json").ok());
  nlohmann::json gap = j;
  gap["files"][1]["ranges"][0]["begin"] = 1;
  EXPECT_THAT(OptimizerShardManifest::FromJson(gap, "m.json"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("do not cover group 0 exactly once")));
  nlohmann::json escape = j;
  escape["files"][0]["file"] = "../x.safetensors";
  EXPECT_THAT(OptimizerShardManifest::FromJson(escape, "m.json"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("is not a plain file name")));
  nlohmann::json newer = j;
  newer["format"] = 2;
  EXPECT_THAT(OptimizerShardManifest::FromJson(newer, "m.json"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("field 'format'")));
  nlohmann::json outside = j;
  outside["params"][0]["numel"] = 100000;
  EXPECT_THAT(OptimizerShardManifest::FromJson(outside, "m.json"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("params[0]: the parameter lies outside its group")));
}

// Hostile manifests (issue 47): an offset whose sum with the size wraps past 2^63, and ranges that
// overlap yet reach the group's end. Both passed before, and left moments unread (uninitialised).
TEST(ShardedCheckpoint, WrappingOffsetsAndOverlapsAreRefused) {
  auto p = MakeParams();
  FlatAdamW o(p, AdamSpec(), Decays, AdamWKernel::kAuto, Sharding{0, 2});
  const nlohmann::json j = o.ShardManifest().ToJson();
  nlohmann::json wrap = j;
  wrap["params"][0]["offset"] = std::numeric_limits<int64_t>::max() - 2;
  EXPECT_THAT(OptimizerShardManifest::FromJson(wrap, "m.json"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("params[0]: the parameter lies outside its group")));
  nlohmann::json overlap = j;  // rank 0 claims the whole group, rank 1 its own half again
  overlap["files"][0]["ranges"][0]["end"] = j["groups"][0]["numel"];
  EXPECT_THAT(OptimizerShardManifest::FromJson(overlap, "m.json"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("do not cover group 0 exactly once (an overlap")));
}

// A read of a span the parameter does not have fails instead of leaving `out` as it was.
TEST(ShardedCheckpoint, ReadOutsideTheParameterFails) {
  auto whole_p = MakeParams();
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> rank_p = {Clone(whole_p), Clone(whole_p)};
  std::vector<std::unique_ptr<FlatAdamW>> two;
  for (int r = 0; r < 2; ++r)
    two.push_back(
        std::make_unique<FlatAdamW>(rank_p[r], AdamSpec(), Decays, AdamWKernel::kAuto, Sharding{r, 2}));
  const std::string dir = MakeTempDir("zero-read") + "/checkpoint-000001";
  WriteShards(two, dir);
  auto opened = ShardedMoments::Open(dir);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const auto& param = (*opened)->manifest().params[0];
  torch::Tensor out = torch::full({4}, 7.0f);
  EXPECT_THAT((*opened)->Reader()("exp_avg", param.name, param.numel, param.numel - 2, 4, out),
              StatusIs(StatusCode::kDataLoss, HasSubstr("lie outside")));
  EXPECT_THAT((*opened)->Reader()("exp_avg", param.name, param.numel, std::numeric_limits<int64_t>::max() - 1,
                                  4, out),
              StatusIs(StatusCode::kDataLoss, HasSubstr("lie outside")));
  EXPECT_TRUE((*opened)->Reader()("exp_avg", param.name, param.numel, 0, 4, out).ok());
}

TEST(ShardSpec, StagesParseAndOthersAreRefusedNamingTheField) {
  nlohmann::json j = ToJson(sftctl::testing::TinySpec(MakeTempDir("zero-spec"), 1));
  EXPECT_FALSE(j["distributed"].contains("shard")) << "the default stays out of the canonical JSON";
  for (const char* stage : {"none", "optimizer", "gradients"}) {
    j["distributed"]["shard"] = stage;
    auto parsed = ParseSpec(j);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->distributed.shard, stage);
  }
  j["distributed"]["shard"] = "all";
  EXPECT_THAT(ParseSpec(j), StatusIs(StatusCode::kInvalidArgument, HasSubstr("distributed.shard")));
}

// ---- The memory estimate per stage -----------------------------------------------------------

MemoryPlan FullFineTune(int64_t ranks, ShardStage shard) {
  MemoryPlan p;
  p.config = *ParseModelConfig(sftctl::testing::Qwen25OnePointFiveBConfig(), "qwen2.5-1.5b");
  p.seq_len = 1024;
  p.gradient_checkpointing = true;
  p.activation_bytes = 2;
  p.loss_device = LossChunkDeviceFor(torch::Device(torch::kCUDA, 0));
  p.cpu_kernels = false;
  p.ranks = ranks;
  p.shard = shard;
  return p;
}

TEST(ShardedMemory, EachStageDividesWhatItShards) {
  const int64_t n = CountParameters(FullFineTune(1, ShardStage::kNone).config, std::nullopt).trainable;
  const MemoryEstimate none = EstimateMemory(FullFineTune(4, ShardStage::kNone));
  const MemoryEstimate zero1 = EstimateMemory(FullFineTune(4, ShardStage::kOptimizer));
  const MemoryEstimate zero2 = EstimateMemory(FullFineTune(4, ShardStage::kGradients));
  EXPECT_EQ(none.optimizer, n * 8);
  EXPECT_EQ(none.gradients, n * 4);
  EXPECT_EQ(zero1.optimizer, (n + 3) / 4 * 8);
  EXPECT_EQ(zero1.gradients, n * 4);
  EXPECT_EQ(zero2.optimizer, zero1.optimizer);
  // The shard, plus the buckets in flight: the embedding's, and 3 more of 25 MiB plus at most one
  // layer matrix (gate/up/down: 8960 x 1536).
  const int64_t bucket = (int64_t{25} << 20) + int64_t{8960} * 1536 * 4;
  EXPECT_EQ(zero2.gradients, (n + 3) / 4 * 4 + int64_t{151936} * 1536 * 4 +
                                 int64_t{GradBuckets::kMaxBucketsInFlight - 1} * bucket);
  for (const MemoryEstimate* e : {&zero1, &zero2}) {
    EXPECT_EQ(e->weights, none.weights) << "weights stay whole on every rank";
    EXPECT_LT(e->total(), none.total());
  }
  EXPECT_LT(zero2.total(), zero1.total());
  EXPECT_THAT(zero1.Describe(), HasSubstr(", per rank with distributed.shard: optimizer over 4 ranks"));
  // One rank ignores the stage.
  const MemoryEstimate alone = EstimateMemory(FullFineTune(1, ShardStage::kGradients));
  EXPECT_EQ(alone.total(), EstimateMemory(FullFineTune(1, ShardStage::kNone)).total());
  EXPECT_EQ(alone.Describe().find("distributed.shard"), std::string::npos);
  EXPECT_EQ(ParseShardStage("gradients"), ShardStage::kGradients);
  EXPECT_STREQ(ShardStageName(ShardStage::kOptimizer), "optimizer");
}

TEST(ShardedMemory, TheRefusalSaysWhichStageWouldFit) {
  const MemoryPlan none = FullFineTune(4, ShardStage::kNone);
  const int64_t zero1 = EstimateMemory(FullFineTune(4, ShardStage::kOptimizer)).total();
  const int64_t zero2 = EstimateMemory(FullFineTune(4, ShardStage::kGradients)).total();
  ASSERT_LT(zero2, zero1);
  // Room for ZeRO-2 only.
  const Status s = CheckMemoryFits(none, (zero1 + zero2) / 2, "the total memory of cuda:0");
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("To fit: distributed.shard: optimizer (AdamW moments split over the 4 ranks) "
                        "(about " +
                        FormatGiB(zero1) +
                        "); distributed.shard: gradients (AdamW "
                        "moments and gradients split over the 4 ranks) (about " +
                        FormatGiB(zero2) + ", fits); "));
  // Already at ZeRO-1: only ZeRO-2 is left to suggest; one rank: no stage.
  EXPECT_THAT(CheckMemoryFits(FullFineTune(4, ShardStage::kOptimizer), zero2 - 1, "x").message(),
              ::testing::AllOf(HasSubstr("To fit: distributed.shard: gradients"),
                               ::testing::Not(HasSubstr("distributed.shard: optimizer (")),
                               ::testing::Not(HasSubstr(", fits"))));
  EXPECT_EQ(CheckMemoryFits(FullFineTune(1, ShardStage::kNone), 1, "x").message().find("distributed.shard"),
            std::string::npos);
}

// ---- Where the sharded collectives run ------------------------------------------------------
// As CollectiveDevices in tests/trainer/distributed_test.cpp: a recording group on the `meta`
// device stands in for NCCL, so a tensor handed to the backend without staging shows up as "cpu".

class ShardedCollectiveDevices : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(ShardedCollectiveDevices, EveryShardCollectiveRunsOnTheGroupsDevice) {
  const int rank = std::get<0>(GetParam());
  const std::string stage = std::get<1>(GetParam());
  JobSpec spec = ProcSpec(MakeTempDir("zero-devices"), 2, 4, 2);
  spec.eval.exact_match = false;
  spec.distributed.shard = stage;
  struct Seen {
    std::string op, what;
    torch::Device device{torch::kCPU};
    bool contiguous = false;
  };
  std::vector<Seen> log;
  TrainOptions options;
  DistEnv env;
  env.rank = rank;
  env.world_size = 2;
  env.local_world_size = 2;
  env.local_rank = rank;
  options.hooks.dist_env = env;
  options.hooks.process_group = [&](const DistEnv& e, const torch::Device&) {
    return ProcessGroup::Recording(
        e.rank, e.world_size, torch::Device(torch::kMeta),
        [&log](const std::string& op, const std::string& what, const torch::Tensor& t) {
          log.push_back({op, what, t.device(), t.is_contiguous()});
        });
  };
  auto result = Train(spec, options);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  std::set<std::string> whats;
  for (const auto& r : log) {
    EXPECT_EQ(r.device, torch::Device(torch::kMeta))
        << r.op << " " << r.what << " reached the backend on " << r.device.str();
    EXPECT_TRUE(r.contiguous) << r.what;
    const std::string what = r.what.substr(0, r.what.find(" (gradient bucket") == std::string::npos
                                                  ? std::string::npos
                                                  : r.what.find(" (gradient bucket") + 17);
    whats.insert(what);
  }
  // ZeRO-2 reduces each bucket to its owners and adds the norm's partial sums; the others
  // all-reduce whole buckets.
  const bool zero2 = stage == "gradients";
  EXPECT_EQ(whats.count("reduce (gradient bucket"), zero2 ? 1u : 0u);
  EXPECT_EQ(whats.count("allreduce (gradient bucket"), zero2 ? 0u : 1u);
  EXPECT_EQ(whats.count("allreduce (gradient norm)"), zero2 ? 1u : 0u);
  for (const char* expected :
       {"allgather (updated parameters, group 0)", "allgather (updated parameters, group 1)",
        "broadcast (optimizer shard 1 for the checkpoint)", "writing optimizer shard 0 of checkpoint-000002",
        "writing optimizer shard 1 of checkpoint-000002", "writing checkpoint-000002"}) {
    EXPECT_EQ(whats.count(expected), 1u) << "no collective '" << expected << "' was recorded";
  }
  if (rank == 0) {
    const std::string ckpt = spec.output_dir + "/checkpoint-000002/";
    EXPECT_TRUE(std::filesystem::exists(ckpt + "DONE"));
    EXPECT_TRUE(std::filesystem::exists(ckpt + OptimizerShardFileName(1, 2)));
  }
}

INSTANTIATE_TEST_SUITE_P(RankAndStage, ShardedCollectiveDevices,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values("optimizer", "gradients")));

// ZeRO-2 in one process: rank 0 of 2 with a recording group on the CPU (the other rank
// contributes nothing, so a reduce leaves this rank's own sums). After a backward every
// parameter's own gradient is freed, and the optimizer's gradient buffers are this rank's shard,
// holding exactly that slice of the unsharded gradients; parameters outside it left nothing.
TEST(ShardedGradients, BackwardLeavesOnlyThisRanksShard) {
  auto whole_p = MakeParams(), mine_p = Clone(whole_p);
  FlatAdamW whole(whole_p, AdamSpec(), Decays);
  FlatAdamW mine(mine_p, AdamSpec(), Decays, AdamWKernel::kAuto, Sharding{0, 2, /*gradients=*/true});
  ASSERT_TRUE(mine.shards_gradients());
  std::vector<std::string> ops;
  auto pg = ProcessGroup::Recording(
      0, 2, torch::Device(torch::kCPU),
      [&ops](const std::string& op, const std::string&, const torch::Tensor&) { ops.push_back(op); });
  GradBuckets buckets(pg.get(), mine, /*bucket_mb=*/100.0 / (1 << 20));  // ~25 values: several buckets
  ASSERT_TRUE(buckets.reduces_to_owners());
  ASSERT_GT(buckets.num_buckets(), 2u);
  auto loss = [](const std::vector<std::pair<std::string, torch::Tensor>>& ps) {
    torch::Tensor sum = torch::zeros({});
    for (const auto& [n, p] : ps) sum = sum + (p * p).sum() * 0.5 + p.sum();
    return sum;
  };
  for (int micro = 0; micro < 2; ++micro) {  // two micro-batches accumulate into the shard
    loss(whole_p).backward();
    buckets.Arm();
    loss(mine_p).backward();
    double wait_s = 0;
    ASSERT_TRUE(buckets.Finish(&wait_s).ok());
    for (const auto& [n, p] : mine_p) EXPECT_FALSE(p.grad().defined()) << n << " kept its gradient";
  }
  const auto layouts = mine.Layouts();
  const auto shard = mine.GradBuffers(), all = whole.GradBuffers();
  for (size_t g = 0; g < layouts.size(); ++g) {
    ASSERT_EQ(shard[g].numel(), layouts[g].shard);
    const auto [lo, hi] = layouts[g].Owned(0);
    EXPECT_TRUE(torch::allclose(shard[g].narrow(0, 0, hi - lo), all[g].narrow(0, lo, hi - lo)))
        << "group " << g;
  }
  EXPECT_NE(std::find(ops.begin(), ops.end(), "reduce"), ops.end());
  EXPECT_EQ(std::find(ops.begin(), ops.end(), "allreduce"), ops.end());
  // The rank's part of the squared norm.
  double want = 0;
  for (size_t g = 0; g < layouts.size(); ++g) {
    const auto [lo, hi] = layouts[g].Owned(0);
    want += all[g].narrow(0, lo, hi - lo).to(torch::kFloat64).square().sum().item<double>();
  }
  EXPECT_NEAR(mine.GradSquareSum().item<double>(), want, 1e-9 * want);
  mine.ZeroGrad();
  for (const auto& b : mine.GradBuffers()) EXPECT_EQ(b.abs().sum().item<double>(), 0);
}

// ---- Two ranks through the real trainer ----------------------------------------------------

// Compares runs `a` and `b` step by step (loss, gradient norm) and their final weights in
// `file` of checkpoint `ckpt`, within `tol` relative.
void ExpectSameRun(const JobSpec& a, const JobSpec& b, const std::string& ckpt, const std::string& file,
                   double tol) {
  const auto sa = Events(a.output_dir + "/metrics.jsonl", "step");
  const auto sb = Events(b.output_dir + "/metrics.jsonl", "step");
  ASSERT_EQ(sa.size(), sb.size());
  ASSERT_FALSE(sa.empty());
  for (size_t i = 0; i < sa.size(); ++i) {
    const double la = sa[i]["loss"].get<double>(), lb = sb[i]["loss"].get<double>();
    const double ga = sa[i]["grad_norm"].get<double>(), gb = sb[i]["grad_norm"].get<double>();
    EXPECT_NEAR(lb, la, tol * std::abs(la)) << "loss of step " << i + 1;
    EXPECT_NEAR(gb, ga, tol * std::abs(ga)) << "grad norm of step " << i + 1;
  }
  auto wa = LoadTensors(a.output_dir + "/" + ckpt + "/" + file);
  auto wb = LoadTensors(b.output_dir + "/" + ckpt + "/" + file);
  ASSERT_TRUE(wa.ok() && wb.ok()) << ckpt << "/" << file;
  ASSERT_EQ(wa->size(), wb->size());
  ASSERT_FALSE(wa->empty());
  // A key projection's bias (Qwen2) adds the same q.b to every score of a query, which the softmax
  // ignores: its exact gradient is 0 and what reaches it is rounding, which AdamW turns into steps
  // of about lr whatever its size. Summed in another order (ZeRO-2) that noise differs, so those
  // tensors are held to 1e-3; every other weight to `tol`.
  NamedTensors nb, noise;
  for (const auto& [name, t] : *wb) {
    (name.size() > 11 && name.compare(name.size() - 11, 11, "k_proj.bias") == 0 ? noise : nb)
        .emplace_back(name, t);
  }
  std::string worst, worst_noise;
  const double rel = MaxRelDiff(nb, *wa, &worst);
  EXPECT_LE(rel, tol) << worst;
  EXPECT_LE(MaxRelDiff(noise, *wa, &worst_noise), 1e-3) << worst_noise;
  std::printf("%s: largest relative weight difference %.3g (%s)\n", b.output_dir.c_str(), rel, worst.c_str());
}

struct EqualCase {
  std::string name;
  std::string shard;  // optimizer | gradients
  int64_t accum = 1;
  double clip = 1.0;
  bool lora = false;
  int samples = 0;  // > 0: a training set this small (an epoch's end leaves rank 1 a micro-batch short)
  std::string model_type = "llama";  // qwen2: q/k/v biases (in the no-decay buffer) and untied weights
};
void PrintTo(const EqualCase& c, std::ostream* os) { *os << c.shard << "/" << c.name; }

class ShardedEqualsUnsharded : public ::testing::TestWithParam<EqualCase> {};

TEST_P(ShardedEqualsUnsharded, SameLossesGradNormsAndWeights) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const EqualCase c = GetParam();
  const std::string dir = MakeTempDir("zero-equal");
  auto spec_for = [&](const std::string& sub, const std::string& shard) {
    JobSpec s = ProcSpec(dir + "/" + sub, 5, 4, c.accum);
    s.eval.exact_match = false;
    s.train.clip_grad_norm = c.clip;
    s.distributed.shard = shard;
    s.model.config["model_type"] = c.model_type;
    if (c.model_type == "qwen2") s.model.config["tie_word_embeddings"] = false;
    if (c.samples > 0) {
      const std::string train = dir + "/" + sub + "/data/small.jsonl";
      sftctl::testing::WriteWholeFile(train, sftctl::testing::AdditionJsonl(c.samples));
      s.data.train = {train};
    }
    if (c.lora) {
      s.lora.emplace();
      s.lora->r = 4;
      s.lora->target_modules = {"q_proj", "v_proj", "up_proj"};
      s.train.lr = 1e-2;
    }
    return s;
  };
  const JobSpec none = spec_for("none", "none"), sharded = spec_for("sharded", c.shard);
  RunJob(none, 2, "none");
  RunJob(sharded, 2, "sharded");
  const std::string file = c.lora ? "adapter_model.safetensors" : "model.safetensors";
  ExpectSameRun(none, sharded, "checkpoint-000005", file, 1e-6);
  // The clipping case clips: some step's norm is above the cap.
  if (c.clip < 1.0) {
    bool clipped = false;
    for (const auto& s : Events(none.output_dir + "/metrics.jsonl", "step"))
      clipped = clipped || s["grad_norm"].get<double>() > c.clip;
    EXPECT_TRUE(clipped) << "no step was clipped";
  }
  const auto start = Events(sharded.output_dir + "/metrics.jsonl", "start");
  ASSERT_EQ(start.size(), 1u);
  EXPECT_EQ(start[0]["shard"], c.shard);
  // The sharded checkpoint: one moment file per rank and the manifest, the RNG streams beside.
  const std::string ckpt = sharded.output_dir + "/checkpoint-000005";
  for (const char* f : {"optimizer_shards.json", "optimizer-shard-00000-of-00002.safetensors",
                        "optimizer-shard-00001-of-00002.safetensors", "DONE"})
    EXPECT_TRUE(std::filesystem::exists(ckpt + "/" + f)) << f;
  auto rng = LoadTensors(ckpt + "/optimizer.safetensors");
  ASSERT_TRUE(rng.ok());
  EXPECT_TRUE(rng->count("rng.cpu.rank1"));
  for (const auto& [k, t] : *rng) EXPECT_EQ(k.rfind("exp_avg", 0), std::string::npos) << k;
}

INSTANTIATE_TEST_SUITE_P(Zero1, ShardedEqualsUnsharded,
                         ::testing::Values(EqualCase{"accum1", "optimizer", 1},
                                           EqualCase{"accum2_clip", "optimizer", 2, 0.05},
                                           EqualCase{"lora", "optimizer", 2, 1.0, true},
                                           EqualCase{"qwen2", "optimizer", 2, 0.05, false, 0, "qwen2"}),
                         [](const auto& info) { return info.param.name; });
// ZeRO-2 sums each micro-batch's gradients over ranks before adding the micro-batches (ZeRO-1 and
// none the other way round), and its norm from per-rank partial sums: equal up to rounding.
INSTANTIATE_TEST_SUITE_P(Zero2, ShardedEqualsUnsharded,
                         ::testing::Values(EqualCase{"accum1", "gradients", 1},
                                           EqualCase{"accum2_clip", "gradients", 2, 0.05},
                                           EqualCase{"lora", "gradients", 2, 1.0, true},
                                           EqualCase{"epoch_end", "gradients", 2, 1.0, false, 20},
                                           EqualCase{"qwen2", "gradients", 2, 0.05, false, 0, "qwen2"}),
                         [](const auto& info) { return info.param.name; });

class ShardedResume : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedResume, InterruptedRunResumesBitExactly) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("zero-resume");
  auto spec_for = [&](const std::string& sub, int64_t steps) {
    JobSpec s = ProcSpec(dir + "/" + sub, steps, 4, 2);
    s.train.schedule = "constant";
    s.eval.exact_match = false;
    s.distributed.shard = GetParam();
    return s;
  };
  JobSpec full = spec_for("full", 8);
  RunJob(full, 2, "full");
  JobSpec part = spec_for("part", 4);
  RunJob(part, 2, "part1");
  part.train.max_steps = 8;
  RunJob(part, 2, "part2");

  const auto start = Events(part.output_dir + "/metrics.jsonl", "start");
  ASSERT_EQ(start.size(), 2u);
  EXPECT_EQ(start[1]["step"], 4);
  EXPECT_EQ(start[1]["resumed_from"], part.output_dir + "/checkpoint-000004");
  const auto l_full = Events(full.output_dir + "/metrics.jsonl", "step");
  const auto l_part = Events(part.output_dir + "/metrics.jsonl", "step");
  ASSERT_EQ(l_full.size(), 8u);
  ASSERT_EQ(l_part.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(l_full[i]["loss"], l_part[i]["loss"]) << "step " << i + 1;
  const auto w_full = Weights(full.output_dir + "/checkpoint-000008");
  const auto w_part = Weights(part.output_dir + "/checkpoint-000008");
  ASSERT_EQ(w_full.size(), w_part.size());
  for (const auto& [name, t] : w_full) EXPECT_TRUE(torch::equal(t, w_part.at(name))) << name;
  // The optimizer's files (moments whole or in shards, each rank's RNG streams) are equal too.
  std::vector<std::string> files = {"/checkpoint-000008/optimizer.safetensors"};
  if (GetParam() != "none") {
    for (int r = 0; r < 2; ++r) files.push_back("/checkpoint-000008/" + OptimizerShardFileName(r, 2));
  }
  for (const std::string& f : files) {
    auto a = LoadTensors(full.output_dir + f), b = LoadTensors(part.output_dir + f);
    ASSERT_TRUE(a.ok() && b.ok()) << f;
    ASSERT_EQ(a->size(), b->size());
    for (const auto& [name, t] : *a) EXPECT_TRUE(torch::equal(t, b->at(name))) << f << " " << name;
  }
  auto opt = LoadTensors(full.output_dir + files[0]);
  ASSERT_TRUE(opt.ok());
  EXPECT_TRUE(opt->count("rng.cpu.rank1")) << "each rank's RNG state is saved";
}

// A shard file lost from a checkpoint: rank 0 fails reading it for rank 1, naming the file, and rank
// 1 gets rank 0's error instead of waiting; neither trains on.
TEST(ShardedResumeFailure, MissingShardFileFailsEveryRankNamingTheFile) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("zero-missing");
  JobSpec spec = ProcSpec(dir + "/job", 2, 4, 1);
  spec.eval.exact_match = false;
  spec.distributed.shard = "optimizer";
  RunJob(spec, 2, "first");
  const std::string lost = spec.output_dir + "/checkpoint-000002/" + OptimizerShardFileName(1, 2);
  ASSERT_TRUE(std::filesystem::remove(lost));
  spec.train.max_steps = 4;
  auto ranks = testing::Launch(spec, 2, "second");
  const int code0 = testing::WaitExit(ranks[0].pid, std::chrono::seconds(120));
  const int code1 = testing::WaitExit(ranks[1].pid, std::chrono::seconds(120));
  const std::string log0 = ReadWholeFile(ranks[0].log), log1 = ReadWholeFile(ranks[1].log);
  EXPECT_NE(code0, 0) << log0;
  EXPECT_NE(code1, 0) << log1;
  EXPECT_THAT(log0, HasSubstr(lost));
  EXPECT_THAT(log1, HasSubstr("rank 1: rank 0 failed reading optimizer shard 1"));
  EXPECT_THAT(log1, HasSubstr(lost));
  EXPECT_EQ(Events(spec.output_dir + "/metrics.jsonl", "step").size(), 2u) << "nothing trained after";
}

// The shard files are written while the other ranks wait as for the checkpoint itself: a first
// checkpoint made slower than distributed.timeout_s (the trainer's test seam) fails nothing.
TEST(ShardedCheckpointWait, SlowSaveDoesNotFailTheJob) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("zero-slow-save");
  JobSpec spec = ProcSpec(dir + "/job", 2, 4, 1);
  spec.checkpoint.interval = 1;
  spec.distributed.timeout_s = 3;
  spec.eval.exact_match = false;
  spec.distributed.shard = "gradients";
  auto ranks = testing::Launch(spec, 2, "slow", {"SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S=6"},
                               testing::kSlowCheckpointTrainer);
  for (int r = 0; r < 2; ++r) {
    const int code = testing::WaitExit(ranks[r].pid, std::chrono::seconds(120));
    EXPECT_EQ(code, 0) << "rank " << r << ":\n" << ReadWholeFile(ranks[r].log);
  }
  for (const char* ckpt : {"/checkpoint-000001", "/checkpoint-000002"}) {
    EXPECT_TRUE(IsComplete(FileSystem::Default(), spec.output_dir + ckpt)) << ckpt;
    EXPECT_TRUE(std::filesystem::exists(spec.output_dir + ckpt + "/" + OptimizerShardFileName(1, 2))) << ckpt;
  }
}

// A sharded checkpoint continues at another world size with the per-rank batch that keeps the
// global batch (so the same samples): 4 sharded ranks then 2 (each new shard read from two old
// files), 2 then 1 (the shards gathered into one optimizer), and 1 rank (per-parameter moments)
// then 2 sharded ranks. Each equals the uninterrupted 2-rank run up to the rounding of summing
// gradients over another number of ranks.
// "none": the unsharded two-rank resume (docs/distributed.md), held to the same bits.
INSTANTIATE_TEST_SUITE_P(Stage, ShardedResume, ::testing::Values("none", "optimizer", "gradients"));

TEST(ShardedReshard, ReshardsAcrossWorldSizes) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("zero-reshard-run");
  auto spec_for = [&](const std::string& sub, int64_t steps, int world) {
    JobSpec s = ProcSpec(dir + "/" + sub, steps, 8 / world, 2);
    s.train.schedule = "constant";
    s.eval.exact_match = false;
    s.distributed.shard = "optimizer";
    return s;
  };
  JobSpec full = spec_for("full", 6, 2);
  RunJob(full, 2, "full");
  struct Change {
    std::string name;
    int before, after;
  };
  for (const Change& c : {Change{"4to2", 4, 2}, Change{"2to1", 2, 1}, Change{"1to2", 1, 2}}) {
    SCOPED_TRACE(c.name);
    JobSpec s = spec_for(c.name, 3, c.before);
    RunJob(s, c.before, c.name + "-a");
    const std::string first = s.output_dir + "/checkpoint-000003/";
    EXPECT_EQ(std::filesystem::exists(first + "optimizer_shards.json"), c.before > 1)
        << "one rank ignores distributed.shard";
    if (c.before > 1) {
      EXPECT_TRUE(std::filesystem::exists(first + OptimizerShardFileName(c.before - 1, c.before)));
    }
    s.train.max_steps = 6;
    s.train.batch_size = 8 / c.after;
    RunJob(s, c.after, c.name + "-b");
    const auto start = Events(s.output_dir + "/metrics.jsonl", "start");
    ASSERT_EQ(start.size(), 2u);
    EXPECT_EQ(start[1]["step"], 3);
    ExpectSameRun(full, s, "checkpoint-000006", "model.safetensors", 1e-6);
  }
}

}  // namespace
}  // namespace sftctl::trainer
