#include "agent/stopping/auto_stop.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>

#include "agent/stopping/stop_action.h"
#include "common/checkpoint_name.h"
#include "common/os/file_system.h"

namespace sftctl::agent {
namespace {

constexpr char kPolicyKey[] = "auto_stop.policy";
constexpr char kLastActionKey[] = "auto_stop.last_action";

int64_t UnixMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct AutoStop::Gate {
  Mutex mu;
  uint32_t admitted GUARDED_BY(mu) = 0;  // submissions whose job is not yet counted as active
  bool stopping GUARDED_BY(mu) = false;  // the action runs, or ran and succeeded; or the cost cap
  std::string refusal GUARDED_BY(mu);    // what a refused submission is told
};

AutoStop::Admission::~Admission() {
  MutexLock lock(&gate_->mu);
  --gate_->admitted;
}

StatusOr<std::shared_ptr<AutoStop::Admission>> AutoStop::AdmitSubmission() const {
  MutexLock lock(&gate_->mu);
  if (gate_->stopping) return FailedPreconditionError(gate_->refusal);
  ++gate_->admitted;
  return std::make_shared<Admission>(gate_);
}

bool AutoStop::BeginStopping(const std::string& why) {
  MutexLock lock(&gate_->mu);
  // Read again under the gate: a submission admitted after the snapshot either still holds its
  // Admission or its job is counted by now.
  if (gate_->admitted > 0 || (deps_.active_jobs && deps_.active_jobs() > 0)) return false;
  gate_->stopping = true;
  gate_->refusal = "the host is stopping (auto-stop: " + why + "); submit to another host";
  return true;
}

void AutoStop::CloseGate(const std::string& refusal) {
  MutexLock lock(&gate_->mu);
  gate_->stopping = true;
  gate_->refusal = refusal;
}

std::string AutoStop::CapReason(const CostCap& cap) const {
  return action_.empty() ? cap.why + "; no stop action: the host keeps running" : cap.why;
}

int64_t AutoStop::UnixNowMs(Clock::TimePoint now) const {
  return origin_unix_ms_ + std::chrono::duration_cast<std::chrono::milliseconds>(now - origin_).count();
}

StatusOr<StopPolicy> LoadStopPolicy(StateStore* store, const StopPolicyFlags& flags, const StopEnv& env,
                                    int64_t now_unix_s) {
  StopPolicy policy;
  SFT_ASSIGN_OR_RETURN(std::optional<std::string> saved, store->GetSetting(kPolicyKey));
  if (saved) policy = StopPolicyFromJson(nlohmann::json::parse(*saved, nullptr, false));
  bool changed = flags.any();
  if (changed) {
    policy = ApplyStopFlags(policy, flags);
    SFT_RETURN_IF_ERROR(ValidateStopPolicy(policy));
    if (policy.idle_s > 0 && ResolveAction(policy, env).empty()) {
      return ActionCommand("", policy).status().WithContext("--stop-when-idle");
    }
  }
  if (policy.price_per_hour > 0 && policy.billing_since_unix_s == 0) {  // billing began no later than now
    policy.billing_since_unix_s = now_unix_s > 0 ? now_unix_s : UnixMsNow() / 1000;
    changed = true;
  }
  if (changed) SFT_RETURN_IF_ERROR(store->PutSetting(kPolicyKey, StopPolicyToJson(policy).dump()));
  return policy;
}

AutoStop::AutoStop(AutoStopDeps deps, StopPolicy policy)
    : deps_(std::move(deps)),
      policy_(std::move(policy)),
      action_(ResolveAction(policy_, deps_.env)),
      gate_(std::make_shared<Gate>()),
      origin_(deps_.clock->Now()),
      origin_unix_ms_(deps_.unix_ms_at_start > 0 ? deps_.unix_ms_at_start : UnixMsNow()),
      lead_s_(std::chrono::duration_cast<std::chrono::seconds>(deps_.check + std::chrono::milliseconds(999) +
                                                               deps_.job_stop_time + deps_.action_timeout)
                  .count()),
      busy_at_(origin_),
      checks_(deps_.check, [this] { CheckOnce(); }) {
  view_.policy = DescribeStopPolicy(policy_, action_);
  view_.action = action_;
  view_.idle_s = policy_.idle_s;
  view_.price_per_hour = policy_.price_per_hour;
  view_.max_cost = policy_.max_cost;
  view_.billing_since_unix_s = policy_.billing_since_unix_s;
  if (auto last = deps_.store->GetSetting(kLastActionKey); last.ok() && *last) {
    view_.last_action = nlohmann::json::parse(**last, nullptr, false).value("summary", "");
  }
  // A restarted agent whose cap is spent takes no job, from before its first check.
  const CostCap cap = DecideCostCap(policy_, origin_unix_ms_, lead_s_);
  view_.spent = cap.spent;
  view_.cap_remaining_s = cap.remaining_s;
  if (cap.reached) {
    cap_reason_ = CapReason(cap);
    CloseGate("the host is stopping (" + cap_reason_ + "); submit to another host");
  }
}

void AutoStop::Start() {
  {
    MutexLock l(&check_mu_);
    busy_at_ = deps_.clock->Now();
  }
  checks_.Start();
}

StopDecision AutoStop::CheckOnce() {
  MutexLock check_lock(&check_mu_);
  StopInputs in;
  in.now = deps_.clock->Now();
  in.active_jobs = deps_.active_jobs ? deps_.active_jobs() : 0;
  in.open_calls = deps_.activity ? deps_.activity->open_calls() : 0;
  if (in.active_jobs > 0 || in.open_calls > 0) busy_at_ = in.now;
  in.quiet_since = busy_at_;
  in.now_unix_ms = UnixNowMs(in.now);
  in.cost_lead_s = lead_s_;
  if (deps_.activity) in.quiet_since = std::max(in.quiet_since, deps_.activity->last_contact());
  std::vector<std::string> ended;
  GatherStopWhenDone(&in, &ended);
  StopDecision d = DecideStop(policy_, in);
  if (d.verdict == StopVerdict::kCostCap) {
    EnforceCap(d, in.now);
  } else if (d.verdict == StopVerdict::kStopNow && fired() == 0 && !action_.empty()) {
    if (BeginStopping(d.why)) {
      Fire(d, ended, /*cost_cap=*/false);
    } else {  // a job was submitted meanwhile: busy again
      busy_at_ = in.quiet_since = in.now;
      in.active_jobs = deps_.active_jobs ? deps_.active_jobs() : 0;
      if (in.active_jobs == 0) in.open_calls = std::max<uint32_t>(1, in.open_calls);  // the submit call
      d = DecideStop(policy_, in);
    }
  }
  Publish(d);
  return d;
}

void AutoStop::GatherStopWhenDone(StopInputs* in, std::vector<std::string>* ended) {
  auto recs = deps_.store->StopWhenDoneJobs();
  if (!recs.ok()) {
    spdlog::warn("auto-stop: {}", recs.status().ToString());
    return;
  }
  const bool survives = StorageSurvives(policy_, deps_.data_dir, deps_.env);
  for (const StopWhenDoneRecord& r : *recs) {
    if (!IsFinal(r.state)) {
      ++in->waiting_jobs;
      continue;
    }
    in->work_done = true;
    ended->push_back(r.job_id);
    if (r.status == StopWhenDone::kPulled || survives) continue;
    const std::string done = FinalCheckpointDone(r.job_id, r.job_dir);
    if (done.empty()) continue;  // no complete checkpoint: nothing to save
    if (deps_.activity && deps_.activity->WasPulled(r.job_id, done)) {
      spdlog::info("auto-stop: {}'s final checkpoint ({}) was pulled", r.job_id, done);
      if (Status s = deps_.store->SetStopWhenDone(r.job_id, StopWhenDone::kPulled); !s.ok())
        spdlog::warn("auto-stop: {}", s.ToString());
      continue;
    }
    auto since = pull_wait_since_.emplace(r.job_id, in->now).first->second;
    if (in->unpulled.empty() || since < in->pull_wait_since) in->pull_wait_since = since;
    in->unpulled.push_back(r.job_id);
  }
}

std::string AutoStop::FinalCheckpointDone(const std::string& job_id, const std::string& job_dir) {
  if (auto it = final_done_.find(job_id); it != final_done_.end()) return it->second;
  FileSystem* fs = deps_.fs;
  std::string best;
  int64_t best_step = -1;
  auto names = fs->ListDir(job_dir + "/run");
  for (const std::string& n : names.ok() ? *names : std::vector<std::string>{}) {
    const int64_t step = CheckpointStep(n);
    if (step > best_step && fs->Exists(job_dir + "/run/" + n + "/DONE")) {
      best_step = step;
      best = "run/" + n + "/DONE";
    }
  }
  final_done_[job_id] = best;
  return best;
}

void AutoStop::EnforceCap(const StopDecision& d, Clock::TimePoint now) {
  if (cap_reason_.empty()) cap_reason_ = CapReason(d.cap);
  const std::string& reason = cap_reason_;
  CloseGate("the host is stopping (" + reason + "); submit to another host");
  uint32_t active = deps_.active_jobs ? deps_.active_jobs() : 0;
  if (!cap_began_ || active > 0) {  // again while one is active: a submission admitted just before
    const size_t cancelled = deps_.cancel_jobs ? deps_.cancel_jobs(reason) : 0;
    if (!cap_began_) spdlog::warn("auto-stop: {}: cancelled {} job(s)", reason, cancelled);
    if (!cap_began_) cap_since_ = cap_retry_at_ = now;
    cap_began_ = true;
    active = deps_.active_jobs ? deps_.active_jobs() : 0;
  }
  if (action_.empty() || fired() > 0 || now < cap_retry_at_) return;
  uint32_t admitted = 0;
  {
    MutexLock lock(&gate_->mu);
    admitted = gate_->admitted;
  }
  const bool waited_enough = now - cap_since_ >= deps_.job_stop_time + deps_.check;
  if ((active == 0 && admitted == 0) || waited_enough) Fire(d, {}, /*cost_cap=*/true);
}

void AutoStop::Fire(const StopDecision& d, const std::vector<std::string>& ended, bool cost_cap) {
  {
    MutexLock lock(&mu_);
    view_.state = "stopping";
    view_.detail = d.why;
  }
  StatusOr<StopActionOutcome> out =
      RunStopAction(action_, policy_, deps_.env, deps_.runner, deps_.http ? deps_.http : CurlHttpClient(),
                    deps_.action_timeout);
  const bool ok = out.ok() && out->ok;
  const std::string result = out.ok() ? out->result : out.status().ToString();
  if (ok) {
    spdlog::warn("auto-stop: {}: the {} action ran: {}", d.why, action_, result);
  } else {
    spdlog::error("auto-stop: {}: the {} action failed: {}; trying again {}", d.why, action_, result,
                  cost_cap ? "in " + FormatDuration(deps_.cap_retry.count()) : "after another quiet period");
  }
  if (out.ok() && !out->output.empty()) spdlog::info("auto-stop: action output:\n{}", out->output);
  const std::string summary =
      FormatUtc(std::time(nullptr)) + " " + action_ + ": " + result + " (" + d.why + ")";
  nlohmann::json rec = {{"time_unix_ms", UnixMsNow()},
                        {"action", action_},
                        {"why", d.why},
                        {"result", result},
                        {"ok", ok},
                        {"summary", summary},
                        {"output", out.ok() ? out->output : std::string()}};
  if (Status s = deps_.store->PutSetting(kLastActionKey,
                                         rec.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      !s.ok())
    spdlog::warn("auto-stop: {}", s.ToString());
  if (!ok && cost_cap) {
    cap_retry_at_ = deps_.clock->Now() + deps_.cap_retry;  // submissions stay refused: the cap is spent
  } else if (!ok) {
    busy_at_ = deps_.clock->Now();  // re-armed: a full grace before the next try
    MutexLock lock(&gate_->mu);
    gate_->stopping = false;  // the host stays: submissions are welcome again
  } else {
    for (const std::string& id : ended) {
      if (Status s = deps_.store->SetStopWhenDone(id, StopWhenDone::kConsumed); !s.ok())
        spdlog::warn("auto-stop: {}", s.ToString());
    }
  }
  MutexLock lock(&mu_);
  if (ok) fired_++;
  view_.last_action = summary;
}

void AutoStop::Publish(const StopDecision& d) {
  MutexLock lock(&mu_);
  const std::string before = view_.state;
  view_.spent = d.cap.spent;
  view_.cap_remaining_s = d.cap.remaining_s;
  if (d.verdict == StopVerdict::kCostCap) {
    view_.cap_reached = true;
    view_.cap_reason = cap_reason_;
  }
  if (fired_ > 0) {  // the detail stays the reason it fired
    view_.state = "stopped";
    view_.remaining_s = 0;
    return;
  }
  view_.remaining_s = d.remaining_s;
  view_.detail = d.why;
  if (d.verdict == StopVerdict::kCostCap) {
    view_.detail = view_.cap_reason;
    view_.state = action_.empty() ? "no_action" : "stopping";  // jobs end, or the action is tried again
  } else if (d.verdict != StopVerdict::kOff && action_.empty()) {
    view_.state = "no_action";
  } else if (d.verdict == StopVerdict::kStopNow) {
    view_.state = "countdown";  // the action failed: re-armed
    view_.remaining_s = 0;
  } else {
    view_.state = StopVerdictName(d.verdict);
  }
  if (view_.state != before) spdlog::info("auto-stop: {} ({})", view_.state, view_.detail);
}

AutoStopView AutoStop::View() const {
  MutexLock lock(&mu_);
  return view_;
}

int AutoStop::fired() const {
  MutexLock lock(&mu_);
  return fired_;
}

}  // namespace sftctl::agent
