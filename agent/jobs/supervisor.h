// Supervisor: the job state machine. Admits queued jobs (Scheduler), launches their ranks (Launcher,
// with the shared launch policy of common/rank_group.h) with the torch.distributed environment
// (single-node, or this node's part of a multi-node job), tails their output into the Journal,
// enforces the step heartbeat, stops jobs (SIGTERM, then SIGKILL after a grace period, then verifies
// that no process of the job's process group remains), applies the restart budget, and on start
// re-attaches to or resolves the jobs a previous agent left running. Each run's states and the events
// that move it between them are tabled at the top of supervisor.cpp.
//
// The first rank to exit non-zero or by a signal fails the job: JobRecord.first_failed_rank names it
// and the reason reads "rank 1 failed first: killed by signal 9 (SIGKILL)" or "rank 0 failed first:
// exit code 1 (trainer error: <its error event>)". A pidfd per rank wakes the event thread as soon as a
// rank exits (polling every `poll` where pidfds are unavailable).
//
// Threading: all job state changes happen on one event thread (a Boost.Asio io_context). Public
// methods may be called from any thread: they post to that thread and report through a callback that
// runs there (it must not block). The slow parts of a submit (validating the spec, stat-ing and
// linking blobs, writing spec.json, the SQLite insert, opening the journal) and the periodic progress
// saves run on a second, "blocking" thread, in order. A job whose spec has hf:// paths stays QUEUED
// ("downloading from the Hugging Face Hub: ...") while a HubFetcher resolves them on a third thread
// with the token of its SubmitJobRequest (kept in memory only); it is queued for launch once they are
// downloaded, or FAILED with the Hub's error. A job that resumes from s3:// waits the same way while
// its checkpoint is downloaded into its run folder (agent/jobs/checkpoint_upload.h). A job's final state
// is committed to the StateStore only after the state-change event is journaled and fsynced.
//
// The spec: parsed and validated once, when the job is submitted (ValidateSpec) or recovered
// (ParseStoredSpec; agent/state/job_spec.h), into the JobSpec its JobRecord carries (JobRecord::spec) for as
// long as the job is not final; every step after reads it, never the JSON text again. A download
// (hf://, resume: s3://) replaces it with a new JobSpec.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/jobs/checkpoint_upload.h"
#include "agent/jobs/hub_fetcher.h"
#include "agent/jobs/scheduler.h"
#include "agent/process/command_runner.h"
#include "agent/process/launcher.h"
#include "agent/state/blob_store.h"
#include "agent/state/job_spec.h"
#include "agent/state/journal.h"
#include "agent/state/state_store.h"
#include "common/mutex.h"
#include "common/os/clock.h"
#include "common/os/file_system.h"
#include "common/rank_group.h"
#include "common/spec/spec_types.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent {

namespace slurm {
class SlurmRunner;
struct SlurmOptions;
struct SlurmUpdate;
}  // namespace slurm

struct SupervisorConfig {
  std::string data_dir;
  std::string trainer_path;
  std::vector<int> gpus;
  uint32_t cpu_slots = 1;
  std::chrono::milliseconds kill_grace{10000};
  std::chrono::milliseconds poll{100};
  uint32_t default_heartbeat_s = 1800;
  // The time of the step heartbeat and the kill grace (tests move it forward).
  const Clock* clock = Clock::Real();
  // The job folders, their spec.json and journals are made through it (tests inject a full disk).
  // Not owned; must outlive the Supervisor.
  FileSystem* fs = FileSystem::Default();
  // Multi-node jobs: the master_addr reported for node 0 (see docs/agent.md, "Multi-node jobs").
  std::string rendezvous_addr = "127.0.0.1";
  // hf:// paths: the Hub endpoint, the host's HF cache and token (HubOptionsFromEnvironment()).
  HubOptions hub;
  // Slurm jobs (a spec with `slurm:`; agent/slurm/slurm_runner.h): their folders go under
  // <shared_dir>/jobs/<agent id>/ (slurm::AgentJobsDir; "" refuses them); Slurm is asked for their
  // state every slurm_poll.
  std::string shared_dir;
  std::chrono::milliseconds slurm_poll{2000};
  // Told of every spec text this Supervisor parses (agent/state/job_spec.h): one per submit, one per job
  // recovered by Start, none after. Called on the thread that parses (the blocking thread, Start's
  // caller), so it must be thread-safe. Empty: nobody is told.
  SpecParseObserver spec_parsed;
};

struct SupervisorStats {
  uint32_t running = 0;
  uint32_t queued = 0;
  uint32_t gpus_total = 0;
  uint32_t gpus_free = 0;
};

class Supervisor {
 public:
  using JobCallback = std::function<void(StatusOr<JobRecord>)>;

  // `store`, `blobs` and `uploads` (checkpoint.upload_to and `resume: s3://`) are the caller's: not
  // null, and they must outlive the Supervisor. Stop() stops `uploads` (the agent is stopping).
  Supervisor(SupervisorConfig config, StateStore* store, BlobStore* blobs, CheckpointUploads* uploads);
  ~Supervisor();

  // Recovers jobs from the StateStore, then starts the event thread.
  Status Start();
  // Stops the event thread. Running ranks are left alone (a restarted agent re-attaches to them).
  void Stop();

  void Submit(::sftctl::v1::SubmitJobRequest req, JobCallback done);
  void Cancel(std::string job_id, JobCallback done);
  // Cancels every job that is not final, as Cancel does (a running job is stopped TERM→KILL and keeps
  // its checkpoints), with `reason` as the cancel's reason: the state events in each job's journal
  // (`sftctl logs`) and its final state's reason (`status`) carry it. `done` (on the event thread)
  // gets how many jobs it cancelled; a job already being cancelled is left as it is (its reason, no
  // second CANCELLING event), so calling it again is harmless. The cost cap's (agent/stopping/auto_stop.h).
  void CancelAll(std::string reason, std::function<void(size_t)> done);
  // The journal of any job (opened on first use). NOT_FOUND for an unknown job.
  StatusOr<std::shared_ptr<Journal>> JournalFor(const std::string& job_id) EXCLUDES(journals_mu_);
  SupervisorStats Stats() const EXCLUDES(stats_mu_);
  // The Hub download progress of a job waiting for its hf:// paths ("" when none); any thread.
  std::string HubProgress(const std::string& job_id) const { return hub_.Progress(job_id); }
  // The typed spec of a job that is not final (JobRecord::spec); null for any other. Any thread.
  std::shared_ptr<const JobSpec> SpecOf(const std::string& job_id) const EXCLUDES(specs_mu_);

 private:
  // What only this agent knows of a running rank; what agent.db keeps of it (pid, start time,
  // running, how it ended) is its RankRecord in Run::rec.ranks.
  struct RankRun {
    bool own_child = true;  // false after re-attach: not our child, exit status unknowable
    uint64_t off[3] = {0, 0, 0};
    std::string trainer_error;  // the message of this rank's first "error" event in this attempt
    std::shared_ptr<boost::asio::posix::stream_descriptor> exit_fd;  // pidfd: readable once it exits
  };
  // Why a run is stopped: set once when the stop begins; a later cancel still turns a failure stop
  // into a cancel (never requeued).
  struct StopCause {
    JobState state = JobState::FAILED;
    std::string reason;
    bool requeue = false;
  };
  // What the trainer reported through its events in this attempt.
  struct TrainerReport {
    bool done = false;
    bool error = false;
    std::string first_error;  // the first error event of any rank
  };
  struct Run {
    explicit Run(std::chrono::milliseconds kill_grace) : group(kill_grace) {}
    JobRecord rec;
    std::shared_ptr<Journal> journal;
    // ranks[i] is what only this agent knows of rank rec.ranks[i]: one entry each, in the same
    // order (AddRank), so that a rank's state is kept once.
    std::vector<RankRun> ranks;
    void AddRank(RankRecord record, RankRun live) {
      rec.ranks.push_back(record);
      ranks.push_back(std::move(live));
    }
    bool AnyAlive() const {
      for (const RankRecord& k : rec.ranks)
        if (k.running) return true;
      return false;
    }
    // The RankRun of rank number `rank`; null when the run has none.
    RankRun* Live(int rank) {
      for (size_t i = 0; i < rec.ranks.size(); ++i)
        if (rec.ranks[i].rank == rank) return &ranks[i];
      return nullptr;
    }
    RankGroupStop group;            // the run's state: running -> terminating -> killed
    std::optional<StopCause> stop;  // set exactly when group.stopping()
    TrainerReport trainer;
    std::unique_ptr<boost::asio::steady_timer> timer;
    Clock::TimePoint last_progress;
    Clock::TimePoint last_save;
    bool progress_dirty = false;
  };

  // store_->GetJob with JobRecord::spec set. INTERNAL for a job that is not final and has no spec here.
  StatusOr<JobRecord> GetJob(const std::string& job_id) EXCLUDES(specs_mu_);
  // Sets rec->spec and rec->spec_json (CanonicalSpecJson) and remembers the spec for SpecOf/GetJob
  // (the caller saves the record). REQUIRES: spec not null.
  void SetSpec(JobRecord* rec, std::shared_ptr<const JobSpec> spec) EXCLUDES(specs_mu_);
  // The one place specs_ changes: a job's spec kept while it is not final, and dropped.
  void RememberSpec(const std::string& job_id, std::shared_ptr<const JobSpec> spec) EXCLUDES(specs_mu_);
  void ForgetSpec(const std::string& job_id) EXCLUDES(specs_mu_);
  void PrepareSubmit(const ::sftctl::v1::SubmitJobRequest& req, const JobCallback& done);
  // Queues a QUEUED job for launch, or first for its hf:// download (`token`: the client's, or ""),
  // then for the download of the checkpoint it resumes from (`resume: s3://`, checkpoint_upload.h).
  void QueueJob(JobRecord* rec, const std::string& token);
  // A download ended (`what`: the history line on success); the job is queued again or FAILED.
  void FinishHubFetch(const std::string& job_id, StatusOr<std::shared_ptr<const JobSpec>> spec,
                      const std::string& what = "downloaded from the Hugging Face Hub");
  // Starts the download of the checkpoint `rec` resumes from (`bucket`: its s3:// URL).
  void FetchResume(JobRecord* rec, const std::string& bucket);
  StatusOr<JobRecord> CreateJob(const ::sftctl::v1::SubmitJobRequest& req, bool* created);
  // The folder of a job InsertJob recorded, 0700 (MakePrivateDir); a Slurm job's must be new (one
  // that exists was not made by this agent). Else FAILED_PRECONDITION naming the job and the folder,
  // the job FAILED with that reason, its record and journal in <data_dir>/jobs/<id> instead.
  Status CreateJobFolder(JobRecord* rec);
  // What a job needs in its folder after CreateJobFolder: logs/, run/, its input folders (a Slurm
  // job's inputs moved in), spec.json, the record saved with its spec, and the journal's first line.
  StatusOr<std::shared_ptr<Journal>> FillJobFolder(JobRecord* rec, const std::vector<SpecFolder>& folders,
                                                   const std::vector<SpecBlobRef>& refs, bool slurm,
                                                   JobSpec spec);
  // A job InsertJob recorded that cannot be set up (`why`): FAILED in the store and, where it can be
  // written, its journal, so that neither a retried submit (its client request id finds the job) nor
  // a restarted agent takes it for a queued one.
  void FailNewJob(JobRecord* rec, const std::string& why);
  // Slurm jobs (agent/slurm/slurm_runner.h). The options of a spec with `slurm:` after the checks
  // made before anything is recorded (nullopt for any other spec; blocking thread).
  StatusOr<std::optional<slurm::SlurmOptions>> SlurmPreflight(const JobSpec& spec);
  // sbatch, then follow it (blocking thread); the job is FAILED when Slurm refuses it.
  Status SubmitSlurmJob(JobRecord* rec, const slurm::SlurmOptions& options,
                        const std::shared_ptr<Journal>& journal);
  // At recovery: follow a job a previous agent submitted again.
  void FollowSlurmJob(JobRecord* rec);
  // At Start with a shared dir: slurm_jobs_dir_ from the agent id kept in the database (setting
  // "slurm_agent_id", made once; slurm::AgentJobsDir).
  Status PrepareSlurmJobsDir();
  // Starts the job's checkpoint.upload_to; an error is logged and written to `journal` (may be null).
  void StartUploads(const JobRecord& rec, Journal* journal);
  // On the event thread: what the runner found.
  void ApplySlurmUpdate(const slurm::SlurmUpdate& update);
  // `reason`: the job's new reason ("cancelled by user", or CancelAll's).
  void DoCancel(const std::string& job_id, const JobCallback& done,
                const std::string& reason = "cancelled by user");
  // Takes back every unfinished job of the StateStore; one that cannot be taken back (a damaged
  // record, an unreadable journal, anything thrown) is FailUnrecoverable'd and the rest go on. Errors:
  // only the store's listing.
  Status Recover();
  // REQUIRES: rec.spec set. The job's checkpoint keys from the store into uploads_; DATA_LOSS when
  // they cannot be read.
  Status RestoreCheckpointKeys(const JobRecord& rec);
  // REQUIRES: rec->spec set.
  Status RecoverJob(JobRecord* rec);
  void FailUnrecoverable(JobRecord* rec, const Status& why);
  StatusOr<std::unique_ptr<Run>> RecoverRun(const JobRecord& rec, size_t* alive, std::string* dead_rank);
  void Schedule();
  void Launch(const Allocation& alloc);
  std::vector<RankEnv> RankEnvs(const JobRecord& rec, const Allocation& alloc);
  // Fails a job whose ranks could not be started or recorded; kills and reaps `ranks`.
  void FailLaunch(JobRecord* rec, Journal* journal, const std::vector<SpawnedRank>& ranks, const Status& why);
  void Tick(Run* run);
  // Reaps the ranks that ended; returns true when one did. The first failure begins the stop.
  bool ReapRanks(Run* run);
  void SaveRankRecords(Run* run, bool ranks_changed, Clock::TimePoint now);
  // Opens a pidfd for each live rank and runs Tick as soon as one becomes readable.
  void WatchExits(Run* run);
  void ArmTimer(Run* run);
  // Journals the ranks' new output, at most kMaxReadPerTick per file. Returns true when a file has
  // more than that unread (the final drain repeats until it returns false).
  bool Drain(Run* run, bool final_drain);
  // Splits what was read from one file of rank number `rank` (its RankRun `rr`) into journal events
  // (an unterminated last line only on the final drain); returns how many bytes were consumed.
  size_t SplitLines(Run* run, int rank, RankRun* rr, int src, const std::string& buf, bool last_piece,
                    std::vector<JournalEvent>* events);
  // Applies one trainer event line of `rank` (ParseTrainerEvent) to the run: its step, loss, done,
  // error; `rr` (the rank's RankRun, null when the run has none) gets the rank's first error message.
  void NoteTrainerEvent(Run* run, RankRun* rr, int rank, const std::string& line);
  // Whether run's recorded process group is still its own (see supervisor.cpp), and signalling it
  // only then.
  bool GroupIsOurs(const Run& run) const;
  void SignalGroup(Run* run, int sig);
  void BeginStop(Run* run, StopCause cause);
  StopCause Outcome(const Run& run) const;
  void Finalize(Run* run);
  // Journals a state event (fsynced when final), then saves the record with a history entry. The
  // record is saved even when the journal fails (that error is returned after the save); when the
  // save fails, *rec is left as it was and the error is returned. `saved` (optional) tells which.
  // Entering RUNNING sets the record's started_ms, a final state its finished_ms: to the entry's time.
  Status Transition(JobRecord* rec, Journal* journal, JobState state, const std::string& reason,
                    bool* saved = nullptr);
  std::string JobDir(const std::string& id) const;
  std::string NodeZeroMasterAddr(const std::string& reported);
  // This host's resolvable name ("" if none), looked up the first time a job needs it: on the
  // blocking thread when a multi-node job's node 0 is submitted, or at recovery, so neither the
  // agent's start nor the event thread waits for DNS.
  const std::string& HostName();

  SupervisorConfig config_;
  StateStore* store_;
  BlobStore* blobs_;
  CheckpointUploads* uploads_;
  boost::asio::io_context io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
  // The blocking thread: submits' slow parts and progress saves, in order.
  boost::asio::io_context blocking_io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> blocking_work_;
  std::thread blocking_thread_;
  std::once_flag host_name_once_;
  std::string host_name_;  // HostName()
  Scheduler scheduler_;
  std::map<std::string, std::unique_ptr<Run>> runs_;  // event thread only
  HubFetcher hub_;
  std::set<std::string> downloading_;       // event thread only: jobs whose hf:// paths are fetched
  std::vector<std::string> recovered_hub_;  // QUEUED jobs found at Recover with hf:// paths or s3:// resume
  std::unique_ptr<CommandRunner> slurm_commands_;  // sbatch, squeue, scancel: outlives slurm_
  std::unique_ptr<slurm::SlurmRunner> slurm_;
  std::map<std::string, JobState> slurm_jobs_;  // event thread only: Slurm jobs not ended, their state
  std::string slurm_jobs_dir_;                  // set at Start, then read only: <shared_dir>/jobs/<agent id>

  mutable Mutex journals_mu_;
  std::map<std::string, std::shared_ptr<Journal>> journals_ GUARDED_BY(journals_mu_);
  mutable Mutex stats_mu_;
  SupervisorStats stats_ GUARDED_BY(stats_mu_);
  // The specs of the jobs that are not final (JobRecord::spec), by job id: set at submit and recovery,
  // replaced by downloads, dropped when the job's final state is saved (Transition).
  mutable Mutex specs_mu_;
  std::map<std::string, std::shared_ptr<const JobSpec>> specs_ GUARDED_BY(specs_mu_);
};

}  // namespace sftctl::agent
