// A Slurm job's state as the agent shows it, and the parsers of the Slurm commands' outputs that it
// comes from. Only formats that are stable across Slurm 20.11-24.11 are read: `sbatch --parsable`,
// `squeue -h -o` with explicit fields, `sacct --parsable2 --noheader` with explicit fields, the
// one-line `scontrol show job -o`, and srun's "task N: Exited with exit code C" lines.
//
// Thread safety: plain data and pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::agent::slurm {

enum class SlurmState {
  kPending,
  kConfiguring,
  kRunning,
  kCompleting,
  kSuspended,
  kRequeued,  // REQUEUED, REQUEUE_HOLD, REQUEUE_FED: on its way back into the queue
  kCompleted,
  kFailed,
  kCancelled,
  kTimeout,
  kNodeFail,
  kPreempted,
  kBootFail,
  kDeadline,
  kOutOfMemory,
  kOther,  // any other name (STOPPED, RESIZING, SPECIAL_EXIT, ...): shown as Slurm spells it
};

// "CANCELLED by 1000" and "CA" both give kCancelled; unknown names kOther.
SlurmState ParseSlurmState(const std::string& name);
// Where a Slurm job stands for the agent.
enum class SlurmPhase {
  kWaiting,    // PENDING, CONFIGURING, REQUEUED, SUSPENDED, and names the engine does not know
  kRunning,    // RUNNING, COMPLETING
  kSucceeded,  // COMPLETED
  kFailed,     // FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE, OUT_OF_MEMORY
  kCancelled,  // CANCELLED
};
SlurmPhase PhaseOf(SlurmState state);
// True for the states a job never leaves: those of the phases kSucceeded, kFailed and kCancelled.
// A job with --requeue leaves NODE_FAIL and PREEMPTED for PENDING, and Slurm then reports PENDING.
bool IsTerminal(SlurmState state);

struct SlurmJobInfo {
  std::string job_id;
  SlurmState state = SlurmState::kOther;
  std::string state_name;        // as Slurm printed it, first word ("CANCELLED"), long form
  std::string reason;            // "Resources", "Priority", ""; "None" is stored as ""
  std::string nodes;             // "n[1-2]"; "" while pending
  std::optional<int> exit_code;  // the job's ExitCode (srun's: 143 when a peer was killed)
  int exit_signal = 0;           // the signal part of ExitCode
  std::optional<int> restarts;   // scontrol's Restarts (how often it was requeued)
  // The first rank that exited non-zero, from srun's lines in the batch output (the job's own
  // ExitCode is srun's: 143 when --kill-on-bad-exit terminated the others).
  struct TaskFailureInfo {
    std::string node;
    int task = 0;
    int exit_code = 0;
  };
  std::optional<TaskFailureInfo> first_failure;
  std::string source;  // "squeue", "sacct", "scontrol", "job folder"
  std::string note;    // why a fallback source was used ("" when none)

  // "PENDING (Resources)", "RUNNING on n[1-2]", "COMPLETED", "FAILED with exit code 143",
  // "FAILED with exit code 3 (rank 1 on n2)", "NODE_FAIL (NodeDown)".
  std::string Describe() const;
};

// The job id of `sbatch --parsable` ("42" or "42;cluster"); warnings sbatch printed on other lines are
// skipped. Errors: INTERNAL quoting the output when no line is a job id.
StatusOr<std::string> ParseSbatchParsable(const std::string& output);

// The fields the agent asks squeue for, and the parser of one job's line in its output.
inline constexpr const char* kSqueueFormat = "%A|%T|%r|%N";
// nullopt when no line of `output` is `job_id`'s (squeue forgot the job). Other lines are skipped.
std::optional<SlurmJobInfo> ParseSqueue(const std::string& output, const std::string& job_id);

inline constexpr const char* kSacctFields = "JobIDRaw,State,ExitCode,NodeList";
// `sacct -n -P -X -o kSacctFields`: the last line of `job_id` (the newest run of a requeued job);
// nullopt when there is none.
std::optional<SlurmJobInfo> ParseSacct(const std::string& output, const std::string& job_id);

// `scontrol show job -o ID`: JobId, JobState, Reason, NodeList, ExitCode, Restarts. nullopt when the
// output has no "JobId=<job_id> " record (e.g. "Invalid job id specified").
std::optional<SlurmJobInfo> ParseScontrolJob(const std::string& output, const std::string& job_id);

// "3:0" -> {3, 0}; nullopt when malformed.
std::optional<std::pair<int, int>> ParseExitCode(const std::string& text);

// srun's report of a task that exited non-zero ("srun: error: n2: task 1: Exited with exit code 3");
// task is the global rank.
using TaskFailure = SlurmJobInfo::TaskFailureInfo;
// Every such line of `output` (the batch output file), in order.
std::vector<TaskFailure> ParseTaskFailures(const std::string& output);

}  // namespace sftctl::agent::slurm
