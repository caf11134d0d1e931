// SlurmOptions: what a job asks of Slurm (nodes, GPUs, partition, ...), and their validation — the
// one place that decides which values may reach an sbatch script. The client's `submit --slurm`
// flags and a spec's `slurm:` section both end up here.
//
// Thread safety: plain data and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::agent::slurm {

struct SlurmOptions {
  uint32_t nodes = 1;
  // > 0: a GPU job, one rank per GPU (--gpus-per-node and --ntasks-per-node both G).
  uint32_t gpus_per_node = 0;
  // A CPU job (gpus_per_node == 0): ranks per node, one CPU slot each.
  uint32_t cpu_ranks_per_node = 1;
  std::string partition;   // "" = the cluster's default partition
  std::string account;     // "" = the user's default account
  std::string qos;         // "" = the default QOS
  std::string time;        // "" = the partition's limit; else a Slurm time ("30", "4:00:00", "1-12")
  std::string constraint;  // "" = none; a feature expression ("a100&ib", "v100|a100")
  std::vector<std::string> extra_args;  // more sbatch options, each one "--name[=value]"
  bool requeue = true;                  // --requeue: preemption and NODE_FAIL put the job back in the queue

  uint32_t ranks_per_node() const { return gpus_per_node > 0 ? gpus_per_node : cpu_ranks_per_node; }
  uint32_t world_size() const { return nodes * ranks_per_node(); }
};

// OK, or INVALID_ARGUMENT naming the field ("slurm: field 'time': ...", `where` in front when not
// empty): counts within 1..1024 nodes and 1..64 ranks per node; names of [A-Za-z0-9_.-] (a partition
// list may have commas); a time in one of sbatch's forms; a constraint of names, digits and
// & | , * [ ] ( ) : ; an extra argument starting with "--", without whitespace or quotes (so that
// every value fits one #SBATCH line without any shell quoting) and not --export, --export-file or
// --get-user-env (the job's environment is the agent's choice: sbatch_script.h).
Status ValidateSlurmOptions(const SlurmOptions& options, const std::string& where = "");

// True for sbatch's time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, and "UNLIMITED"/"INFINITE".
bool IsSlurmTime(const std::string& time);

}  // namespace sftctl::agent::slurm
