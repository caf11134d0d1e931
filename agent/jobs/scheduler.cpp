#include "agent/jobs/scheduler.h"

#include <algorithm>

namespace sftctl::agent {

Scheduler::Scheduler(std::vector<int> gpu_indices, uint32_t cpu_slots)
    : all_gpus_(std::move(gpu_indices)),
      free_gpus_(all_gpus_.begin(), all_gpus_.end()),
      cpu_slots_(std::max<uint32_t>(cpu_slots, 1)) {}

Status Scheduler::CheckFits(uint32_t gpus, uint32_t cpu_ranks) const {
  if (gpus > all_gpus_.size()) {
    return FailedPreconditionError("gpus: job wants " + std::to_string(gpus) + " GPUs, host has " +
                                   std::to_string(all_gpus_.size()));
  }
  if (gpus == 0 && cpu_ranks > cpu_slots_) {
    return FailedPreconditionError("cpu_ranks: job wants " + std::to_string(cpu_ranks) +
                                   " CPU ranks, agent allows " + std::to_string(cpu_slots_));
  }
  return OkStatus();
}

void Scheduler::Enqueue(const std::string& job_id, uint32_t gpus, uint32_t cpu_ranks) {
  for (const Want& w : queue_) {
    if (w.job_id == job_id) return;
  }
  queue_.push_back({job_id, gpus, gpus > 0 ? 0 : std::max<uint32_t>(cpu_ranks, 1)});
}

bool Scheduler::Dequeue(const std::string& job_id) {
  auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Want& w) { return w.job_id == job_id; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

std::vector<Allocation> Scheduler::Admit() {
  std::vector<Allocation> out;
  bool gpu_blocked = false;
  bool cpu_blocked = false;
  for (auto it = queue_.begin(); it != queue_.end();) {
    bool is_gpu = it->gpus > 0;
    bool fits = is_gpu ? (!gpu_blocked && free_gpus_.size() >= it->gpus)
                       : (!cpu_blocked && cpu_used_ + it->cpu_ranks <= cpu_slots_);
    if (!fits) {
      (is_gpu ? gpu_blocked : cpu_blocked) = true;
      ++it;
      continue;
    }
    Allocation a;
    a.job_id = it->job_id;
    if (is_gpu) {
      for (uint32_t i = 0; i < it->gpus; ++i) {
        a.gpus.push_back(*free_gpus_.begin());
        free_gpus_.erase(free_gpus_.begin());
      }
    } else {
      a.cpu_ranks = it->cpu_ranks;
      cpu_used_ += a.cpu_ranks;
    }
    running_[a.job_id] = a;
    out.push_back(std::move(a));
    it = queue_.erase(it);
  }
  return out;
}

void Scheduler::Adopt(const std::string& job_id, const std::vector<int>& gpus, uint32_t cpu_ranks) {
  Allocation a;
  a.job_id = job_id;
  for (int g : gpus) {
    if (free_gpus_.erase(g)) a.gpus.push_back(g);
  }
  if (gpus.empty()) {
    a.cpu_ranks = std::max<uint32_t>(cpu_ranks, 1);
    cpu_used_ += a.cpu_ranks;
  }
  running_[job_id] = a;
}

void Scheduler::Release(const std::string& job_id) {
  auto it = running_.find(job_id);
  if (it == running_.end()) return;
  for (int g : it->second.gpus) free_gpus_.insert(g);
  cpu_used_ -= std::min(cpu_used_, it->second.cpu_ranks);
  running_.erase(it);
}

}  // namespace sftctl::agent
