// A test server written in Python (tests/util/fake_*.py) run as a child process: it prints one line
// naming its ports on stdout, serves until SIGTERM, and logs the requests it served as JSON lines.
// PythonServer starts it in a process group of its own and reads that line; Stop (or the destructor)
// sends SIGTERM to the group, reaps the server and SIGKILLs what is left of the group. The server gets
// SIGTERM when the thread that started it dies (PR_SET_PDEATHSIG, Linux: a killed test takes it along;
// what it started in sessions of their own is the guard's, tests/util/owned_processes.h). One thread
// at a time.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/util/test_paths.h"

namespace sftctl::testing {

class PythonServer {
 public:
  PythonServer() = default;
  PythonServer(const PythonServer&) = delete;
  PythonServer& operator=(const PythonServer&) = delete;
  ~PythonServer() { Stop(); }

  // Runs `python3 <source dir>/tests/util/<script> args...` and returns the first line it prints ("" when
  // it printed none before exiting). REQUIRES: not running.
  std::string Start(const std::string& script, const std::vector<std::string>& args) {
    std::vector<std::string> argv_s = {"python3", std::string(SFTCTL_SOURCE_DIR) + "/tests/util/" + script};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    int p[2];
    if (::pipe(p) != 0) return "";
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ > 0) ::setpgid(pid_, pid_);
    if (pid_ == 0) {
#if defined(__linux__)
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
      if (::getppid() != parent) ::_exit(127);  // the test died before the signal was armed
      ::setpgid(0, 0);
      ::dup2(p[1], 1);
      ::close(p[0]);
      ::close(p[1]);
      std::vector<char*> argv;
      for (std::string& a : argv_s) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("python3", argv.data());
      ::_exit(127);
    }
    ::close(p[1]);
    std::string line;
    if (FILE* out = ::fdopen(p[0], "r")) {
      for (int c; (c = std::fgetc(out)) != EOF && c != '\n';) line.push_back(static_cast<char>(c));
      std::fclose(out);
    } else {
      ::close(p[0]);
    }
    return line;
  }

  // SIGTERM to its group, the server reaped, then SIGKILL to what is left of the group. Nothing when
  // not running.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
    ::kill(-pid_, SIGKILL);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// The JSON objects of a request log, one per non-empty line, oldest first.
inline std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

}  // namespace sftctl::testing
