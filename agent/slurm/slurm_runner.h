// SlurmRunner: the agent's side of a job that runs through Slurm (a spec with a `slurm:` section;
// docs/slurm.md). The supervisor hands such a job here instead of launching ranks itself:
//
//   * Preflight (blocking thread, before anything is recorded or queued): the agent has a
//     --shared-dir, Slurm's commands and controller are there and the partition is known
//     (SlurmCli::CheckReady), and a compute node sees the shared dir (a probe file the agent writes
//     and `srun -N1 -n1 cat`s back; once per agent run after it succeeded).
//   * Submit (blocking thread): SubmitJobFolder (the script, `sbatch --test-only`, `sbatch`, the id
//     recorded in <job_dir>/slurm/job_id).
//   * Follow (any thread): from then on a thread of the runner polls the job (SlurmCli::Query every
//     `poll`), tails the ranks' logs/rank-N.{stdout,stderr,events} into the job's journal (from the
//     offsets the journal already holds, so an agent restart resumes exactly) and reports each change
//     through `on_update`, the final one after the last output was journaled.
//   * Cancel (any thread): `scancel` on the runner's thread; the end comes from the next poll.
//
// Slurm states map onto the agent's through PhaseOf (slurm_job.h). A job with requeue that Slurm
// reports NODE_FAIL or PREEMPTED stays QUEUED ("...; Slurm requeues it") for `requeue_grace`, the
// time Slurm takes to put it back; a Slurm that keeps reporting it after that ends it FAILED.
//
// Thread safety: all public methods may be called from any thread; Preflight and Submit block on
// Slurm's commands (never call them on the supervisor's event thread or in a gRPC reaction).
// `on_update` runs on the runner's thread and must not block.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/process/command_runner.h"
#include "agent/slurm/slurm_cli.h"
#include "agent/slurm/slurm_options.h"
#include "agent/state/journal.h"
#include "common/mutex.h"
#include "common/spec/spec.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent::slurm {

// The spec's `slurm:` section as options for the engine, validated (INVALID_ARGUMENT naming the
// field, "slurm: field 'nodes': ..."). The one conversion of SlurmSpec.
StatusOr<SlurmOptions> SlurmOptionsFromSpec(const SlurmSpec& spec);

// The options of a spec JSON (the canonical spec a client submits): nullopt when it has no `slurm`
// section. Errors: the spec's own (ParseSpec) and SlurmOptionsFromSpec's.
StatusOr<std::optional<SlurmOptions>> SlurmOptionsFromSpecJson(const nlohmann::json& spec);

// Makes a Slurm job's inputs visible from the compute nodes: every field named by `file_pointers`
// (JSON pointers of blob paths in the agent's own data dir; agent/state/job_spec.h SpecStringAt) is linked,
// or copied where a hard link is impossible, into <job_dir>/inputs/files/ and the field set to it;
// symlinks under <job_dir>/inputs/ (a folder's entries, agent/state/job_spec.h) are replaced by copies.
// Errors: INTERNAL naming the path.
Status MoveInputsIntoJobFolder(const std::string& job_dir, const std::vector<std::string>& file_pointers,
                               JobSpec* spec);

// sftd --shared-dir: creates `dir` (0700 when it is new) and <dir>/jobs (0700), and returns its
// canonical absolute path. Errors: INVALID_ARGUMENT naming --shared-dir when it is relative, cannot
// be created, or holds a character an sbatch script cannot take unquoted (sbatch_script.h);
// CheckTrustedDir's (common/os/file_system.h) when it, or its jobs/, is another user's or writable by
// group or others (PERMISSION_DENIED naming --shared-dir and the path).
StatusOr<std::string> PrepareSharedDir(const std::string& dir);

// One agent's Slurm job folders live in <shared_dir>/jobs/<agent id>/job-N, so that two agents on one
// shared dir (both number their jobs from job-1) never share a folder; each job folder is made with
// MakePrivateDir(..., exclusive), so one that exists already is refused, never reused.
// NewAgentId: 12 random hex digits. AgentJobsDir: that folder (0700; created, or an existing one of
// this user accepted). Errors: INVALID_ARGUMENT when `agent_id` is not 12 hex digits;
// MakePrivateDir's.
std::string NewAgentId();
StatusOr<std::string> AgentJobsDir(const std::string& shared_dir, const std::string& agent_id);

struct SlurmRunnerConfig {
  std::string shared_dir;  // sftd --shared-dir; "" refuses Slurm jobs
  std::string trainer_path;
  std::vector<std::string> env;  // for Slurm's commands (SlurmCli::EnvFromProcess())
  CommandRunner* runner = nullptr;
  std::chrono::milliseconds poll{2000};  // how often Slurm is asked
  std::chrono::milliseconds tail{250};   // how often the rank files are read
  std::chrono::seconds requeue_grace{120};
  std::chrono::seconds command_timeout{30};
};

// One report of a followed job.
struct SlurmUpdate {
  std::string job_id;                                   // the agent's
  ::sftctl::v1::JobState state = ::sftctl::v1::QUEUED;  // QUEUED, RUNNING, or a final state
  std::string slurm_state;                              // SlurmJobInfo::Describe(), or why unknown
  std::optional<int64_t> last_step;
  std::optional<double> last_loss;
  bool final = false;  // the runner no longer follows the job
};

class SlurmRunner {
 public:
  using UpdateCallback = std::function<void(SlurmUpdate)>;

  SlurmRunner(SlurmRunnerConfig config, UpdateCallback on_update);
  ~SlurmRunner();  // Stop()

  const std::string& shared_dir() const { return config_.shared_dir; }

  // FAILED_PRECONDITION "... --shared-dir ..." without a shared dir; CheckReady's errors;
  // FAILED_PRECONDITION naming the shared dir when a compute node cannot read the probe file.
  Status Preflight(const SlurmOptions& options) EXCLUDES(mu_);
  // The Slurm job id (SubmitJobFolder).
  StatusOr<std::string> Submit(const SlurmOptions& options, const std::string& job_name,
                               const std::string& job_dir) const;

  // Starts following a submitted job (`world_size` ranks write rank files in `job_dir`).
  void Follow(const std::string& job_id, const std::string& slurm_job_id, const std::string& job_dir,
              uint32_t world_size, bool requeue, std::shared_ptr<Journal> journal) EXCLUDES(mu_);
  // scancel of a followed job (a no-op for any other).
  void Cancel(const std::string& job_id) EXCLUDES(mu_);

  // Stops the runner's thread; the Slurm jobs run on (a restarted agent follows them again).
  void Stop() EXCLUDES(mu_);

 private:
  struct Followed {
    std::string slurm_job_id;
    std::string job_dir;
    uint32_t world_size = 1;
    bool requeue = true;
    std::shared_ptr<Journal> journal;
    std::map<std::pair<int, int>, uint64_t> offsets;  // (rank, src) -> bytes journaled
    std::chrono::steady_clock::time_point next_query{};
    std::optional<std::chrono::steady_clock::time_point> failed_since;  // requeue wait
    int not_found = 0;                                                  // polls in a row
    SlurmUpdate last;
    bool reported = false;
    bool cancel = false;
  };

  void Loop() EXCLUDES(mu_);
  // One pass over one job: scancel when asked, the rank files, Slurm's state when due.
  void Visit(const std::string& job_id, Followed* f, std::chrono::steady_clock::time_point now);
  // Journals new complete lines (every line when `final`); fills `update`'s progress.
  void Tail(const std::string& job_id, Followed* f, bool final, SlurmUpdate* update);
  SlurmUpdate StateOf(const std::string& job_id, Followed* f, std::chrono::steady_clock::time_point now);

  const SlurmRunnerConfig config_;
  const SlurmCli cli_;
  const UpdateCallback on_update_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool probed_ GUARDED_BY(mu_) = false;                      // a probe succeeded in this agent run
  std::map<std::string, Followed> pending_ GUARDED_BY(mu_);  // Follow: picked up by the thread
  std::vector<std::string> cancels_ GUARDED_BY(mu_);
  std::map<std::string, Followed> jobs_;  // the runner's thread only
  std::thread thread_;
};

}  // namespace sftctl::agent::slurm
