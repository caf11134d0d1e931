// Data-parallel training (trainer/distributed/distributed.h): shard slicing and bucket assignment as units,
// then the real sftctl-trainer binary launched as 1 and 2 ranks on 127.0.0.1: 2 ranks x batch b
// equal 1 rank x batch 2b, a dead or hung peer fails the survivor within the timeout, a 2-rank
// run resumes bit-exactly, and a 2-rank checkpoint resumes on 1 rank at the same data position.
#include "trainer/distributed/distributed.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "tests/trainer/rank_launch.h"
#include "tests/trainer/test_util.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/wait_for.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/distributed/resume_sharing.h"
#include "trainer/runtime/tensor_io.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using sftctl::testing::MakeTempDir;
using sftctl::testing::ReadMetrics;
using sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using sftctl::testing::TinySpec;
using sftctl::testing::WaitFor;
using ::sftctl::trainer::testing::Events;
using ::sftctl::trainer::testing::FreePort;
using ::sftctl::trainer::testing::Launch;
using ::sftctl::trainer::testing::MaxRelDiff;
using ::sftctl::trainer::testing::ProcSpec;
using ::sftctl::trainer::testing::Rank;
using ::sftctl::trainer::testing::RunJob;
using ::sftctl::trainer::testing::WaitExit;
using ::sftctl::trainer::testing::Weights;
using ::testing::HasSubstr;

// ---- Units --------------------------------------------------------------------------------

// What rank 0 broadcasts first on resume comes back field for field, the doubles bit for bit.
TEST(RankZeroHeader, EveryFieldSurvivesPackAndUnpack) {
  RankZeroHeader h;
  h.resumed = true;
  h.base_loaded = true;
  h.state.step = 7;
  h.state.epoch = 2;
  h.state.position = 41;
  h.state.tokens_seen = 123456789012LL;
  h.state.bad_steps = 3;
  h.state.elapsed_s = 1234.5678901234567;
  h.state.loss_scale = 32768.0;
  h.state.loss_scale_good_steps = 1999;
  h.rank_has_rng = {0, RankZeroHeader::kCpuRng, RankZeroHeader::kCpuRng | RankZeroHeader::kCudaRng};
  const RankZeroHeader back = RankZeroHeader::Unpack(h.Pack());
  EXPECT_TRUE(back.resumed);
  EXPECT_TRUE(back.base_loaded);
  EXPECT_EQ(back.state.step, 7);
  EXPECT_EQ(back.state.epoch, 2);
  EXPECT_EQ(back.state.position, 41);
  EXPECT_EQ(back.state.tokens_seen, 123456789012LL);
  EXPECT_EQ(back.state.bad_steps, 3);
  EXPECT_EQ(back.state.elapsed_s, 1234.5678901234567);
  EXPECT_EQ(back.state.loss_scale, 32768.0);
  EXPECT_EQ(back.state.loss_scale_good_steps, 1999);
  EXPECT_EQ(back.rank_has_rng, h.rank_has_rng);

  const RankZeroHeader none = RankZeroHeader::Unpack(RankZeroHeader{}.Pack());
  EXPECT_FALSE(none.resumed);
  EXPECT_FALSE(none.base_loaded);
  EXPECT_TRUE(none.rank_has_rng.empty());
}

TEST(ShardSlice, RanksTakeConsecutiveSlicesOfTheGlobalBatch) {
  EXPECT_EQ(ShardSlice(8, 4, 0), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(ShardSlice(8, 4, 1), (std::pair<int64_t, int64_t>{4, 8}));
  // The short end of an epoch: rank 1 gets the rest, rank 2 nothing.
  EXPECT_EQ(ShardSlice(6, 4, 1), (std::pair<int64_t, int64_t>{4, 6}));
  EXPECT_EQ(ShardSlice(6, 4, 2), (std::pair<int64_t, int64_t>{6, 6}));
  // Every drawn sample is used by exactly one rank.
  for (int64_t drawn : {1, 5, 11, 12}) {
    std::vector<int> used(drawn, 0);
    for (int r = 0; r < 3; ++r) {
      auto [lo, hi] = ShardSlice(drawn, 4, r);
      for (int64_t i = lo; i < hi; ++i) ++used[i];
    }
    for (int64_t i = 0; i < drawn; ++i) EXPECT_EQ(used[i], 1) << "drawn " << drawn << " sample " << i;
  }
}

TEST(AssignBuckets, ReverseRegistrationOrderWithinCap) {
  // Registration order 0..4; decay group 0 holds 0, 2, 4 and group 1 holds 1, 3.
  std::vector<ParamSlot> slots = {
      {0, 0, 100, 0}, {1, 0, 10, 1}, {0, 100, 300, 2}, {1, 10, 10, 3}, {0, 400, 50, 4}};
  auto buckets = AssignBuckets(slots, 200 * 4);  // 200 fp32 values
  ASSERT_EQ(buckets.size(), 3u);
  // First: the newest parameters of group 0 (4, then 2: 350 values reach the cap).
  EXPECT_EQ(buckets[0].group, 0);
  EXPECT_EQ(buckets[0].offset, 100);
  EXPECT_EQ(buckets[0].numel, 350);
  EXPECT_EQ(buckets[0].slots, (std::vector<size_t>{4, 2}));
  // Then group 1 (newest index 3), then the oldest parameter of group 0.
  EXPECT_EQ(buckets[1].group, 1);
  EXPECT_EQ(buckets[1].offset, 0);
  EXPECT_EQ(buckets[1].numel, 20);
  EXPECT_EQ(buckets[1].slots, (std::vector<size_t>{3, 1}));
  EXPECT_EQ(buckets[2].group, 0);
  EXPECT_EQ(buckets[2].offset, 0);
  EXPECT_EQ(buckets[2].numel, 100);

  // A huge cap: one bucket per group; a tiny one: one bucket per parameter.
  EXPECT_EQ(AssignBuckets(slots, int64_t{1} << 30).size(), 2u);
  auto each = AssignBuckets(slots, 4);
  ASSERT_EQ(each.size(), 5u);
  for (size_t b = 0; b < each.size(); ++b) {
    ASSERT_EQ(each[b].slots.size(), 1u);
    EXPECT_EQ(slots[each[b].slots[0]].index, static_cast<int64_t>(4 - b)) << "bucket " << b;
  }
}

TEST(AssignBuckets, CoversTheOptimizerBuffersExactly) {
  const std::string dir = MakeTempDir("dist-buckets");
  JobSpec spec = TinySpec(dir, 1);
  ByteTokenizer tok;
  torch::manual_seed(1);
  auto model = BuildModel(spec, tok);
  ASSERT_TRUE(model.ok());
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& p : (*model)->named_parameters()) params.emplace_back(p.key(), p.value());
  FlatAdamW opt(params, spec.train,
                [](const std::string& n, const torch::Tensor& p) { return p.dim() == 2; });
  std::vector<ParamSlot> slots;
  for (const auto& s : opt.Slots()) slots.push_back({s.group, s.offset, s.numel, s.index});
  const auto grads = opt.GradBuffers();
  ASSERT_EQ(grads.size(), 2u);
  auto buckets = AssignBuckets(slots, 16 * 1024);
  EXPECT_GT(buckets.size(), 4u);
  std::vector<std::vector<int>> covered(grads.size());
  for (size_t g = 0; g < grads.size(); ++g) covered[g].assign(grads[g].numel(), 0);
  std::set<size_t> seen;
  for (const auto& b : buckets) {
    int64_t sum = 0;
    for (size_t i : b.slots) {
      EXPECT_TRUE(seen.insert(i).second) << "slot " << i << " in two buckets";
      EXPECT_EQ(slots[i].group, b.group);
      sum += slots[i].numel;
    }
    EXPECT_EQ(sum, b.numel) << "a bucket is exactly its parameters";
    for (int64_t k = b.offset; k < b.offset + b.numel; ++k) ++covered[b.group][k];
  }
  EXPECT_EQ(seen.size(), slots.size());
  for (const auto& c : covered)
    for (int v : c) ASSERT_EQ(v, 1);
  // The first bucket holds the last registered parameter.
  int64_t newest = 0;
  for (const auto& s : slots) newest = std::max(newest, s.index);
  const auto& first = buckets.front().slots;
  EXPECT_TRUE(std::any_of(first.begin(), first.end(), [&](size_t i) { return slots[i].index == newest; }));
}

TEST(DistEnv, ParsesAndNamesTheBadVariable) {
  auto parse = [](std::map<std::string, std::string> vars) {
    return ParseDistEnv([vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
  };
  auto single = parse({});
  ASSERT_TRUE(single.ok());
  EXPECT_FALSE(single->distributed());
  auto two = parse({{"WORLD_SIZE", "2"},
                    {"RANK", "1"},
                    {"LOCAL_RANK", "1"},
                    {"LOCAL_WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "127.0.0.1"},
                    {"MASTER_PORT", "29511"}});
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->rank, 1);
  EXPECT_EQ(two->world_size, 2);
  EXPECT_EQ(two->local_rank, 1);
  EXPECT_EQ(two->master_port, 29511);
  auto bad_rank = parse({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  EXPECT_THAT(bad_rank,
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("RANK: 2 is not below WORLD_SIZE 2")));
  auto no_port = parse({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "h"}});
  EXPECT_THAT(no_port, StatusIs(StatusCode::kInvalidArgument, HasSubstr("MASTER_PORT is required")));
  auto junk = parse({{"WORLD_SIZE", "two"}});
  EXPECT_THAT(junk, StatusIs(StatusCode::kInvalidArgument,
                             HasSubstr("WORLD_SIZE: expected an integer >= 1, got 'two'")));
}

// ---- Processes ----------------------------------------------------------------------------

// ---- Where collectives run ----------------------------------------------------------------
// NCCL accepts only tensors on its GPU. A recording group stands in for the backend here: it
// declares a device and records each tensor as the backend would receive it. `meta` is a device
// that is not the CPU and exists in every LibTorch build, so a collective whose tensor was not
// staged through ProcessGroup (a host tensor handed to the backend as is) shows up as "cpu".

struct Recorded {
  std::string op, what;
  torch::Device device{torch::kCPU};
  bool contiguous = false;
};

ProcessGroup::Recorder RecordInto(std::vector<Recorded>* log) {
  return [log](const std::string& op, const std::string& what, const torch::Tensor& t) {
    log->push_back({op, what, t.device(), t.is_contiguous()});
  };
}

TEST(ProcessGroupStaging, TensorsReachTheBackendOnTheGroupsDeviceAndResultsComeBack) {
  std::vector<Recorded> log;
  auto cpu = ProcessGroup::Recording(0, 2, torch::Device(torch::kCPU), RecordInto(&log));
  EXPECT_EQ(cpu->device(), torch::Device(torch::kCPU));
  // A non-contiguous host tensor: staged as a contiguous copy, the result copied back.
  torch::Tensor base = torch::arange(6, torch::kFloat64).view({2, 3});
  torch::Tensor t = base.t();
  ASSERT_FALSE(t.is_contiguous());
  ASSERT_TRUE(cpu->AllReduceSum(t, "allreduce (test)").ok());
  ASSERT_EQ(log.size(), 1u);
  EXPECT_TRUE(log[0].contiguous);
  EXPECT_TRUE(torch::equal(t, torch::arange(6, torch::kFloat64).view({2, 3}).t()));
  std::vector<torch::Tensor> out;
  ASSERT_TRUE(cpu->AllGather(torch::tensor({7, 8}, torch::kInt64), &out, "allgather (test)").ok());
  ASSERT_EQ(out.size(), 2u);
  for (const auto& o : out) EXPECT_TRUE(torch::equal(o, torch::tensor({7, 8}, torch::kInt64)));

  log.clear();
  auto meta = ProcessGroup::Recording(1, 2, torch::Device(torch::kMeta), RecordInto(&log));
  torch::Tensor header = torch::tensor({1.5, 2.5}, torch::kFloat64);
  ASSERT_TRUE(meta->Broadcast(header, 0, "broadcast (test)").ok());
  ASSERT_TRUE(meta->AllReduceSum(header, "allreduce (test)").ok());
  ASSERT_TRUE(meta->AllGather(header, &out, "allgather (test)").ok());
  auto pending = meta->AllReduceSumAsync(header, "allreduce (async test)");
  ASSERT_TRUE(meta->Wait(pending).ok());
  ASSERT_EQ(log.size(), 6u);  // broadcast, allreduce, allgather input + 2 outputs, async allreduce
  for (const auto& r : log) EXPECT_EQ(r.device, torch::Device(torch::kMeta)) << r.op << " " << r.what;
  // Nothing comes back from a device without data: the caller's values stay; gathered results
  // are on the input's device.
  EXPECT_TRUE(torch::equal(header, torch::tensor({1.5, 2.5}, torch::kFloat64)));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[1].device().is_cpu());
}

// Drives the trainer's real call sites (ShareRankZeroState, the window counts, the gradient
// buckets, the window loss, the evaluation sums, the RNG all-gather of a checkpoint) as rank
// `rank` of 2 with a group on the meta device.
std::vector<Recorded> TrainWithRecordingGroup(int rank, const std::string& dir) {
  JobSpec spec = ProcSpec(dir, 2, 4, 2);
  spec.eval.exact_match = false;
  std::vector<Recorded> log;
  TrainOptions options;
  DistEnv env;
  env.rank = rank;
  env.world_size = 2;
  env.local_world_size = 2;
  env.local_rank = rank;
  options.hooks.dist_env = env;
  options.hooks.process_group = [&](const DistEnv& e, const torch::Device&) {
    return ProcessGroup::Recording(e.rank, e.world_size, torch::Device(torch::kMeta), RecordInto(&log));
  };
  auto result = Train(spec, options);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return log;
}

class CollectiveDevices : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveDevices, EveryTrainerCollectiveRunsOnTheGroupsDevice) {
  const std::string dir = MakeTempDir("dist-devices");
  const auto log = TrainWithRecordingGroup(GetParam(), dir);
  std::set<std::string> whats;
  for (const auto& r : log) {
    EXPECT_EQ(r.device, torch::Device(torch::kMeta))
        << r.op << " " << r.what << " reached the backend on " << r.device.str();
    EXPECT_TRUE(r.contiguous) << r.what;
    const std::string bucket = "allreduce (gradient bucket";
    whats.insert(r.what.rfind(bucket, 0) == 0 ? bucket : r.what);
  }
  for (const char* expected :
       {"broadcast (resume state)", "broadcast (parameters and optimizer state)",
        "allreduce (window token counts)", "allreduce (gradient bucket", "allreduce (window loss)",
        "allreduce (evaluation sums)", "allgather (RNG states for the checkpoint)",
        "reading the checkpoint to resume from", "writing checkpoint-000002"}) {
    EXPECT_EQ(whats.count(expected), 1u) << "no collective '" << expected << "' was recorded";
  }
}

INSTANTIATE_TEST_SUITE_P(Rank, CollectiveDevices, ::testing::Values(0, 1));

// A one-rank NCCL group (bench/gpu/run.sh runs this on a GPU machine): every collective on host
// and GPU tensors, results back where they came from.
TEST(NcclOneRank, CollectivesOnHostAndGpuTensors) {
  if (!NcclAvailable()) GTEST_SKIP() << "this trainer was built without NCCL (no CUDA LibTorch or no nccl.h)";
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  DistEnv env;
  env.world_size = 1;
  env.master_port = FreePort();
  auto pg = ProcessGroup::Join(env, torch::Device(torch::kCUDA, 0), 30);
  ASSERT_TRUE(pg.ok()) << pg.status().ToString();
  EXPECT_EQ((*pg)->backend(), "nccl");
  EXPECT_TRUE((*pg)->device().is_cuda());
  torch::Tensor host = torch::tensor({1.0, 2.0}, torch::kFloat64);
  ASSERT_TRUE((*pg)->AllReduceSum(host).ok());
  EXPECT_TRUE(host.device().is_cpu());
  EXPECT_TRUE(torch::equal(host, torch::tensor({1.0, 2.0}, torch::kFloat64)));
  torch::Tensor rng = torch::arange(16, torch::kUInt8);
  ASSERT_TRUE((*pg)->Broadcast(rng, 0).ok());
  EXPECT_TRUE(torch::equal(rng, torch::arange(16, torch::kUInt8)));
  std::vector<torch::Tensor> out;
  ASSERT_TRUE((*pg)->AllGather(torch::tensor({5}, torch::kInt64), &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].device().is_cpu());
  EXPECT_EQ(out[0].item<int64_t>(), 5);
  torch::Tensor gpu = torch::full({1000}, 0.5, torch::TensorOptions().device(torch::kCUDA, 0));
  auto p = (*pg)->AllReduceSumAsync(gpu);
  ASSERT_TRUE((*pg)->Wait(p).ok());
  EXPECT_DOUBLE_EQ(gpu.sum().item<double>(), 500.0);
}

TEST(DistributedWithoutGloo, TwoCpuRanksFailAtOnceWithAClearError) {
  if (GlooAvailable()) GTEST_SKIP() << "Gloo is built in; this checks the build without it";
  DistEnv env;
  env.rank = 0;
  env.world_size = 2;
  env.master_port = 1;  // never reached: the check comes before any rendezvous
  auto pg = ProcessGroup::Join(env, torch::Device(torch::kCPU), 1.0);
  EXPECT_THAT(pg, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("needs a LibTorch built with Gloo")));
}

class TwoRanksEqualOneRank : public ::testing::TestWithParam<int64_t> {};

TEST_P(TwoRanksEqualOneRank, SameWeightsLossesAndEval) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const int64_t accum = GetParam();
  const int64_t steps = 6, b = 4;
  const std::string dir = MakeTempDir("dist-equal");
  JobSpec one = ProcSpec(dir + "/one", steps, 2 * b, accum);
  JobSpec two = ProcSpec(dir + "/two", steps, b, accum);

  // The two ranks' slices hold different numbers of target tokens, so normalising each rank by
  // its own count (a mean of means) would give a different gradient than the global count.
  {
    ByteTokenizer tok;
    JobSpec probe = two;
    probe.output_dir = dir + "/probe";
    auto data = LoadDataset(probe, tok);
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    Sampler sampler(static_cast<int64_t>(data->train.size()), static_cast<uint64_t>(two.seed));
    int uneven = 0;
    for (int64_t m = 0; m < steps * accum; ++m) {
      const auto drawn = sampler.Next(2 * b);
      int64_t targets[2];
      for (int r = 0; r < 2; ++r) {
        auto [lo, hi] = ShardSlice(static_cast<int64_t>(drawn.size()), b, r);
        targets[r] = Collate(data->train, std::vector<int64_t>(drawn.begin() + lo, drawn.begin() + hi),
                             ByteTokenizer::kPadId)
                         .targets;
      }
      uneven += targets[0] != targets[1];
    }
    ASSERT_GE(uneven, steps * accum / 2) << "the test needs ranks with different target counts";
  }

  RunJob(one, 1, "one");
  RunJob(two, 2, "two");

  const std::string ckpt = "/checkpoint-00000" + std::to_string(steps);
  std::string worst;
  const auto w_one = Weights(one.output_dir + ckpt);
  const auto w_two = Weights(two.output_dir + ckpt);
  ASSERT_EQ(w_one.size(), w_two.size());
  ASSERT_FALSE(w_one.empty());
  NamedTensors a(w_two.begin(), w_two.end());
  const double rel = MaxRelDiff(a, w_one, &worst);
  EXPECT_LE(rel, 1e-5) << worst;
  std::printf("largest relative weight difference, 2 ranks vs 1: %.3g (%s)\n", rel, worst.c_str());
  // Training moved the weights well beyond that tolerance.
  JobSpec init = ProcSpec(dir + "/init", 0, b, accum);
  ByteTokenizer tok;
  torch::manual_seed(static_cast<uint64_t>(init.seed));
  auto fresh = BuildModel(init, tok);
  ASSERT_TRUE(fresh.ok());
  NamedTensors f;
  for (const auto& p : (*fresh)->named_parameters()) f.emplace_back(p.key(), p.value());
  EXPECT_GT(MaxRelDiff(f, w_one, &worst), 1e-2);

  const auto s_one = Events(one.output_dir + "/metrics.jsonl", "step");
  const auto s_two = Events(two.output_dir + "/metrics.jsonl", "step");
  ASSERT_EQ(s_one.size(), static_cast<size_t>(steps));
  ASSERT_EQ(s_two.size(), static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i) {
    EXPECT_NEAR(s_two[i]["loss"].get<double>(), s_one[i]["loss"].get<double>(),
                1e-5 * s_one[i]["loss"].get<double>())
        << "step " << i + 1;
    EXPECT_NEAR(s_two[i]["grad_norm"].get<double>(), s_one[i]["grad_norm"].get<double>(),
                1e-4 * s_one[i]["grad_norm"].get<double>())
        << "step " << i + 1;
    EXPECT_EQ(s_two[i]["tokens"], s_one[i]["tokens"]) << "global tokens of step " << i + 1;
    EXPECT_TRUE(s_two[i].contains("allreduce_s"));
    EXPECT_FALSE(s_one[i].contains("allreduce_s"));
  }
  // Evaluation is sharded over the ranks and summed: the same result as one rank.
  const auto e_one = Events(one.output_dir + "/metrics.jsonl", "eval");
  const auto e_two = Events(two.output_dir + "/metrics.jsonl", "eval");
  ASSERT_EQ(e_one.size(), 1u);
  ASSERT_EQ(e_two.size(), 1u);
  EXPECT_EQ(e_two[0]["eval_targets"], e_one[0]["eval_targets"]);
  EXPECT_NEAR(e_two[0]["eval_loss"].get<double>(), e_one[0]["eval_loss"].get<double>(),
              1e-5 * e_one[0]["eval_loss"].get<double>());
  EXPECT_EQ(e_two[0]["exact_total"], 16);
  EXPECT_EQ(e_two[0]["exact_total"], e_one[0]["exact_total"]);
  EXPECT_EQ(e_two[0]["exact_correct"], e_one[0]["exact_correct"]);

  // Rank 0 reports everything, rank 1 only its start; rank 1 left no token cache behind.
  const std::string base = dir + "/two/two-rank";
  const auto ev0 = ReadMetrics(base + "0.events");
  const auto ev1 = ReadMetrics(base + "1.events");
  ASSERT_FALSE(ev0.empty());
  EXPECT_EQ(ev0.front()["event"], "start");
  EXPECT_EQ(ev0.front()["rank"], 0);
  EXPECT_EQ(ev0.front()["world_size"], 2);
  EXPECT_GT(ev0.front()["buckets"].get<int>(), 2);
  EXPECT_EQ(ev0.back()["event"], "done");
  ASSERT_EQ(ev1.size(), 1u) << ReadWholeFile(base + "1.events");
  EXPECT_EQ(ev1[0]["event"], "start");
  EXPECT_EQ(ev1[0]["rank"], 1);
  EXPECT_EQ(ev1[0]["world_size"], 2);
  EXPECT_TRUE(std::filesystem::is_empty(dir + "/two/tmp-two-rank1"));
  EXPECT_EQ(ReadMetrics(two.output_dir + "/metrics.jsonl").size(), ev0.size());
}

INSTANTIATE_TEST_SUITE_P(GradAccum, TwoRanksEqualOneRank, ::testing::Values(1, 2),
                         [](const auto& info) { return "accum" + std::to_string(info.param); });

// 20 samples in global batches of 8: the third batch holds 4, all on rank 0, so rank 1 has an empty
// shard. It must still take part in every all-reduce (in the same order) and the result must equal
// one rank's.
TEST(TwoRanksEqualOneRankAtEpochEnd, RankWithAnEmptyShardStillAllReduces) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const int64_t steps = 3, b = 4;
  const std::string dir = MakeTempDir("dist-epoch-end");
  JobSpec one = ProcSpec(dir + "/one", steps, 2 * b, 1);
  JobSpec two = ProcSpec(dir + "/two", steps, b, 1);
  for (JobSpec* s : {&one, &two}) {
    const std::string train =
        std::filesystem::path(s->output_dir).parent_path().string() + "/data/train20.jsonl";
    sftctl::testing::WriteWholeFile(train, sftctl::testing::AdditionJsonl(20));
    s->data.train = {train};
  }
  RunJob(one, 1, "one");
  RunJob(two, 2, "two");
  const std::string ckpt = "/checkpoint-00000" + std::to_string(steps);
  const auto w_one = Weights(one.output_dir + ckpt);
  const auto w_two = Weights(two.output_dir + ckpt);
  ASSERT_FALSE(w_one.empty());
  ASSERT_EQ(w_one.size(), w_two.size());
  std::string worst;
  NamedTensors a(w_two.begin(), w_two.end());
  EXPECT_LE(MaxRelDiff(a, w_one, &worst), 1e-5) << worst;
  const auto last = Events(two.output_dir + "/metrics.jsonl", "step").back();
  EXPECT_EQ(last["step"], steps);
  EXPECT_EQ(last["tokens"], Events(one.output_dir + "/metrics.jsonl", "step").back()["tokens"]);
}

// Starts a long 2-rank run and waits until rank 0 has logged a step.
std::vector<Rank> StartLongRun(const JobSpec& spec, const std::string& tag) {
  auto ranks = Launch(spec, 2, tag);
  WaitFor([&] { return !Events(spec.output_dir + "/metrics.jsonl", "step").empty(); },
          std::chrono::seconds(120));
  return ranks;
}

TEST(DistributedFailure, DeadPeerFailsTheSurvivorWithinTheTimeout) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("dist-kill");
  JobSpec spec = ProcSpec(dir + "/job", 100000, 4, 1);
  auto ranks = StartLongRun(spec, "kill");
  ASSERT_FALSE(Events(spec.output_dir + "/metrics.jsonl", "step").empty()) << ReadWholeFile(ranks[0].log);
  ::kill(ranks[1].pid, SIGKILL);
  EXPECT_EQ(WaitExit(ranks[1].pid, std::chrono::seconds(30)), 128 + SIGKILL);
  const int code = WaitExit(ranks[0].pid, std::chrono::seconds(20 + 30));
  const std::string log = ReadWholeFile(ranks[0].log);
  ASSERT_NE(code, -1) << "rank 0 did not exit within the timeout:\n" << log;
  EXPECT_NE(code, 0);
  EXPECT_NE(log.find("rank 0: collective"), std::string::npos) << log;
  EXPECT_NE(log.find("peer connection closed (a peer rank died or hung; distributed.timeout_s = 20)"),
            std::string::npos)
      << log;
  // The supervisor also gets the error on the events descriptor.
  const auto errors = Events(ranks[0].events, "error");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0]["code"], "UNAVAILABLE");
}

TEST(DistributedFailure, HungPeerFailsTheSurvivorWithinTheTimeout) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("dist-hang");
  JobSpec spec = ProcSpec(dir + "/job", 100000, 4, 1);
  spec.distributed.timeout_s = 10;
  auto ranks = StartLongRun(spec, "hang");
  ASSERT_FALSE(Events(spec.output_dir + "/metrics.jsonl", "step").empty()) << ReadWholeFile(ranks[0].log);
  ::kill(ranks[1].pid, SIGSTOP);
  const int code = WaitExit(ranks[0].pid, std::chrono::seconds(10 + 30));
  ::kill(ranks[1].pid, SIGKILL);
  WaitExit(ranks[1].pid, std::chrono::seconds(30));
  const std::string log = ReadWholeFile(ranks[0].log);
  ASSERT_NE(code, -1) << "rank 0 did not exit within the timeout:\n" << log;
  EXPECT_NE(code, 0);
  EXPECT_NE(log.find("rank 0: collective"), std::string::npos) << log;
  EXPECT_NE(log.find("timed out (a peer rank died or hung; distributed.timeout_s = 10)"), std::string::npos)
      << log;
}

TEST(DistributedFailure, MissingRankFailsTheRendezvousWithinTheTimeout) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("dist-alone");
  JobSpec spec = ProcSpec(dir + "/job", 4, 4, 1);
  spec.distributed.timeout_s = 2;
  auto ranks = Launch(spec, 2, "alone");
  ::kill(ranks[1].pid, SIGKILL);  // rank 1 never arrives
  WaitExit(ranks[1].pid, std::chrono::seconds(30));
  const int code = WaitExit(ranks[0].pid, std::chrono::seconds(2 + 30));
  const std::string log = ReadWholeFile(ranks[0].log);
  ASSERT_NE(code, -1) << "rank 0 did not exit within the timeout:\n" << log;
  EXPECT_EQ(code, 1);
  EXPECT_NE(log.find("rank 0: cannot join the other ranks at 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("timed out: 1 of 2 ranks arrived"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(spec.output_dir)) << "nothing is written before the ranks meet";
}

// Only rank 0 writes a checkpoint; the others wait for it up to checkpoint.save_timeout_s, however
// short distributed.timeout_s is (a 3B full fine-tune writes ~36 GB). The first checkpoint is made
// slow by a trainer of the test's own (tests/trainer/slow_checkpoint_trainer.cpp).
JobSpec SlowSaveSpec(const std::string& dir) {
  JobSpec spec = ProcSpec(dir + "/job", 3, 4, 1);
  spec.checkpoint.interval = 1;  // steps 2 and 3 follow the slow checkpoint of step 1
  spec.distributed.timeout_s = 5;
  spec.eval.exact_match = false;
  return spec;
}
constexpr int kSlowSaveS = 12;

TEST(DistributedCheckpointWait, SaveSlowerThanTheCollectiveTimeoutDoesNotFailTheJob) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("dist-slow-save");
  const JobSpec spec = SlowSaveSpec(dir);
  auto ranks = Launch(spec, 2, "slow", {"SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S=" + std::to_string(kSlowSaveS)},
                      testing::kSlowCheckpointTrainer);
  for (int r = 0; r < 2; ++r) {
    const int code = WaitExit(ranks[r].pid, std::chrono::seconds(240));
    ASSERT_EQ(code, 0) << "rank " << r << ":\n" << ReadWholeFile(ranks[r].log);
  }
  for (const char* ckpt : {"/checkpoint-000002", "/checkpoint-000003"})
    EXPECT_TRUE(IsComplete(FileSystem::Default(), spec.output_dir + ckpt)) << ckpt;
  EXPECT_EQ(Events(spec.output_dir + "/metrics.jsonl", "step").size(), 3u);
}

TEST(DistributedCheckpointWait, SaveLongerThanSaveTimeoutFailsTheWaitingRankNamingTheSetting) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("dist-save-timeout");
  JobSpec spec = SlowSaveSpec(dir);
  spec.checkpoint.save_timeout_s = 2;
  auto ranks = Launch(spec, 2, "late", {"SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S=" + std::to_string(kSlowSaveS)},
                      testing::kSlowCheckpointTrainer);
  const int code1 = WaitExit(ranks[1].pid, std::chrono::seconds(120));
  const int code0 = WaitExit(ranks[0].pid, std::chrono::seconds(kSlowSaveS + 60));
  const std::string log1 = ReadWholeFile(ranks[1].log);
  EXPECT_EQ(code1, 1) << log1;
  EXPECT_NE(code0, 0) << "rank 0 goes on alone into a collective that rank 1 left";
  EXPECT_THAT(log1, ::testing::HasSubstr("rank 1: waited"));
  EXPECT_THAT(log1, ::testing::HasSubstr("for rank 0 writing checkpoint-000001"));
  EXPECT_THAT(log1, ::testing::HasSubstr("took longer than checkpoint.save_timeout_s = 2)"));
}

// The interrupted two-rank run that resumes bit for bit: tests/trainer/zero_test.cpp ShardedResume
// (Stage/none, and the sharded stages).

TEST(DistributedResume, TwoRankCheckpointContinuesOnOneRank) {
  SFTCTL_SKIP_WITHOUT_GLOO();
  const std::string dir = MakeTempDir("dist-shrink");
  // 2 ranks x 4 sequences x 2 micro-batches: 16 samples per step, 48 after 3 steps.
  JobSpec spec = ProcSpec(dir + "/job", 3, 4, 2);
  spec.eval.exact_match = false;
  RunJob(spec, 2, "two");
  auto st = ReadTrainerState(spec.output_dir + "/checkpoint-000003");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->step, 3);
  EXPECT_EQ(st->epoch, 0);
  EXPECT_EQ(st->position, 48);

  // 1 rank, same per-rank batch: 8 samples per step from position 48 on; 96 samples per epoch,
  // so steps 4-9 finish epoch 0 and step 10 takes the first 8 samples of epoch 1.
  spec.train.max_steps = 10;
  RunJob(spec, 1, "one");
  const auto start = Events(spec.output_dir + "/metrics.jsonl", "start");
  ASSERT_EQ(start.size(), 2u);
  EXPECT_EQ(start[1]["step"], 3);
  EXPECT_FALSE(start[1].contains("world_size"));
  st = ReadTrainerState(spec.output_dir + "/checkpoint-000010");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->step, 10);
  EXPECT_EQ(st->epoch, 1);
  EXPECT_EQ(st->position, 8);
  const auto steps = Events(spec.output_dir + "/metrics.jsonl", "step");
  ASSERT_EQ(steps.size(), 10u);
  EXPECT_DOUBLE_EQ(steps[3]["epoch"].get<double>(), 56.0 / 96.0);
  EXPECT_TRUE(std::isfinite(steps.back()["loss"].get<double>()));
}

}  // namespace
}  // namespace sftctl::trainer
