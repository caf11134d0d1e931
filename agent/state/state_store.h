// StateStore: the agent's durable truth in SQLite (WAL): jobs, their ranks and state history, blobs,
// and the artifact hash cache. The agent restarts into whatever this holds.
//
// Thread safety: all methods are safe to call concurrently (one connection behind a mutex).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/rank_group.h"
#include "common/spec/spec_types.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent {

using JobState = ::sftctl::v1::JobState;

bool IsFinal(JobState s);
const char* JobStateName(JobState s);

struct RankRecord {
  int rank = 0;
  int64_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  bool running = false;
  RankExit exit;  // how it ended (exit.known: it was our child when it did)
};

struct HistoryRecord {
  JobState state = JobState::JOB_STATE_UNSPECIFIED;
  std::string reason;
  int64_t time_ms = 0;
};

struct JobRecord {
  std::string id;   // "job-<num>"
  int64_t num = 0;  // FIFO order
  std::string name;
  std::string client_request_id;
  JobState state = JobState::QUEUED;
  std::string reason;
  uint32_t gpus = 0;
  uint32_t world_size = 1;
  std::vector<int> assigned_gpus;
  uint32_t restarts = 0;
  uint32_t max_restarts = 0;
  uint32_t heartbeat_s = 0;
  int64_t created_ms = 0;
  int64_t started_ms = 0;
  int64_t finished_ms = 0;
  int64_t last_step = -1;
  double last_loss = 0;
  int64_t pgid = 0;
  std::string job_dir;
  std::string spec_json;  // the canonical text of `spec` (agent/state/job_spec.h CanonicalSpecJson)
  // Never saved: spec_json parsed, once, when this agent took the job (submitted, or recovered after a
  // restart; agent/state/job_spec.h). The Supervisor sets it on every record of a job that is not final; a
  // record read from the StateStore has none. Shared and immutable: a spec rewritten by a download is
  // a new JobSpec.
  std::shared_ptr<const JobSpec> spec;
  std::vector<RankRecord> ranks;  // RankRecord.rank is the global rank (rank_offset + local rank)
  // Multi-node jobs (rendezvous.num_nodes > 1): this node's part, master_addr/port filled in. Then
  // `world_size` above still counts the ranks on this host; rendezvous.world_size counts all of them.
  ::sftctl::v1::Rendezvous rendezvous;
  int first_failed_rank = -1;  // global rank that failed first in the latest attempt; -1: none
  bool stop_when_done =
      false;  // stop the host once it ended (agent/stopping/auto_stop.h); set at insert only
  // A Slurm job (agent/slurm/slurm_runner.h): set at insert only. slurm_job_id is Slurm's id once
  // sbatch accepted it; slurm_state the scheduler's view as last polled ("PENDING (Resources)").
  bool slurm = false;
  std::string slurm_job_id;
  std::string slurm_state;
  // Read back only (never saved): why part of the record could not be read from the database (a
  // column damaged on disk), "" when it was read whole. The agent fails such a job with this reason.
  std::string corrupt;
};

// A job submitted with stop_when_done, as the stop policy tracks it (table stop_when_done).
enum class StopWhenDone { kArmed = 0, kPulled = 1, kConsumed = 2 };
struct StopWhenDoneRecord {
  std::string job_id;
  JobState state = JobState::JOB_STATE_UNSPECIFIED;
  std::string job_dir;
  StopWhenDone status = StopWhenDone::kArmed;
};

// A job's checkpoint run keys (SubmitJobRequest.checkpoint_keys; common/object_store/manifest_key.h):
// raw key bytes by "s3://bucket/prefix".
using CheckpointKeys = std::map<std::string, std::string>;

// Multi-node when the rendezvous spans more than one node.
inline bool IsMultiNode(const JobRecord& rec) { return rec.rendezvous.num_nodes() > 1; }

class StateStore {
 public:
  // Opens (creating if needed) the database at `path` in WAL mode; adds columns that a database of an
  // older agent lacks.
  static StatusOr<std::unique_ptr<StateStore>> Open(const std::string& path);
  ~StateStore();

  // Assigns num and id ("job-<num>") and inserts the job with a first history entry (and, with
  // rec.stop_when_done, its kArmed stop_when_done row), and its `checkpoint_keys`, in one transaction:
  // once it returns, a restarted agent holds the keys of every job it recovers.
  StatusOr<JobRecord> InsertJob(JobRecord rec, const CheckpointKeys& checkpoint_keys = {});
  // Writes every mutable column (job_dir too) and the ranks; with `change`, appends it to the history
  // in the same transaction. A final state deletes the job's checkpoint keys in it too.
  Status SaveJob(const JobRecord& rec, const HistoryRecord* change);
  // The checkpoint keys InsertJob stored for a job that is not final (empty: none were given). They are
  // a secret: the database lives in the agent's 0700 data dir, and no JobRecord, RPC answer or log line
  // carries them (docs/object-storage.md, "Whose checkpoints a resume takes").
  StatusOr<CheckpointKeys> GetCheckpointKeys(const std::string& job_id);
  // Only last_step and last_loss, and only while the job is RUNNING or CANCELLING: a progress save
  // that lands after the job's final state was saved changes nothing.
  Status SaveProgress(const std::string& id, int64_t last_step, double last_loss);
  StatusOr<JobRecord> GetJob(const std::string& id);
  StatusOr<std::vector<JobRecord>> ListJobs();
  StatusOr<std::vector<HistoryRecord>> History(const std::string& id);
  // The id of the job submitted with this idempotency key, if any.
  StatusOr<std::optional<std::string>> FindByRequestId(const std::string& client_request_id);

  // Stop-when-done jobs that a stop has not consumed yet, oldest first; and a change of their status.
  StatusOr<std::vector<StopWhenDoneRecord>> StopWhenDoneJobs();
  Status SetStopWhenDone(const std::string& job_id, StopWhenDone status);

  // Agent settings that outlive a restart (the stop policy and its last action): key -> text.
  Status PutSetting(const std::string& key, const std::string& value);
  StatusOr<std::optional<std::string>> GetSetting(const std::string& key);

  Status PutBlob(const std::string& sha256, uint64_t size);
  Status DeleteBlob(const std::string& sha256);

  // Artifact hash cache keyed by (job, path, size, mtime).
  std::optional<std::string> CachedHash(const std::string& job_id, const std::string& path, uint64_t size,
                                        int64_t mtime_ns);
  Status PutCachedHash(const std::string& job_id, const std::string& path, uint64_t size, int64_t mtime_ns,
                       const std::string& sha256);

 private:
  explicit StateStore(sqlite3* db) : db_(db) {}
  Status Exec(const char* sql) REQUIRES(mu_);
  // COMMIT; on failure the transaction is rolled back (never left open).
  Status Commit() REQUIRES(mu_);
  Status Migrate() REQUIRES(mu_);
  StatusOr<std::vector<JobRecord>> QueryJobs(const std::string& where_id) REQUIRES(mu_);

  Mutex mu_;
  sqlite3* const db_ PT_GUARDED_BY(mu_);  // one connection: every statement on it holds mu_
};

}  // namespace sftctl::agent
