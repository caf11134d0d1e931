#include "trainer/distributed/resume_sharing.h"

#include <fmt/format.h>

#include <cstring>

#include "trainer/runtime/rng_state.h"

namespace sftctl::trainer {
namespace {

// The header tensor's slots; the per-rank RNG bits follow kRanks.
enum HeaderField {
  kResumed,
  kBaseLoaded,
  kStep,
  kEpoch,
  kPosition,
  kTokensSeen,
  kBadSteps,
  kElapsedBits,
  kLossScaleBits,
  kLossScaleGoodSteps,
  kRanks
};

bool SameShape(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.sizes() == b.sizes();
}

// Sends rank r > 0 its saved RNG streams (the `has` bits of RankZeroHeader) from rank 0.
// `saved`: rank 0's checkpoint tensors (null elsewhere).
Status ShareRankRng(ProcessGroup& pg, int r, char has, const RngState& own, const torch::Device& device,
                    const std::map<std::string, torch::Tensor>* saved) {
  RngState got;
  const RngState from = pg.rank() == 0 && saved != nullptr ? FindRng(*saved, r) : RngState();
  if (has & RankZeroHeader::kCpuRng) {
    got.cpu = pg.rank() == 0 ? from.cpu.clone() : torch::empty_like(own.cpu);
    SFT_RETURN_IF_ERROR(pg.Broadcast(got.cpu, 0, "broadcast (RNG states)"));
  }
  if (has & RankZeroHeader::kCudaRng) {
    got.cuda = pg.rank() == 0 ? from.cuda.clone() : torch::empty_like(own.cuda);
    SFT_RETURN_IF_ERROR(pg.Broadcast(got.cuda, 0, "broadcast (CUDA RNG states)"));
  }
  if (pg.rank() == r) RestoreRng(got, device);
  return OkStatus();
}

// A sharded optimizer's moments on resume: rank 0 reads each other rank's shard from the
// checkpoint (`read`, any layout: trainer/checkpoint/optimizer_shards.h) and broadcasts it; only
// its owner keeps it. The other ranks wait for each read as for the checkpoint's
// (checkpoint.save_timeout_s).
Status ShareMomentShards(ProcessGroup& pg, FlatAdamW& optimizer, const MomentReader* read, double timeout_s) {
  for (int r = 1; r < pg.world_size(); ++r) {
    std::vector<torch::Tensor> shard;
    Status st;
    if (pg.rank() == 0) {
      StatusOr<std::vector<torch::Tensor>> got = optimizer.ReadMomentShard(*read, r);
      if (got.ok()) shard = std::move(*got);
      st = got.status();
    }
    SFT_RETURN_IF_ERROR(pg.AwaitRoot(st, timeout_s, fmt::format("reading optimizer shard {}", r),
                                     "checkpoint.save_timeout_s"));
    if (pg.rank() != 0) {
      shard = optimizer.MomentBuffers();  // rank r receives in place; the others into scratch
      if (pg.rank() != r)
        for (auto& t : shard) t = torch::empty_like(t);
    }
    for (auto& t : shard) SFT_RETURN_IF_ERROR(pg.Broadcast(t, 0, "broadcast (optimizer shards)"));
  }
  return OkStatus();
}

// Rank 0's header: whether it resumed, its state, and which RNG streams the checkpoint holds for
// each other rank (those shaped as this process's own: trainer/runtime/rng_state.h).
RankZeroHeader RankZeroHeaderOf(int world, const RngState& own, const RankZeroResume& from,
                                const TrainerState& state, bool resumed) {
  RankZeroHeader mine;
  mine.rank_has_rng.assign(world, 0);
  mine.resumed = resumed;
  mine.base_loaded = from.base_loaded;
  mine.state = state;
  for (int r = 1; r < world && from.saved != nullptr; ++r) {
    const RngState saved = FindRng(*from.saved, r);
    mine.rank_has_rng[r] =
        static_cast<char>((SameShape(saved.cpu, own.cpu) ? RankZeroHeader::kCpuRng : 0) |
                          (SameShape(saved.cuda, own.cuda) ? RankZeroHeader::kCudaRng : 0));
  }
  return mine;
}

}  // namespace

torch::Tensor RankZeroHeader::Pack() const {
  torch::Tensor t = torch::zeros({kRanks + static_cast<int64_t>(rank_has_rng.size())}, torch::kInt64);
  auto h = t.accessor<int64_t, 1>();
  h[kResumed] = resumed;
  h[kBaseLoaded] = base_loaded;
  h[kStep] = state.step;
  h[kEpoch] = state.epoch;
  h[kPosition] = state.position;
  h[kTokensSeen] = state.tokens_seen;
  h[kBadSteps] = state.bad_steps;
  std::memcpy(&h[kElapsedBits], &state.elapsed_s, sizeof(double));
  std::memcpy(&h[kLossScaleBits], &state.loss_scale, sizeof(double));
  h[kLossScaleGoodSteps] = state.loss_scale_good_steps;
  for (size_t r = 0; r < rank_has_rng.size(); ++r) h[kRanks + static_cast<int64_t>(r)] = rank_has_rng[r];
  return t;
}

RankZeroHeader RankZeroHeader::Unpack(const torch::Tensor& packed) {
  const torch::Tensor t = packed.to(torch::kCPU).contiguous();
  auto h = t.accessor<int64_t, 1>();
  RankZeroHeader out;
  out.resumed = h[kResumed] != 0;
  out.base_loaded = h[kBaseLoaded] != 0;
  out.state.step = h[kStep];
  out.state.epoch = h[kEpoch];
  out.state.position = h[kPosition];
  out.state.tokens_seen = h[kTokensSeen];
  out.state.bad_steps = h[kBadSteps];
  std::memcpy(&out.state.elapsed_s, &h[kElapsedBits], sizeof(double));
  std::memcpy(&out.state.loss_scale, &h[kLossScaleBits], sizeof(double));
  out.state.loss_scale_good_steps = h[kLossScaleGoodSteps];
  for (int64_t r = kRanks; r < t.size(0); ++r) out.rank_has_rng.push_back(static_cast<char>(h[r]));
  return out;
}

Status ShareRankZeroState(ProcessGroup& pg, CausalLM& model, FlatAdamW& optimizer, const RankZeroResume& from,
                          double read_timeout_s, const torch::Device& device, TrainerState* state,
                          std::optional<std::string>* resume_dir) {
  torch::NoGradGuard no_grad;
  const int rank = pg.rank(), world = pg.world_size();
  const RngState own = CaptureRng(device);
  RankZeroHeader mine;
  mine.rank_has_rng.assign(world, 0);
  if (rank == 0) mine = RankZeroHeaderOf(world, own, from, *state, resume_dir->has_value());
  torch::Tensor packed = mine.Pack();
  SFT_RETURN_IF_ERROR(pg.Broadcast(packed, 0, "broadcast (resume state)"));
  const RankZeroHeader h = RankZeroHeader::Unpack(packed);
  const bool resumed = h.resumed;
  if (rank != 0) {
    *state = h.state;
    if (resumed) *resume_dir = "(rank 0's checkpoint)";
  }
  // Trainable parameters always (the seeded init already agrees; this makes it certain), the
  // moments when resumed, frozen weights when rank 0 loaded them from the checkpoint.
  std::vector<torch::Tensor> buffers = optimizer.ParamBuffers();
  if (resumed && !optimizer.sharded()) {
    for (auto& m : optimizer.MomentBuffers()) buffers.push_back(m);
  }
  for (auto& b : buffers)
    SFT_RETURN_IF_ERROR(pg.Broadcast(b, 0, "broadcast (parameters and optimizer state)"));
  if (resumed && optimizer.sharded())
    SFT_RETURN_IF_ERROR(ShareMomentShards(pg, optimizer, from.moments, read_timeout_s));
  if (h.base_loaded) {
    for (const auto& p : model->parameters()) {
      if (p.requires_grad()) continue;
      torch::Tensor t = p.data();
      SFT_RETURN_IF_ERROR(pg.Broadcast(t, 0, "broadcast (frozen weights)"));
    }
  }
  optimizer.set_steps(state->step);
  for (int r = 1; r < world; ++r) {
    if (h.rank_has_rng[r] == 0) continue;
    SFT_RETURN_IF_ERROR(ShareRankRng(pg, r, h.rank_has_rng[r], own, device, from.saved));
  }
  return OkStatus();
}

}  // namespace sftctl::trainer
