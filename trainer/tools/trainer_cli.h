// sftctl-trainer: the only sftctl binary that links LibTorch. The same binary trains locally
// (exec'd by `sftctl run --local`) and on GPU hosts (spawned by sftd, one per rank).
//
//   sftctl-trainer train --spec RUN/spec.json [--events-fd N] [--profile DIR [--profile-steps N]]
//   sftctl-trainer generate|eval|export ...   (the flags of `sftctl generate|eval|export`, which
//                                             passes them on: common/cli/trainer_flags.h)
//   sftctl-trainer check-runtime
#pragma once

#include "common/os/file_system.h"

namespace sftctl::trainer {

// Runs the command `argv` names and returns the process's exit code (2: the input is wrong; 1:
// anything else). Every command first checks where std::filesystem binds
// (trainer/runtime/cxx_runtime_check.h). `train_fs`: the file system `train` writes its run folder
// through; null is the real one (FileSystem::Default()). The shipped binary passes null
// (trainer/tools/main.cpp); a test links its own trainer to pass one that injects faults
// (tests/trainer/slow_checkpoint_trainer.cpp).
int TrainerMain(int argc, char** argv, FileSystem* train_fs = nullptr);

}  // namespace sftctl::trainer
