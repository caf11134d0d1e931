// Scheduler: FIFO admission of jobs onto the host's GPUs and CPU rank slots.
//
// Pure bookkeeping (no processes, no I/O). A job wants N GPUs (one rank each) or M CPU ranks. Jobs
// start in submission order; when the oldest waiting job of a resource kind does not fit, younger jobs
// of the same kind wait too (no starvation of big jobs); GPU and CPU jobs do not block each other.
//
// Thread safety: not thread-safe; the supervisor uses it from its event thread, except CheckFits,
// which reads only the capacity fixed at construction and may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::agent {

struct Allocation {
  std::string job_id;
  std::vector<int> gpus;  // device indices, ascending; empty for a CPU job
  uint32_t cpu_ranks = 0;
};

class Scheduler {
 public:
  Scheduler(std::vector<int> gpu_indices, uint32_t cpu_slots);

  // FAILED_PRECONDITION when the job could never fit on this host. Thread-safe.
  Status CheckFits(uint32_t gpus, uint32_t cpu_ranks) const;
  // Appends to the FIFO (no-op if already queued).
  void Enqueue(const std::string& job_id, uint32_t gpus, uint32_t cpu_ranks);
  // Removes a queued job (cancel). Returns whether it was queued.
  bool Dequeue(const std::string& job_id);
  // Takes the jobs that can start now, in FIFO order, with their resources allocated.
  std::vector<Allocation> Admit();
  // Marks a job's resources as in use (re-attached after an agent restart).
  void Adopt(const std::string& job_id, const std::vector<int>& gpus, uint32_t cpu_ranks);
  void Release(const std::string& job_id);

  size_t queued() const { return queue_.size(); }
  size_t running() const { return running_.size(); }
  uint32_t gpus_total() const { return static_cast<uint32_t>(all_gpus_.size()); }
  uint32_t gpus_free() const { return static_cast<uint32_t>(free_gpus_.size()); }

 private:
  struct Want {
    std::string job_id;
    uint32_t gpus;
    uint32_t cpu_ranks;
  };
  std::vector<int> all_gpus_;
  std::set<int> free_gpus_;
  uint32_t cpu_slots_;
  uint32_t cpu_used_ = 0;
  std::vector<Want> queue_;
  std::map<std::string, Allocation> running_;
};

}  // namespace sftctl::agent
