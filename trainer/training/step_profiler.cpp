#include "trainer/training/step_profiler.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <set>

#include "common/os/file_system.h"

namespace sftctl::trainer {
namespace {

namespace prof = torch::autograd::profiler;

// An event's start and length in microseconds: LibTorch 2.x reports nanoseconds (startNs), 1.x
// microseconds (startUs). Chosen by what the event type has, not by version number.
template <typename E>
auto StartUs(const E& e, int) -> decltype(e.startNs(), double()) {
  return static_cast<double>(e.startNs()) / 1e3;
}
template <typename E>
double StartUs(const E& e, long) {
  return static_cast<double>(e.startUs());
}
template <typename E>
auto DurationUs(const E& e, int) -> decltype(e.durationNs(), double()) {
  return static_cast<double>(e.durationNs()) / 1e3;
}
template <typename E>
double DurationUs(const E& e, long) {
  return static_cast<double>(e.durationUs());
}

// Chrome's trace-event JSON of the recorded events: one complete ("X") event per operator.
std::string TraceFromEvents(const prof::ProfilerResult& result, int pid) {
  nlohmann::json events = nlohmann::json::array();
  for (const prof::KinetoEvent& e : result.events()) {
    const bool gpu = e.deviceType() == c10::DeviceType::CUDA;
    events.push_back({{"name", e.name()},
                      {"cat", gpu ? "kernel" : "cpu_op"},
                      {"ph", "X"},
                      {"ts", StartUs(e, 0)},
                      {"dur", DurationUs(e, 0)},
                      {"pid", pid},
                      {"tid", e.startThreadId()}});
  }
  nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return trace.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The folder exists (made if missing) and takes a new file.
Status CheckTraceDir(const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  if (fs->Exists(dir) && !fs->IsDirectory(dir))
    return FailedPreconditionError("--profile: '" + dir + "' is not a folder");
  if (Status s = fs->CreateDirs(dir); !s.ok())
    return FailedPreconditionError("--profile: cannot make the folder '" + dir + "': " + s.message());
  const std::string probe = JoinPath(dir, fmt::format(".sftctl-profile-probe-{}", ::getpid()));
  Status written = WriteFileAtomic(fs, probe, "");
  if (!written.ok())
    return FailedPreconditionError("--profile: cannot write into the folder '" + dir +
                                   "': " + written.message());
  (void)fs->RemoveAll(probe);
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<StepProfiler>> StepProfiler::Open(const ProfileOptions& options, int rank,
                                                           const torch::Device& device,
                                                           std::function<void(const std::string&)> say) {
  if (options.steps < 1)
    return InvalidArgumentError(fmt::format("--profile-steps: expected at least 1, got {}", options.steps));
  SFT_RETURN_IF_ERROR(CheckTraceDir(options.dir));
  std::unique_ptr<StepProfiler> p(new StepProfiler());
  p->options_ = options;
  p->path_ = JoinPath(options.dir, fmt::format("trace-rank{}.json", rank));
  p->cuda_ = device.is_cuda();
  p->say_ = std::move(say);
  return p;
}

StepProfiler::~StepProfiler() {
  if (!recording_) return;
  try {
    step_scope_.reset();
    prof::disableProfiler();
  } catch (const std::exception&) {  // a destructor stops it quietly
  }
}

Status StepProfiler::BeforeStep(int64_t session_step, int64_t run_step) {
  if (session_step == 1 && !written_) {
    std::set<prof::ActivityType> activities = {prof::ActivityType::CPU};
    if (cuda_) activities.insert(prof::ActivityType::CUDA);
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    try {
      prof::prepareProfiler(config, activities);
      prof::enableProfiler(config, activities);
    } catch (const c10::Error& e) {
      return InternalError(std::string("--profile: LibTorch's profiler did not start: ") +
                           e.what_without_backtrace());
    }
    recording_ = true;
    first_run_step_ = run_step;
  }
  if (!recording_) return OkStatus();
  // The step as a span of its own in the trace, around its operators.
  step_name_ = fmt::format("sftctl step {}", run_step);
  step_scope_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (step_scope_->isActive()) step_scope_->before(step_name_.c_str());
  return OkStatus();
}

Status StepProfiler::AfterStep(int64_t session_step) {
  if (!recording_) return OkStatus();
  step_scope_.reset();
  ++steps_recorded_;
  if (session_step < options_.steps) return OkStatus();
  return Write();
}

Status StepProfiler::Finish() {
  if (written_) return OkStatus();
  if (!recording_) {
    say_("profile: nothing traced: this session trained fewer than 2 steps (the first is a warm-up)");
    return OkStatus();
  }
  step_scope_.reset();
  say_(fmt::format("profile: the run ended after {} of the {} steps asked for", steps_recorded_,
                   options_.steps));
  return Write();
}

// Stops the profiler and writes the trace: LibTorch's own (Kineto), else one made from its events.
Status StepProfiler::Write() {
  std::unique_ptr<prof::ProfilerResult> result;
  try {
    result = prof::disableProfiler();
  } catch (const c10::Error& e) {
    recording_ = false;
    return InternalError(std::string("--profile: LibTorch's profiler did not stop: ") +
                         e.what_without_backtrace());
  }
  recording_ = false;
  written_ = true;
  const std::string steps = steps_recorded_ == 1 ? fmt::format("step {}", first_run_step_)
                                                 : fmt::format("steps {}-{}", first_run_step_,
                                                               first_run_step_ + steps_recorded_ - 1);
  std::string unsaved;  // why LibTorch did not save the trace itself
  try {
    result->save(path_);
  } catch (const c10::Error& e) {
    // Built without Kineto (USE_KINETO), LibTorch cannot save; the events it recorded are still there.
    unsaved = e.what_without_backtrace();
    unsaved = unsaved.substr(0, unsaved.find('\n'));
    if (unsaved.empty()) unsaved = "no reason given";
  }
  if (!unsaved.empty()) {
    SFT_RETURN_IF_ERROR(WriteFileAtomic(FileSystem::Default(), path_, TraceFromEvents(*result, ::getpid()))
                            .WithContext("--profile: writing the trace"));
    say_("profile: LibTorch did not write the trace (" + unsaved +
         "): written from its recorded events, CPU operators only");
  }
  say_(
      fmt::format("profile: {} traced to {} (open it in ui.perfetto.dev or chrome://tracing)", steps, path_));
  return OkStatus();
}

}  // namespace sftctl::trainer
