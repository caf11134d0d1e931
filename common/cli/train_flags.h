// The flags `sftctl run` passes on to `sftctl-trainer train` besides the spec, each named once:
// the client registers them on `run` and forwards what was given; the trainer registers the same
// names, help and defaults on `train`.
//
// Thread safety: constants only.
#pragma once

#include <cstdint>

namespace sftctl::cli {

// --profile DIR: a Chrome trace of a few steps through LibTorch's profiler (docs/observability.md).
inline constexpr char kProfileFlag[] = "--profile";
inline constexpr char kProfileHelp[] =
    "Write a Chrome trace (Perfetto, chrome://tracing) of --profile-steps steps after the first "
    "(warm-up) step to DIR/trace-rank<R>.json, one file per rank (R = 0 on one process); DIR is "
    "made if missing and must be a writable folder";
inline constexpr char kProfileStepsFlag[] = "--profile-steps";
inline constexpr char kProfileStepsHelp[] = "Optimizer steps the --profile trace covers";
inline constexpr int64_t kProfileStepsDefault = 3;

}  // namespace sftctl::cli
