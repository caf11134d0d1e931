// The AdamW moments of a sharded (ZeRO) run in a checkpoint: one file per rank plus a manifest.
//
//   <checkpoint>/optimizer_shards.json                      the manifest (below)
//   <checkpoint>/optimizer-shard-00000-of-00002.safetensors rank 0's slices: "exp_avg.<group>",
//   <checkpoint>/optimizer-shard-00001-of-00002.safetensors "exp_avg_sq.<group>" (fp32, 1-D)
//
// The optimizer keeps every trainable parameter in flat buffers, one per weight-decay group
// (trainer/distributed/optimizer.h); each rank owns a contiguous element range of each buffer.
// The manifest records the buffers' layout (every parameter's group, offset and size) and which
// range of which group each file holds, so a reader can fetch any parameter's moments, or any
// slice of them, without knowing the world size that wrote them: a resume at another world size
// (or without sharding) re-shards by reading the ranges it needs.
//
//   {"format": 1, "world_size": 2,
//    "groups": [{"numel": 1234, "weight_decay": 0.01}, ...],
//    "params": [{"name": "model.layers.0.mlp.up_proj.weight", "group": 0, "offset": 0,
//                "numel": 512}, ...],
//    "files": [{"file": "optimizer-shard-00000-of-00002.safetensors", "rank": 0,
//               "ranges": [{"group": 0, "begin": 0, "end": 624}, ...]}, ...]}
//
// Unsharded checkpoints keep the moments per parameter in optimizer.safetensors
// ("exp_avg.<name>", "exp_avg_sq.<name>"); MomentReader reads either kind.
//
// Thread safety: a ShardedMoments is used by one thread.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/formats/safetensors.h"
#include "common/status.h"

namespace sftctl::trainer {

inline constexpr const char* kOptimizerShardManifest = "optimizer_shards.json";

// "optimizer-shard-00001-of-00004.safetensors".
std::string OptimizerShardFileName(int rank, int world_size);

struct OptimizerShardManifest {
  struct Group {
    int64_t numel = 0;
    double weight_decay = 0;
  };
  struct Param {
    std::string name;
    int group = 0;
    int64_t offset = 0, numel = 0;
  };
  struct Range {
    int group = 0;
    int64_t begin = 0, end = 0;  // elements [begin, end) of the group's flat buffer
  };
  struct File {
    std::string file;  // a name inside the checkpoint folder
    int rank = 0;
    std::vector<Range> ranges;
  };
  int world_size = 1;
  std::vector<Group> groups;
  std::vector<Param> params;
  std::vector<File> files;

  nlohmann::json ToJson() const;
  // Every field's type and value: groups and params consistent (each parameter inside its group,
  // names unique), file names plain names, and each group's ranges covering it exactly once.
  // Errors are DATA_LOSS naming `source` and the field.
  static StatusOr<OptimizerShardManifest> FromJson(const nlohmann::json& j, const std::string& source);
};

// Fills `out` (a 1-D fp32 tensor of `count` elements, any device) with elements [begin, begin +
// count) of the flattened moment `kind` ("exp_avg" or "exp_avg_sq") of parameter `name`, which
// has `numel` elements in this run. Errors name the source and the tensor: a missing parameter, a
// parameter of another size.
using MomentReader = std::function<Status(const std::string& kind, const std::string& name, int64_t numel,
                                          int64_t begin, int64_t count, const torch::Tensor& out)>;

// Reads an unsharded checkpoint's per-parameter moments ("<kind>.<name>" in `saved`, the tensors
// of optimizer.safetensors). `saved` must outlive the reader.
MomentReader PerParameterMoments(const std::map<std::string, torch::Tensor>* saved);

// Reads a sharded checkpoint's moments through its manifest, mapping each shard file when first
// needed (and keeping it mapped while this object lives).
class ShardedMoments {
 public:
  // Reads and validates <dir>/optimizer_shards.json. Errors: the manifest's (DATA_LOSS), or the
  // file system's.
  static StatusOr<std::unique_ptr<ShardedMoments>> Open(const std::string& dir);
  const OptimizerShardManifest& manifest() const { return manifest_; }
  // A MomentReader over this object (which must outlive it).
  MomentReader Reader();

 private:
  ShardedMoments() = default;
  Status Read(const std::string& kind, const std::string& name, int64_t numel, int64_t begin, int64_t count,
              const torch::Tensor& out);
  // Copies elements [begin, end) of group `group`'s moment `kind` into `out` (CPU, fp32).
  Status ReadGroupRange(const std::string& kind, int group, int64_t begin, int64_t end, float* out);
  StatusOr<const safetensors::Reader*> File(const std::string& name);

  std::string dir_;
  OptimizerShardManifest manifest_;
  std::map<std::string, size_t> param_index_;
  std::map<std::string, std::unique_ptr<safetensors::Reader>> files_;
};

// Whether checkpoint folder `dir` holds sharded optimizer state (an optimizer_shards.json).
bool HasShardedMoments(const std::string& dir);

}  // namespace sftctl::trainer
