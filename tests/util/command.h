// Running commands and the project's binaries from tests, in one place.
//   RunCommand(argv, env): argv[0] looked up in PATH, `env` entries added in front of ours (the first
//     of a name wins), stdin from /dev/null; stdout and stderr captured together.
//   RunForStdout(argv): the same, capturing only stdout (stderr goes to the test's log), for
//     commands whose output is parsed (e.g. `sftd status --json`).
//   RunShell(command): `bash -c command` (so $'...' quoting works), stdout and stderr together.
//   Bin(name): the path of a binary this build made (SFTCTL_BIN_DIR).
// Each waits for the command to end. Thread-compatible (fork + exec; the child only execs). The
// command gets SIGKILL if the thread that ran it dies first (PR_SET_PDEATHSIG, Linux: a killed test
// takes it along); what it leaves running in the background is the guard's (tests/util/owned_processes.h).
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <csignal>
#include <string>
#include <vector>

#include "tests/util/test_paths.h"

extern char** environ;

namespace sftctl::testing {

struct CommandResult {
  int exit_code = -1;  // 128 + N when killed by signal N; -1 when it could not run at all
  std::string output;
};

namespace internal {

inline CommandResult Run(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                         bool with_stderr) {
  CommandResult r;
  std::vector<std::string> env_strings(env), argv_copy(argv);
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp, args;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  int p[2];
  if (argv.empty() || ::pipe2(p, O_CLOEXEC) != 0) return r;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
#if defined(__linux__)
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (::getppid() != parent) ::_exit(127);  // the test died before the signal was armed
    ::dup2(p[1], 1);
    if (with_stderr) ::dup2(p[1], 2);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::execvpe(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(p[1]);
  char buf[4096];
  for (ssize_t n; pid > 0 && ((n = ::read(p[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR));)
    if (n > 0) r.output.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace internal

inline CommandResult RunCommand(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env = {}) {
  return internal::Run(argv, env, true);
}

inline CommandResult RunForStdout(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env = {}) {
  return internal::Run(argv, env, false);
}

inline CommandResult RunShell(const std::string& command) { return RunCommand({"/bin/bash", "-c", command}); }

inline std::string Bin(const std::string& name) { return std::string(SFTCTL_BIN_DIR) + "/" + name; }

}  // namespace sftctl::testing
