// Multi-rank data-parallel training: the process group and the bucketed gradient all-reduce.
//
// A supervisor (sftd, or `sftctl run --local --ranks N`) starts one sftctl-trainer per rank with
//   RANK, WORLD_SIZE          this process's global rank and the number of ranks
//   LOCAL_RANK, LOCAL_WORLD_SIZE   its index and the rank count on this host (GPU cuda:LOCAL_RANK,
//                             CPU threads = cores / LOCAL_WORLD_SIZE)
//   MASTER_ADDR, MASTER_PORT  where rank 0 serves the rendezvous store (c10d::TCPStore)
//   GLOO_SOCKET_IFNAME        optional: the network interface Gloo binds to
// WORLD_SIZE unset or 1 means a single process: no process group, nothing here is used.
//
// ProcessGroup joins a c10d process group (Gloo on CPU; NCCL on CUDA, when compiled in) and
// wraps the few collectives the trainer needs. Each collective takes tensors on any device: the
// group stages them on its own device (CUDA for NCCL, which accepts nothing else; CPU for Gloo)
// and copies results back, in one place (ProcessGroup's Stage/Unstage), so call sites may pass
// host tensors (counts, the resume header, RNG states). Every collective and the store use
// distributed.timeout_s: a dead peer (connection closed, NCCL error) or a hung one (no progress
// within the timeout) turns into an UNAVAILABLE Status that names this rank, the collective,
// the time it waited and the cause, on every surviving rank. NCCL is configured for that
// before the group is created (blocking waits, errors cleaned up without tearing the process
// down; docs/distributed.md). After such an error the process group is unusable; its threads
// may still be blocked in a socket or a kernel, so it is aborted (NCCL) and deliberately leaked
// rather than joined.
//
// GradBuckets overlaps the gradient all-reduce with backward the way DDP does: the flat
// gradient buffers of FlatAdamW are cut into buckets of about distributed.bucket_mb (in reverse
// registration order, since backward produces the last layers' gradients first); while armed, a
// post-hook on each parameter's gradient accumulator counts down its bucket and launches an
// asynchronous SUM all-reduce of the bucket as soon as all its gradients are final. Buckets are
// launched strictly in bucket order so every rank issues the same collectives in the same order.
//
// Thread safety: one thread at a time uses a ProcessGroup: the training thread, except that
// GradBuckets' hooks call AllReduceSumAsync while the training thread is inside backward (on
// CUDA from an autograd worker thread; the hooks are serialised by GradBuckets' mutex).
// Arm/Finish belong to the training thread.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "trainer/distributed/optimizer.h"

namespace sftctl::trainer {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string socket_ifname;  // GLOO_SOCKET_IFNAME; empty: choose from master_addr
  bool distributed() const { return world_size > 1; }
};

// Reads the variables above through `getenv` (tests pass their own). Errors name the variable:
// non-integers, RANK outside [0, WORLD_SIZE), LOCAL_RANK outside [0, LOCAL_WORLD_SIZE), a
// missing MASTER_ADDR / MASTER_PORT when WORLD_SIZE > 1.
StatusOr<DistEnv> ParseDistEnv(const std::function<const char*(const char*)>& getenv);
StatusOr<DistEnv> ReadDistEnv();  // from the process environment

// Data sharding. Every rank draws the same `drawn` global samples per micro-step (W * b, or
// fewer at the end of an epoch); rank r trains on positions [begin, end) of them:
// [r*b, (r+1)*b) clamped to `drawn`, so a short last batch may leave a rank empty.
std::pair<int64_t, int64_t> ShardSlice(int64_t drawn, int64_t per_rank, int rank);

// One parameter's place in the optimizer's flat buffers (see FlatAdamW::Slots).
struct ParamSlot {
  int group = 0;       // which flat buffer
  int64_t offset = 0;  // first element in it
  int64_t numel = 0;
  int64_t index = 0;  // registration order (position in model->named_parameters())
};

// A contiguous slice [offset, offset + numel) of flat buffer `group`, holding `slots`.
struct Bucket {
  int group = 0;
  int64_t offset = 0;
  int64_t numel = 0;
  std::vector<size_t> slots;  // indices into the ParamSlot list
};

// Cuts the flat gradient buffers into buckets of at least `cap_bytes` (fp32) where the
// parameters allow (a parameter is never split; the last bucket of a group may be smaller).
// Parameters are taken in reverse registration order within each group, and buckets are
// returned in launch order: descending by the highest registration index they hold, so the
// bucket whose gradients backward finishes first comes first. REQUIRES: cap_bytes > 0.
std::vector<Bucket> AssignBuckets(const std::vector<ParamSlot>& slots, int64_t cap_bytes);

// Which c10d backends this trainer was built with: Gloo (CPU ranks) needs LibTorch's gloo headers,
// NCCL (CUDA ranks) a CUDA LibTorch and nccl.h (trainer/CMakeLists.txt).
bool GlooAvailable();
bool NcclAvailable();

// Cause text of a collective failure: "peer connection closed", "timed out", or the original.
// LibTorch and Gloo report these only as text (c10::Error, gloo::IoException); this is the one place
// that reads it. Our own errors are told apart by type.
std::string DescribeCommError(const std::string& what);

class ProcessGroup {
 public:
  // Rendezvous through rank 0's TCPStore and creates the backend. `device` picks NCCL (CUDA) or
  // Gloo (CPU). Errors: FAILED_PRECONDITION when that backend is not compiled in, or `device` is a
  // CUDA device this process cannot use (before any rendezvous); UNAVAILABLE naming the rank,
  // master address and timeout.
  static StatusOr<std::unique_ptr<ProcessGroup>> Join(const DistEnv& env, const torch::Device& device,
                                                      double timeout_s);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Test seam: a group that communicates with nobody. Each collective stages its tensors on
  // `device` exactly as a real group does and hands them to `recorder` (the collective's name,
  // what it is for, and each tensor as the backend would receive it). Results are this rank's
  // own values (an all-reduce as if the other ranks contributed zeros, a broadcast as if this
  // rank were the root, an all-gather of `world_size` copies); a `meta` device carries no data,
  // so nothing is copied back from it and the caller's tensors keep their values.
  using Recorder =
      std::function<void(const std::string& op, const std::string& what, const torch::Tensor& t)>;
  static std::unique_ptr<ProcessGroup> Recording(int rank, int world_size, const torch::Device& device,
                                                 Recorder recorder);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& backend() const { return backend_name_; }
  double timeout_s() const { return timeout_s_; }
  // Where collectives run: the CUDA device for NCCL, the CPU for Gloo.
  const torch::Device& device() const { return device_; }

  // Blocking collectives on whole tensors (same shape and dtype on every rank, any device;
  // results land in the caller's tensors).
  Status AllReduceSum(torch::Tensor& t, const std::string& what = "allreduce");
  Status Broadcast(torch::Tensor& t, int root, const std::string& what = "broadcast");
  // `out` receives one tensor per rank, each shaped like `in` and on `in`'s device.
  Status AllGather(const torch::Tensor& in, std::vector<torch::Tensor>* out,
                   const std::string& what = "allgather");

  // ZeRO's parameter all-gather: `padded` (1-D, world_size() * `shard` elements, the same on every
  // rank) holds this rank's up-to-date slice [rank * shard, (rank + 1) * shard); afterwards every
  // slice holds its owner's values, in place (no temporary). NCCL: one _allgather_base into the
  // tensor itself; Gloo (and any other backend): one broadcast per rank from its slice (Gloo's
  // allgather would gather into a temporary of the whole buffer). A recording group records op
  // "allgather" with the slice and leaves `padded` as it is.
  Status AllGatherShards(torch::Tensor& padded, int64_t shard, const std::string& what = "allgather");

  // Rank 0 alone does something long (writes or reads a checkpoint) while the others wait for
  // its outcome, bounded by `timeout_s` instead of distributed.timeout_s (no collective is pending
  // meanwhile, so no collective timeout runs). Every rank calls it at the same point: rank 0 with
  // the outcome of its work (`root_outcome`, returned as it is), the others with OkStatus(); they
  // get OK, or rank 0's error as ABORTED ("rank 0 failed <what>: ..."), or UNAVAILABLE when rank 0
  // sent nothing within `timeout_s` or died (naming `timeout_field`, the setting to raise). Rank 0
  // then waits (up to distributed.timeout_s) until every rank has read its outcome, since the store
  // it serves ends with its process. Goes through the rendezvous store, so it works alike for Gloo
  // and NCCL. A recording group records op "await" with an empty tensor on its device.
  Status AwaitRoot(const Status& root_outcome, double timeout_s, const std::string& what,
                   const std::string& timeout_field);

  // Asynchronous SUM all-reduce of `t` (in place; copied back by Wait when `t` is not on the
  // group's device). The handle is waited with Wait.
  class Pending;
  std::shared_ptr<Pending> AllReduceSumAsync(torch::Tensor t, const std::string& what = "allreduce");
  // Asynchronous SUM reduce of `t` into rank `root`'s `t` (ZeRO-2's gradient pieces, each to the
  // rank that owns it); the other ranks' `t` is undefined afterwards. Waited with Wait. A
  // recording group records op "reduce".
  std::shared_ptr<Pending> ReduceSumAsync(torch::Tensor t, int root, const std::string& what = "reduce");
  Status Wait(const std::shared_ptr<Pending>& p, const std::string& what = "allreduce");

 private:
  struct Impl;
  ProcessGroup() = default;
  Status Failed(const std::string& what, double waited_s, const std::string& cause);
  // root < 0: all-reduce; else reduce to `root`.
  std::shared_ptr<Pending> LaunchSumAsync(torch::Tensor t, int root, const std::string& what);
  // The one place tensors move to and from the group's device.
  torch::Tensor Stage(const torch::Tensor& t) const;
  void Unstage(torch::Tensor& original, const torch::Tensor& staged) const;

  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_size_ = 1;
  double timeout_s_ = 300;
  torch::Device device_{torch::kCPU};
  std::string backend_name_;
  bool broken_ = false;
  int64_t awaits_ = 0;  // AwaitRoot calls so far: each uses its own store key
};

// All-gathers `optimizer`'s parameter buffers after a sharded Step (AllGatherShards per group).
// Does nothing for an unsharded optimizer.
Status GatherParameters(ProcessGroup& pg, const FlatAdamW& optimizer);

// Bucketed, backward-overlapped SUM all-reduce of FlatAdamW's gradient buffers.
//
// ZeRO-2 (the optimizer shards_gradients()): there is no whole gradient buffer. As each
// parameter's gradient becomes final it is added into its bucket's own staging buffer and freed;
// a complete bucket is cut at the shard boundaries (ShardLayout) and each piece reduced (SUM) to
// the rank that owns it, which adds it into its shard of the optimizer's gradients once the
// reduce is done; at most kMaxBucketsInFlight staging buffers exist at a time (the hook waits for
// the oldest beyond that). Gradients are not kept between micro-batches, so every micro-batch's
// backward is one round of Arm, backward, Finish; a rank whose micro-batch was empty runs the
// round with Finish alone (zeros), so every rank issues the same reduces in the same order.
class GradBuckets {
 public:
  static constexpr size_t kMaxBucketsInFlight = 4;
  // Buckets `optimizer`'s gradient buffers and registers a post-hook on each trainable
  // parameter's gradient accumulator. `pg` and the optimizer's buffers must outlive this object.
  GradBuckets(ProcessGroup* pg, const FlatAdamW& optimizer, double bucket_mb);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // The next backward (the window's last micro-batch) launches buckets as their gradients
  // become final.
  void Arm();
  // Launches every bucket not launched yet (in order; all of them when Arm() was not called
  // because this rank's shard of the window was empty), waits for all, disarms. `wait_s`
  // receives the time spent waiting. After it returns OK the buffers hold the sum over ranks.
  Status Finish(double* wait_s);
  size_t num_buckets() const { return buckets_.size(); }
  // ZeRO-2: buckets reduced to their owners (Finish once per micro-batch).
  bool reduces_to_owners() const { return to_owner_; }

 private:
  struct InFlight {  // ZeRO-2: one bucket's pieces being reduced
    size_t bucket = 0;
    std::vector<std::shared_ptr<ProcessGroup::Pending>> pieces;
  };
  void OnGradReady(size_t slot);
  void LaunchReadyLocked() REQUIRES(mu_);
  // ZeRO-2: the bucket's staging buffer (zeros when first asked for in a round).
  torch::Tensor& StagingLocked(size_t bucket) REQUIRES(mu_);
  void LaunchToOwnersLocked(size_t bucket) REQUIRES(mu_);
  // Waits for in-flight buckets, oldest first, until at most `keep` remain; adds this rank's
  // pieces into its gradient shard and frees the staging buffers. The first error is kept.
  void DrainLocked(size_t keep) REQUIRES(mu_);

  ProcessGroup* pg_;
  std::vector<ParamSlot> slots_;
  std::vector<torch::Tensor> grad_buffers_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_slot_;
  // ZeRO-2.
  bool to_owner_ = false;
  int rank_ = 0;
  std::vector<torch::Tensor> params_;  // per slot
  std::vector<ShardLayout> layouts_;   // per group
  // The hooks run on autograd's threads, Arm and Finish on the training thread: what they share is
  // guarded by mu_.
  Mutex mu_;
  std::vector<torch::Tensor> staging_ GUARDED_BY(mu_);  // per bucket; undefined when not in use
  std::deque<InFlight> in_flight_ GUARDED_BY(mu_);
  Status first_error_ GUARDED_BY(mu_);
  // Keeps the hooked grad accumulators alive: each holds the owning pointer grad_accumulator()
  // returned (a std::shared_ptr or, from LibTorch 2.14, a c10::intrusive_ptr).
  std::vector<std::shared_ptr<void>> accumulators_;

  bool armed_ GUARDED_BY(mu_) = false;
  std::vector<int64_t> remaining_ GUARDED_BY(mu_);  // per bucket: slots whose gradient is not final yet
  size_t next_ GUARDED_BY(mu_) = 0;                 // next bucket to launch
  std::vector<std::shared_ptr<ProcessGroup::Pending>> pending_ GUARDED_BY(mu_);
};

}  // namespace sftctl::trainer
