// Supervisor: the job state machine. Admits queued jobs (Scheduler), launches their ranks (Launcher)
// with the torch.distributed environment (single-node, or this node's part of a multi-node job),
// tails their output into the Journal, enforces the step heartbeat, stops jobs (SIGTERM, then SIGKILL
// after a grace period, then verifies that no process of the job's process group remains), applies the
// restart budget, and on start re-attaches to or resolves the jobs a previous agent left running.
//
// The first rank to exit non-zero or by a signal fails the job: JobRecord.first_failed_rank names it
// and the reason reads "rank 1 failed first: killed by signal 9 (SIGKILL)" or "rank 0 failed first:
// exit code 1 (trainer error: <its error event>)". A pidfd per rank wakes the event thread as soon as a
// rank exits (polling every `poll` where pidfds are unavailable); when several failed ranks are reaped
// together, one killed by a signal is taken as the first (peers of a dead rank exit with an error
// code), then the lowest rank.
//
// Threading: all job state changes happen on one event thread (a Boost.Asio io_context). Public
// methods may be called from any thread: they post to that thread and report through a callback that
// runs there (it must not block). A job's final state is committed to the StateStore only after the
// state-change event is journaled and fsynced.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/blob_store.h"
#include "agent/journal.h"
#include "agent/scheduler.h"
#include "agent/state_store.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent {

struct SupervisorConfig {
  std::string data_dir;
  std::string trainer_path;
  std::vector<int> gpus;
  uint32_t cpu_slots = 1;
  std::chrono::milliseconds kill_grace{10000};
  std::chrono::milliseconds poll{100};
  uint32_t default_heartbeat_s = 1800;
  // Multi-node jobs: the master_addr reported for node 0 (see docs/agent.md, "Multi-node jobs").
  std::string rendezvous_addr = "127.0.0.1";
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

  Supervisor(SupervisorConfig config, StateStore* store, BlobStore* blobs);
  ~Supervisor();

  // Recovers jobs from the StateStore, then starts the event thread.
  Status Start();
  // Stops the event thread. Running ranks are left alone (a restarted agent re-attaches to them).
  void Stop();

  void Submit(::sftctl::v1::SubmitJobRequest req, JobCallback done);
  void Cancel(std::string job_id, JobCallback done);
  // The journal of any job (opened on first use). NOT_FOUND for an unknown job.
  StatusOr<std::shared_ptr<Journal>> JournalFor(const std::string& job_id);
  SupervisorStats Stats() const;

  // Runs `fn` on the event thread and waits for it (tests).
  void RunSync(std::function<void()> fn);

 private:
  struct RankRun {
    int rank = 0;
    pid_t pid = 0;
    uint64_t start_time = 0;
    bool alive = true;
    bool own_child = true;  // false after re-attach: not our child, exit status unknowable
    bool exit_known = false;
    int exit_code = 0;
    int signal = 0;
    uint64_t off[3] = {0, 0, 0};
    std::string trainer_error;  // the message of this rank's first "error" event in this attempt
    std::shared_ptr<boost::asio::posix::stream_descriptor> exit_fd;  // pidfd: readable once it exits
  };
  struct Run {
    JobRecord rec;
    std::shared_ptr<Journal> journal;
    std::vector<RankRun> ranks;
    std::unique_ptr<boost::asio::steady_timer> timer;
    std::chrono::steady_clock::time_point last_progress;
    std::chrono::steady_clock::time_point kill_at;
    bool stopping = false;
    bool sigkilled = false;
    JobState stop_state = JobState::FAILED;
    std::string stop_reason;
    bool requeue_allowed = true;
    bool saw_done = false;
    bool saw_error = false;
    bool rank_failed = false;     // stopping because a rank failed (the reason names it)
    std::string trainer_error;    // the first error event of any rank
    bool recovered_dead = false;  // every rank had died while the agent was down
    bool progress_dirty = false;
    std::chrono::steady_clock::time_point last_save;
  };

  void DoSubmit(const ::sftctl::v1::SubmitJobRequest& req, const JobCallback& done);
  void DoCancel(const std::string& job_id, const JobCallback& done);
  Status Recover();
  void Schedule();
  void Launch(const Allocation& alloc);
  void Tick(Run* run);
  // Opens a pidfd for each live rank and runs Tick as soon as one becomes readable.
  void WatchExits(Run* run);
  void ArmTimer(Run* run);
  // Journals the ranks' new output, at most kMaxReadPerTick per file. Returns true when a file has
  // more than that unread (the final drain repeats until it returns false).
  bool Drain(Run* run, bool final_drain);
  // Whether run's recorded process group is still its own (see supervisor.cpp), and signalling it
  // only then.
  bool GroupIsOurs(const Run& run) const;
  void SignalGroup(Run* run, int sig);
  void BeginStop(Run* run, JobState state, const std::string& reason, bool requeue_allowed);
  void Finalize(Run* run);
  // Journals a state event (fsynced when final), then saves the record with a history entry. The
  // record is saved even when the journal fails (that error is returned after the save); when the
  // save fails, *rec is left as it was and the error is returned. `saved` (optional) tells which.
  Status Transition(JobRecord* rec, Journal* journal, JobState state, const std::string& reason,
                    bool* saved = nullptr);
  std::string JobDir(const std::string& id) const;

  SupervisorConfig config_;
  StateStore* store_;
  BlobStore* blobs_;
  boost::asio::io_context io_;
  std::unique_ptr<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::thread thread_;
  Scheduler scheduler_;
  std::map<std::string, std::unique_ptr<Run>> runs_;  // event thread only

  mutable std::mutex journals_mu_;
  std::map<std::string, std::shared_ptr<Journal>> journals_;
  mutable std::mutex stats_mu_;
  SupervisorStats stats_;
};

}  // namespace sftctl::agent
