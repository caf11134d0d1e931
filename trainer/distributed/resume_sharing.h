// Resuming with several ranks: rank 0 alone reads the checkpoint (so ranks need no shared folder),
// then every rank is made equal to it here -- the trainer state, the parameters, the AdamW moments
// (or each rank's shard of them), frozen base weights rank 0 loaded, and each rank's own saved RNG
// streams. The one place that says what rank 0 sends and in which order.
//
// Thread safety: plain functions over one process group; every rank of the group must call
// ShareRankZeroState at the same point (it is a sequence of collectives).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/optimizer_shards.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/optimizer.h"
#include "trainer/model/model.h"

namespace sftctl::trainer {

// What rank 0 tells the other ranks first, packed into one int64 tensor (the doubles by their
// bits): the layout lives here only.
struct RankZeroHeader {
  bool resumed = false;
  bool base_loaded = false;  // rank 0 loaded frozen base weights from the checkpoint
  TrainerState state;
  // Per rank: which of its RNG streams the checkpoint holds (kCpuRng | kCudaRng bits).
  std::vector<char> rank_has_rng;
  static constexpr char kCpuRng = 1, kCudaRng = 2;

  torch::Tensor Pack() const;
  // REQUIRES: `packed` came from Pack() (on any device).
  static RankZeroHeader Unpack(const torch::Tensor& packed);
};

// What rank 0 read from the checkpoint to resume from. Other ranks pass an empty one.
struct RankZeroResume {
  bool base_loaded = false;  // frozen base weights came from the checkpoint (a LoRA run's)
  // The checkpoint's optimizer tensors (its per-rank RNG streams among them).
  const std::map<std::string, torch::Tensor>* saved = nullptr;
  // The checkpoint's moments, any layout (a sharded optimizer reads each rank's shard with it).
  const MomentReader* moments = nullptr;
};

// Makes every rank's `model`, `optimizer`, `*state` and RNG streams equal to rank 0's. On rank 0,
// `*resume_dir` says whether it resumed; on the others it becomes "(rank 0's checkpoint)" when it
// did. The other ranks wait for each sharded-moment read rank 0 makes up to `read_timeout_s`
// (checkpoint.save_timeout_s). Errors: the collectives' (a lost rank, a timeout) and rank 0's reads.
Status ShareRankZeroState(ProcessGroup& pg, CausalLM& model, FlatAdamW& optimizer, const RankZeroResume& from,
                          double read_timeout_s, const torch::Device& device, TrainerState* state,
                          std::optional<std::string>* resume_dir);

}  // namespace sftctl::trainer
