// AutoStop: carries out the stop policy (agent/stopping/stop_policy.h). On a thread of its own, every
// `check`, it gathers a snapshot (active jobs from the supervisor, open client calls and the last client
// contact from ClientActivity, stop-when-done jobs from the StateStore, their final checkpoints from the job
// folders), asks DecideStop, and when the answer is "stop now" runs the action once
// (agent/stopping/stop_action.h: a shell command through the CommandRunner seam, or Lambda's API request in
// this process through the HttpClient seam, so no secret is on a command line), logging its output and
// storing the outcome (setting "auto_stop.last_action"). Nothing here runs on the supervisor's event thread
// or in a gRPC reaction; Health reads View(), a copy under a mutex.
//
// Firing: an action that succeeds fires once per agent process and consumes the stop-when-done jobs
// that triggered it (a restarted agent does not stop again for them; its idle countdown starts afresh
// from the restart). An action that fails is logged and re-armed: it runs again only after another full
// grace of quiet.
//
// The cost cap (StopPolicy::max_cost; DecideCostCap): the decision's wall time is the wall time at
// construction (AutoStopDeps::unix_ms_at_start) moved on by AutoStopDeps::clock, and its lead is check +
// job_stop_time + action_timeout: the worst case from the check before the one that would see the cap passed
// to the host stopped (the next check, the cancelled jobs' TERM→KILL grace, the stop action). Once reached,
// whether jobs run or clients are connected: submissions are refused (AdmitSubmission names the cap),
// every job that is not final is cancelled with the cap's reason (the one of the check that first saw
// it reached, kept from then on: logs, status and refusals say the same) (AutoStopDeps::cancel_jobs; again at
// each check while one is active, for a submission admitted just before), and the action runs once no
// job is active and no admitted submission is pending, or at the latest job_stop_time + check after
// the cancel. It succeeds once per process; a failed action is retried every cap_retry, and the refusal
// stays. Without an action the jobs are cancelled all the same, and the reason says "no stop action:
// the host keeps running". A restarted agent whose cap is already reached refuses submissions from its
// construction on and stops again.
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

#include "agent/process/command_runner.h"
#include "agent/state/state_store.h"
#include "agent/stopping/client_activity.h"
#include "agent/stopping/stop_policy.h"
#include "common/mutex.h"
#include "common/net/http_client.h"
#include "common/os/clock.h"
#include "common/os/file_system.h"
#include "common/os/periodic_thread.h"
#include "common/status.h"

namespace sftctl::agent {

// The persisted policy (setting "auto_stop.policy") with `flags` applied; validated, and stored again
// when flags were given. A policy with a price and no billing start gets `now_unix_s` (0: the system
// clock's) as its billing start, stored, so that a restarted agent keeps counting from there.
// FAILED_PRECONDITION when flags arm a stop (--stop-when-idle) but no action resolves on `env`;
// INVALID_ARGUMENT from ValidateStopPolicy.
StatusOr<StopPolicy> LoadStopPolicy(StateStore* store, const StopPolicyFlags& flags, const StopEnv& env,
                                    int64_t now_unix_s = 0);

struct AutoStopDeps {
  StateStore* store = nullptr;
  ClientActivity* activity = nullptr;
  std::function<uint32_t()> active_jobs;  // running, cancelling and queued jobs
  CommandRunner* runner = nullptr;        // REQUIRES: set, outliving the AutoStop (runs a shell stop action)
  HttpClient* http =
      nullptr;  // the "lambda" action's request (agent/stopping/stop_action.h); null: libcurl's
  const Clock* clock = Clock::Real();
  FileSystem* fs = FileSystem::Default();  // reads the jobs' run folders (their final checkpoints)
  std::string data_dir;
  StopEnv env;
  std::chrono::milliseconds check{5000};  // real time between evaluations
  std::chrono::seconds action_timeout{120};
  // The cost cap: cancels every job that is not final with the reason and returns how many it
  // cancelled (Supervisor::CancelAll); null: none to cancel.
  std::function<size_t(const std::string& reason)> cancel_jobs;
  std::chrono::seconds job_stop_time{10};  // the longest a cancelled job takes to end (--kill-grace)
  std::chrono::seconds cap_retry{300};     // between tries of a failed stop action at the cap
  int64_t unix_ms_at_start = 0;            // the wall time at construction; 0: the system clock's
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
  double max_cost = 0;               // 0: no cap
  double spent = 0;                  // since billing began (with a price and a billing start)
  int64_t billing_since_unix_s = 0;  // 0: unknown
  int64_t cap_remaining_s = 0;       // until the cap is reached
  bool cap_reached = false;
  std::string cap_reason;  // once reached: DecideCostCap's, and "; no stop action: ..." without one
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
  // The quiet time counts from here (the agent serves), not from construction: a slow start does not
  // eat into the idle grace before any client could reach the agent.
  void Start() EXCLUDES(check_mu_);
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
  // submit to another host", or once the cost cap is reached: "the host is stopping (cost cap $25.00
  // reached: ...); submit to another host".
  StatusOr<std::shared_ptr<Admission>> AdmitSubmission() const;

 private:
  // Fills the stop-when-done part of `in`; *ended: the jobs a stop now would consume.
  void GatherStopWhenDone(StopInputs* in, std::vector<std::string>* ended) REQUIRES(check_mu_);
  // "run/checkpoint-N/DONE" of the job's newest complete checkpoint, "" when none (cached per job).
  std::string FinalCheckpointDone(const std::string& job_id, const std::string& job_dir) REQUIRES(check_mu_);
  // Marks the stop as begun (submissions are refused from now on) unless a submission is being
  // admitted or a job became active since the snapshot: then false, and nothing changes.
  bool BeginStopping(const std::string& why);
  // Runs the action (`cost_cap`: for the cap: a failure keeps submissions refused, and is tried again
  // after cap_retry).
  void Fire(const StopDecision& d, const std::vector<std::string>& ended, bool cost_cap) REQUIRES(check_mu_)
      EXCLUDES(mu_);
  // The cap is reached: refuse, cancel, and run the action when its time has come (see above).
  void EnforceCap(const StopDecision& d, Clock::TimePoint now) REQUIRES(check_mu_) EXCLUDES(mu_);
  // Refuses submissions from now on with `refusal` (the whole message).
  void CloseGate(const std::string& refusal);
  // The reason the cap gives: DecideCostCap's, with "; no stop action: the host keeps running" when
  // no action resolves.
  std::string CapReason(const CostCap& cap) const;
  int64_t UnixNowMs(Clock::TimePoint now) const;
  void Publish(const StopDecision& d) REQUIRES(check_mu_) EXCLUDES(mu_);

  const AutoStopDeps deps_;
  const StopPolicy policy_;
  const std::string action_;          // resolved at construction
  const std::shared_ptr<Gate> gate_;  // shared with the Admissions, which may outlive this object
  const Clock::TimePoint origin_;     // deps_.clock's time at construction ...
  const int64_t origin_unix_ms_;      // ... and the wall time then
  const int64_t lead_s_;              // the cost cap's lead (see above)

  Mutex check_mu_;  // serializes CheckOnce (held while the action runs)
  Clock::TimePoint busy_at_ GUARDED_BY(check_mu_);
  std::map<std::string, std::string> final_done_ GUARDED_BY(check_mu_);            // job -> DONE path
  std::map<std::string, Clock::TimePoint> pull_wait_since_ GUARDED_BY(check_mu_);  // job -> wait began
  bool cap_began_ GUARDED_BY(check_mu_) = false;         // the cap was reached and its jobs cancelled
  std::string cap_reason_ GUARDED_BY(check_mu_);         // CapReason when it was first reached: kept
  Clock::TimePoint cap_since_ GUARDED_BY(check_mu_);     // when
  Clock::TimePoint cap_retry_at_ GUARDED_BY(check_mu_);  // a failed action at the cap: the next try

  mutable Mutex mu_;
  AutoStopView view_ GUARDED_BY(mu_);
  int fired_ GUARDED_BY(mu_) = 0;
  PeriodicThread checks_;  // last: stopped before the members its CheckOnce reads go
};

}  // namespace sftctl::agent
