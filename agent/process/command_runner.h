// CommandRunner: the process seam of the agent's own shell commands (the shell stop actions of
// agent/stopping/stop_action.h, Slurm's commands). Tests substitute a recording runner; the real one runs
// `/bin/sh -c COMMAND`: the command text is on the shell's command line, which every user of the host
// can read (/proc/<pid>/cmdline), so no command may hold a secret: secrets reach a command only through
// its environment (the allowlist below), and the "lambda" action is no command at all.
//
// Thread safety: Run may be called from any thread; it blocks until the command ends or times out, so
// never call it on the supervisor's event thread or inside a gRPC reaction.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/os/clock.h"
#include "common/os/process_util.h"
#include "common/status.h"

namespace sftctl::agent {

struct CommandOutcome {
  int exit_code = 0;  // valid when signal == 0 and !timed_out
  int signal = 0;     // the signal that ended it, 0 if it exited
  bool timed_out = false;
  int64_t timeout_s = 0;  // the timeout, when timed_out
  std::string output;     // stdout and stderr together, at most the first kMaxCommandOutput bytes
  bool ok() const { return !timed_out && signal == 0 && exit_code == 0; }
  // "exit code 0", "killed by signal 9 (SIGKILL)", "timed out after 120 s".
  std::string Describe() const;
};

inline constexpr size_t kMaxCommandOutput = 16 * 1024;

class CommandRunner {
 public:
  virtual ~CommandRunner() = default;
  // Runs `command` with /bin/sh -c in a process group of its own, stdin from /dev/null, stdout and
  // stderr captured, the agent's environment as this runner's allowlist passes it (Default below;
  // ChildEnvAllowed in common/os/process_util.h), default signal dispositions and an empty signal mask.
  // After `timeout` the group gets SIGKILL and the outcome says timed_out. Errors: the command could
  // not be started (INTERNAL naming the cause).
  virtual StatusOr<CommandOutcome> Run(const std::string& command, std::chrono::seconds timeout) = 0;

  // A real runner, timing out on `Clock::Real()`, whose commands get the agent's environment as
  // ChildEnvAllowed(name, env) passes it: ChildKind::kStopCommand for the stop command (its cloud
  // APIs), ChildKind::kSlurmCommand for Slurm's commands (the basics only). The caller owns it.
  static std::unique_ptr<CommandRunner> NewPosix(ChildKind env);
};

}  // namespace sftctl::agent
