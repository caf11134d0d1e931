// StepProfiler: a Chrome trace of a few optimizer steps through LibTorch's profiler
// (`sftctl run --profile DIR --profile-steps N`, docs/observability.md).
//
// The first step of the session is a warm-up (allocator, kernel selection, caches) and is never
// profiled; the profiler records the N steps after it and writes DIR/trace-rank<R>.json when the
// last of them ends, or when the loop ends first (fewer steps than asked; it says so). The file
// is Chrome's trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//
// LibTorch writes the trace itself when it was built with Kineto (CPU operators, and on CUDA the
// GPU kernels). A LibTorch built without Kineto (Debian's) still records the CPU operators but
// cannot save them: then the trace is written here from the recorded events (CPU operators only,
// said once on `say`).
//
// Thread safety: one thread (the training loop); the profiler covers that thread's operators and
// autograd's. Only one StepProfiler may record at a time in a process.
#pragma once

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "common/cli/train_flags.h"
#include "common/status.h"

namespace sftctl::trainer {

struct ProfileOptions {
  std::string dir;                            // empty: no profile
  int64_t steps = cli::kProfileStepsDefault;  // > 0
};

class StepProfiler {
 public:
  // Checks options.dir before anything trains: made if missing, then a file is created and removed
  // in it. `rank` names the trace; CUDA activities are recorded when `device` is CUDA; `say`
  // receives the lines for the user. Errors: INVALID_ARGUMENT (steps < 1), FAILED_PRECONDITION
  // (the folder is a file, cannot be made or is not writable), each naming the folder.
  static StatusOr<std::unique_ptr<StepProfiler>> Open(const ProfileOptions& options, int rank,
                                                      const torch::Device& device,
                                                      std::function<void(const std::string&)> say);
  // Stops a profiler still recording (without writing a trace).
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Before the session's optimizer step `session_step` (0: the first, the warm-up) with the run's
  // step number `run_step` it will have: starts recording before session step 1. Errors: INTERNAL
  // when LibTorch's profiler cannot start (another profiler is active).
  Status BeforeStep(int64_t session_step, int64_t run_step);
  // After that step: writes the trace after the last profiled step. Errors: the trace cannot be
  // written (naming it).
  Status AfterStep(int64_t session_step);
  // At the end of the loop: writes what was recorded if the run had fewer steps than asked, or
  // says that nothing was (a session of one step has only its warm-up).
  Status Finish();

  // DIR/trace-rank<R>.json.
  const std::string& path() const { return path_; }

 private:
  StepProfiler() = default;
  Status Write();

  ProfileOptions options_;
  std::string path_;
  std::string step_name_;                           // the open step span's name
  std::unique_ptr<at::RecordFunction> step_scope_;  // the open step span
  bool cuda_ = false;
  bool recording_ = false;
  bool written_ = false;
  int64_t first_run_step_ = 0, steps_recorded_ = 0;
  std::function<void(const std::string&)> say_;
};

}  // namespace sftctl::trainer
