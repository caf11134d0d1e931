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
// Thread safety: Start/Stop from one thread; CheckOnce, View and HasAction from any.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "agent/client_activity.h"
#include "agent/command_runner.h"
#include "agent/state_store.h"
#include "agent/stop_policy.h"
#include "common/clock.h"
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
  CommandRunner* runner = CommandRunner::Default();
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
  AutoStop(AutoStopDeps deps, StopPolicy policy);
  ~AutoStop() { Stop(); }
  AutoStop(const AutoStop&) = delete;
  AutoStop& operator=(const AutoStop&) = delete;

  void Start();
  void Stop();
  // One evaluation; runs the action when due (blocking until it ends). Returns the decision.
  StopDecision CheckOnce();
  AutoStopView View() const;
  // Whether a stop action resolves (a stop-when-done job may be submitted).
  bool HasAction() const { return !action_.empty(); }
  // Successful action runs in this process (0 or 1).
  int fired() const;

 private:
  // Fills the stop-when-done part of `in`; *ended: the jobs a stop now would consume.
  void GatherStopWhenDone(StopInputs* in, std::vector<std::string>* ended);
  // "run/checkpoint-N/DONE" of the job's newest complete checkpoint, "" when none (cached per job).
  std::string FinalCheckpointDone(const std::string& job_id, const std::string& job_dir);
  void Fire(const StopDecision& d, const std::vector<std::string>& ended);
  void Publish(const StopDecision& d);

  const AutoStopDeps deps_;
  const StopPolicy policy_;
  const std::string action_;  // resolved at construction
  Clock::TimePoint busy_at_;  // CheckOnce's thread only (CheckOnce runs on one thread at a time)
  std::map<std::string, std::string> final_done_;            // job -> DONE path
  std::map<std::string, Clock::TimePoint> pull_wait_since_;  // job -> when the wait began
  std::mutex check_mu_;                                      // serializes CheckOnce

  mutable std::mutex mu_;
  AutoStopView view_;
  int fired_ = 0;

  std::mutex thread_mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sftctl::agent
