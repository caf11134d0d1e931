// AutoStop: carries out the stop policy (agent/stop_policy.h). On a thread of its own, every `check`,
// it gathers a snapshot (active jobs from the supervisor, open client calls and the last client contact
// from ClientActivity, stop-when-done jobs from the StateStore, their final checkpoints from the job
// folders), asks DecideStop, and when the answer is "stop now" runs the action's shell command once
// through the CommandRunner seam, logging its output and storing the outcome (setting
// "auto_stop.last_action"). Nothing here runs on the supervisor's event thread or in a gRPC reaction;
// Health reads View(), a copy under a mutex.
//
// Firing: an action that succeeds fires once per agent process and consumes the stop-when-done jobs
// that triggered it (a restarted agent does not stop again for them; its idle countdown starts afresh
// from the restart). An action that fails is logged and re-armed: it runs again only after another full
// grace of quiet.
//
// Submissions: once stopping has begun (the action runs, or ran and succeeded) a job submission is
// refused (AdmitSubmission), so no job is acknowledged and then lost with the host. The decision and
// the admission meet under one mutex: the action begins only when no admitted submission is still
// being created and `active_jobs` (read again there) is 0, and a submission is admitted only while the
// action has not begun. A submission acknowledged before the decision is therefore seen by it (as an
// admitted submission, or as the job it made), and one that comes after is refused.
//
// Thread safety: Start/Stop from one thread; CheckOnce, View, HasAction and AdmitSubmission from any.
// Three locks, each for a reason: check_mu_ serializes evaluations and is held while the action runs
// (minutes), so View() must not wait on it; mu_ guards what View() copies (short holds only); the
// Gate's mutex lives with the Admissions, which may outlive this.
// Order: check_mu_ first; mu_ and the Gate's are taken under it, never one under the other.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "agent/client_activity.h"
#include "agent/command_runner.h"
#include "agent/state_store.h"
#include "agent/stop_policy.h"
#include "common/mutex.h"
#include "common/os/clock.h"
#include "common/os/periodic_thread.h"
#include "common/status.h"

namespace sftctl::agent {

// The persisted policy (setting "auto_stop.policy") with `flags` applied; validated, and stored again
// when flags were given. FAILED_PRECONDITION when flags arm a stop (--stop-when-idle) but no action
// resolves on `env`; INVALID_ARGUMENT from ValidateStopPolicy.
StatusOr<StopPolicy> LoadStopPolicy(StateStore* store, const StopPolicyFlags& flags, const StopEnv& env);

struct AutoStopDeps {
  StateStore* store = nullptr;
  ClientActivity* activity = nullptr;
  std::function<uint32_t()> active_jobs;  // running, cancelling and queued jobs
  CommandRunner* runner = nullptr;        // REQUIRES: set, outliving the AutoStop (runs the stop action)
  const Clock* clock = Clock::Real();
  std::string data_dir;
  StopEnv env;
  std::chrono::milliseconds check{5000};  // real time between evaluations
  std::chrono::seconds action_timeout{120};
};

// What `status`/`list` show (HealthResponse.auto_stop).
struct AutoStopView {
  std::string policy;  // DescribeStopPolicy
  std::string state = "off";
  std::string detail;
  std::string action;       // resolved
  std::string last_action;  // "2026-01-02T03:04:05Z runpod: exit code 0 (idle for 2h00m)"
  int64_t remaining_s = 0;
  int64_t idle_s = 0;
  double price_per_hour = 0;
};

class AutoStop {
 public:
  struct Gate;  // where the stop decision and job submissions meet (auto_stop.cpp)
  // An admitted submission. The stop does not begin while one is held: keep it until the job is
  // counted by AutoStopDeps::active_jobs (queued), or was not created; destroying it releases it.
  class Admission {
   public:
    explicit Admission(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
    ~Admission();
    Admission(const Admission&) = delete;
    Admission& operator=(const Admission&) = delete;

   private:
    std::shared_ptr<Gate> gate_;
  };

  AutoStop(AutoStopDeps deps, StopPolicy policy);
  ~AutoStop() { Stop(); }
  AutoStop(const AutoStop&) = delete;
  AutoStop& operator=(const AutoStop&) = delete;

  // The checking thread: CheckOnce at once, then every AutoStopDeps::check (common/os/periodic_thread.h).
  void Start() { checks_.Start(); }
  // Returns once a CheckOnce in progress (an action that runs, too) returned.
  void Stop() { checks_.Stop(); }
  // One evaluation; runs the action when due (blocking until it ends). Returns the decision.
  StopDecision CheckOnce() EXCLUDES(check_mu_, mu_);
  AutoStopView View() const EXCLUDES(mu_);
  // Whether a stop action resolves (a stop-when-done job may be submitted).
  bool HasAction() const { return !action_.empty(); }
  // Successful action runs in this process (0 or 1).
  int fired() const EXCLUDES(mu_);
  // A job submission may go ahead: hold the Admission until the job is counted (see above).
  // FAILED_PRECONDITION once stopping has begun: "the host is stopping (auto-stop: idle for 2h00m);
  // submit to another host".
  StatusOr<std::shared_ptr<Admission>> AdmitSubmission() const;

 private:
  // Fills the stop-when-done part of `in`; *ended: the jobs a stop now would consume.
  void GatherStopWhenDone(StopInputs* in, std::vector<std::string>* ended) REQUIRES(check_mu_);
  // "run/checkpoint-N/DONE" of the job's newest complete checkpoint, "" when none (cached per job).
  std::string FinalCheckpointDone(const std::string& job_id, const std::string& job_dir) REQUIRES(check_mu_);
  // Marks the stop as begun (submissions are refused from now on) unless a submission is being
  // admitted or a job became active since the snapshot: then false, and nothing changes.
  bool BeginStopping(const std::string& why);
  void Fire(const StopDecision& d, const std::vector<std::string>& ended) REQUIRES(check_mu_) EXCLUDES(mu_);
  void Publish(const StopDecision& d) EXCLUDES(mu_);

  const AutoStopDeps deps_;
  const StopPolicy policy_;
  const std::string action_;          // resolved at construction
  const std::shared_ptr<Gate> gate_;  // shared with the Admissions, which may outlive this object

  Mutex check_mu_;  // serializes CheckOnce (held while the action runs)
  Clock::TimePoint busy_at_ GUARDED_BY(check_mu_);
  std::map<std::string, std::string> final_done_ GUARDED_BY(check_mu_);            // job -> DONE path
  std::map<std::string, Clock::TimePoint> pull_wait_since_ GUARDED_BY(check_mu_);  // job -> wait began

  mutable Mutex mu_;
  AutoStopView view_ GUARDED_BY(mu_);
  int fired_ GUARDED_BY(mu_) = 0;
  PeriodicThread checks_;  // last: stopped before the members its CheckOnce reads go
};

}  // namespace sftctl::agent
