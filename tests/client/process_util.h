// Running the real sftctl binaries from tests and capturing what they print.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace sftctl::testing {

struct ProcessResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` with bash (so $'...' quoting works), stderr merged into stdout.
inline ProcessResult RunCommand(const std::string& command) {
  ProcessResult r;
  int fds[2];
  if (::pipe(fds) != 0) return r;
  pid_t pid = ::fork();
  if (pid < 0) return r;
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    ::execl("/bin/bash", "bash", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) r.output.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

inline std::string Bin(const std::string& name) { return std::string(SFTCTL_BIN_DIR) + "/" + name; }

}  // namespace sftctl::testing
