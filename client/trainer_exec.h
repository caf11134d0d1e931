// Finding and running sibling binaries (sftctl-trainer) from the client.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client {

// The path of `name` in the folder of the running executable, else found on PATH.
StatusOr<std::string> FindSiblingBinary(const std::string& name);

// Runs `path` with `args` (argv[1..]) as a child sharing this terminal, waits, and returns
// its exit code (128 + signal number if it was killed). SIGINT/SIGTERM received by the
// client while waiting are forwarded to the child, which checkpoints or exits on its own.
StatusOr<int> RunChild(const std::string& path, const std::vector<std::string>& args);

// Runs `sftctl-trainer ARGS...` (the commands that need LibTorch) and returns the exit code
// to leave with: the trainer's own, or 2 after printing why it could not be run.
int RunTrainer(const std::vector<std::string>& args);

}  // namespace sftctl::client
