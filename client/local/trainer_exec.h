// Finding and running sibling binaries (sftctl-trainer) from the client.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client {

// The path of `name` in the folder of the running executable, else found on PATH.
StatusOr<std::string> FindSiblingBinary(const std::string& name);

// How a hint line names this sftctl so that it can be typed in the same shell: "sftctl" when the
// first `sftctl` on PATH is this binary, else this binary's absolute path (root's login shell on
// Debian has no ~/.local/bin on PATH; a build's bin/ folder is on nobody's).
std::string SelfCommandName();

// Runs `path` with `args` (argv[1..]) as a child sharing this terminal, waits, and returns
// its exit code (128 + signal number if it was killed). SIGINT/SIGTERM received by the
// client while waiting are forwarded to the child, which checkpoints or exits on its own.
StatusOr<int> RunChild(const std::string& path, const std::vector<std::string>& args);

// Runs `sftctl-trainer ARGS...` (the commands that need LibTorch) and returns the exit code
// to leave with: the trainer's own, or 2 after printing why it could not be run.
int RunTrainer(const std::vector<std::string>& args);

}  // namespace sftctl::client
