#include "client/local/trainer_exec.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/os/self_exe.h"

namespace sftctl::client {
namespace {

volatile sig_atomic_t g_child = 0;

void ForwardToChild(int sig) {
  if (g_child > 0) ::kill(g_child, sig);
}

bool IsExecutable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

// The first executable `name` in a folder of PATH, as a shell would find it; "" when none.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::stringstream ss(path);
  for (std::string d; std::getline(ss, d, ':');) {
    if (!d.empty() && IsExecutable(d + "/" + name)) return d + "/" + name;
  }
  return "";
}

}  // namespace

StatusOr<std::string> FindSiblingBinary(const std::string& name) {
  if (StatusOr<std::string> self = SelfExePath(); self.ok()) {
    const std::string dir = DirWithSlash(*self);
    if (IsExecutable(dir + name)) return dir + name;
  }
  if (std::string found = FindOnPath(name); !found.empty()) return found;
  return NotFoundError("cannot find '" + name + "' next to sftctl or on PATH (was it built? see README)");
}

std::string SelfCommandName() {
  StatusOr<std::string> self = SelfExePath();
  if (!self.ok()) return "sftctl";
  const std::string on_path = FindOnPath("sftctl");
  char resolved[PATH_MAX];
  if (!on_path.empty() && ::realpath(on_path.c_str(), resolved) != nullptr && *self == resolved)
    return "sftctl";
  return *self;
}

StatusOr<int> RunChild(const std::string& path, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError("cannot start", path, errno);
  if (pid == 0) {
    ::execv(path.c_str(), argv.data());
    std::fprintf(stderr, "error: cannot execute '%s': %s\n", path.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  g_child = pid;
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = ForwardToChild;
  sigemptyset(&sa.sa_mask);  // no "::": a macro on macOS
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  g_child = 0;
  if (r < 0) return ErrnoError("cannot wait for", path, errno);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

int RunTrainer(const std::vector<std::string>& args) {
  auto trainer = FindSiblingBinary("sftctl-trainer");
  StatusOr<int> code = trainer.ok() ? RunChild(*trainer, args) : StatusOr<int>(trainer.status());
  if (code.ok()) return *code;
  std::fprintf(stderr, "error: %s\n", code.status().message().c_str());
  return 2;
}

}  // namespace sftctl::client
