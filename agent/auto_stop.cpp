#include "agent/auto_stop.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>

#include "common/checkpoint_name.h"
#include "common/os/file_system.h"

namespace sftctl::agent {
namespace {

constexpr char kPolicyKey[] = "auto_stop.policy";
constexpr char kLastActionKey[] = "auto_stop.last_action";

// "2026-01-02T03:04:05Z" for now.
std::string UtcNow() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int64_t UnixMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct AutoStop::Gate {
  Mutex mu;
  uint32_t admitted GUARDED_BY(mu) = 0;  // submissions whose job is not yet counted as active
  bool stopping GUARDED_BY(mu) = false;  // the action runs, or ran and succeeded
  std::string why GUARDED_BY(mu);        // the decision that began the stop
};

AutoStop::Admission::~Admission() {
  MutexLock lock(&gate_->mu);
  --gate_->admitted;
}

StatusOr<std::shared_ptr<AutoStop::Admission>> AutoStop::AdmitSubmission() const {
  MutexLock lock(&gate_->mu);
  if (gate_->stopping) {
    return FailedPreconditionError("the host is stopping (auto-stop: " + gate_->why +
                                   "); submit to another host");
  }
  ++gate_->admitted;
  return std::make_shared<Admission>(gate_);
}

bool AutoStop::BeginStopping(const std::string& why) {
  MutexLock lock(&gate_->mu);
  // Read again under the gate: a submission admitted after the snapshot either still holds its
  // Admission or its job is counted by now.
  if (gate_->admitted > 0 || (deps_.active_jobs && deps_.active_jobs() > 0)) return false;
  gate_->stopping = true;
  gate_->why = why;
  return true;
}

StatusOr<StopPolicy> LoadStopPolicy(StateStore* store, const StopPolicyFlags& flags, const StopEnv& env) {
  StopPolicy policy;
  SFT_ASSIGN_OR_RETURN(std::optional<std::string> saved, store->GetSetting(kPolicyKey));
  if (saved) policy = StopPolicyFromJson(nlohmann::json::parse(*saved, nullptr, false));
  if (!flags.any()) return policy;
  policy = ApplyStopFlags(policy, flags);
  SFT_RETURN_IF_ERROR(ValidateStopPolicy(policy));
  if (policy.idle_s > 0 && ResolveAction(policy, env).empty()) {
    return ActionCommand("", policy).status().WithContext("--stop-when-idle");
  }
  SFT_RETURN_IF_ERROR(store->PutSetting(kPolicyKey, StopPolicyToJson(policy).dump()));
  return policy;
}

AutoStop::AutoStop(AutoStopDeps deps, StopPolicy policy)
    : deps_(std::move(deps)),
      policy_(std::move(policy)),
      action_(ResolveAction(policy_, deps_.env)),
      gate_(std::make_shared<Gate>()),
      busy_at_(deps_.clock->Now()),
      checks_(deps_.check, [this] { CheckOnce(); }) {
  view_.policy = DescribeStopPolicy(policy_, action_);
  view_.action = action_;
  view_.idle_s = policy_.idle_s;
  view_.price_per_hour = policy_.price_per_hour;
  if (auto last = deps_.store->GetSetting(kLastActionKey); last.ok() && *last) {
    view_.last_action = nlohmann::json::parse(**last, nullptr, false).value("summary", "");
  }
}

StopDecision AutoStop::CheckOnce() {
  MutexLock check_lock(&check_mu_);
  StopInputs in;
  in.now = deps_.clock->Now();
  in.active_jobs = deps_.active_jobs ? deps_.active_jobs() : 0;
  in.open_calls = deps_.activity ? deps_.activity->open_calls() : 0;
  if (in.active_jobs > 0 || in.open_calls > 0) busy_at_ = in.now;
  in.quiet_since = busy_at_;
  if (deps_.activity) in.quiet_since = std::max(in.quiet_since, deps_.activity->last_contact());
  std::vector<std::string> ended;
  GatherStopWhenDone(&in, &ended);
  StopDecision d = DecideStop(policy_, in);
  if (d.verdict == StopVerdict::kStopNow && fired() == 0 && !action_.empty()) {
    if (BeginStopping(d.why)) {
      Fire(d, ended);
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
  FileSystem* fs = FileSystem::Default();
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

void AutoStop::Fire(const StopDecision& d, const std::vector<std::string>& ended) {
  {
    MutexLock lock(&mu_);
    view_.state = "stopping";
    view_.detail = d.why;
  }
  auto cmd = ActionCommand(action_, policy_);
  StatusOr<CommandOutcome> out =
      cmd.ok() ? deps_.runner->Run(*cmd, deps_.action_timeout) : StatusOr<CommandOutcome>(cmd.status());
  const bool ok = out.ok() && out->ok();
  const std::string result = out.ok() ? out->Describe() : out.status().ToString();
  if (ok) {
    spdlog::warn("auto-stop: {}: the {} action ran: {}", d.why, action_, result);
  } else {
    spdlog::error("auto-stop: {}: the {} action failed: {}; trying again after another quiet period", d.why,
                  action_, result);
  }
  if (out.ok() && !out->output.empty()) spdlog::info("auto-stop: action output:\n{}", out->output);
  const std::string summary = UtcNow() + " " + action_ + ": " + result + " (" + d.why + ")";
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
  if (!ok) {
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
  if (fired_ > 0) {  // the detail stays the reason it fired
    view_.state = "stopped";
    view_.remaining_s = 0;
    return;
  }
  view_.remaining_s = d.remaining_s;
  view_.detail = d.why;
  if (d.verdict != StopVerdict::kOff && action_.empty()) {
    view_.state = "no_action";
  } else if (d.verdict == StopVerdict::kStopNow) {
    view_.state = "countdown";  // the action failed: re-armed
    view_.remaining_s = 0;
  } else {
    view_.state = StopVerdictName(d.verdict);
  }
  if (view_.state != before) spdlog::info("auto-stop: {} ({})", view_.state, d.why);
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
