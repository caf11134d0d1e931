// Helpers for the remote-command e2e tests: temp dirs, running the real sftctl with its own HOME and
// XDG_CONFIG_HOME (stdout and stderr kept apart, so --json output parses), background runs, a tiny
// CPU job spec, and file checks. No fixed sleeps: waits poll with a deadline.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/sha256.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl::remotetest {

using namespace std::chrono_literals;

using ::sftctl::testing::Bin;
using ::sftctl::testing::CommandResult;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::TempDir;

// Files and waits: tests/util/file_util.h, tests/util/wait_for.h.
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::WaitFor;
using ::sftctl::testing::WriteWholeFile;

struct Result {
  int exit_code = -1;
  std::string out, err;
  // stdout as one JSON object (the last non-empty line), or null.
  nlohmann::json Json() const {
    std::istringstream ss(out);
    std::string line, last;
    while (std::getline(ss, line)) {
      if (!line.empty()) last = line;
    }
    return nlohmann::json::parse(last, nullptr, false);
  }
  // Every stdout line as JSON.
  std::vector<nlohmann::json> JsonLines() const {
    std::vector<nlohmann::json> v;
    std::istringstream ss(out);
    std::string line;
    while (std::getline(ss, line)) {
      if (!line.empty()) v.push_back(nlohmann::json::parse(line, nullptr, false));
    }
    return v;
  }
  std::string All() const {
    return "exit " + std::to_string(exit_code) + "\nstdout:\n" + out + "\nstderr:\n" + err;
  }
};

// The environment sftctl runs with: HOME and XDG_CONFIG_HOME under `home`.
class Sftctl {
 public:
  explicit Sftctl(std::string home) : home_(std::move(home)) {}
  const std::string& home() const { return home_; }
  std::string registry() const { return home_ + "/config/sftctl/jobs.json"; }

  // Starts sftctl ARGS with stdout/stderr to files; returns the pid.
  pid_t Spawn(const std::vector<std::string>& args, const std::string& out_file,
              const std::string& err_file) const {
    std::vector<std::string> argv = {Bin("sftctl")};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::setenv("HOME", home_.c_str(), 1);
      ::setenv("XDG_CONFIG_HOME", (home_ + "/config").c_str(), 1);
      int in = ::open("/dev/null", O_RDONLY);
      int o = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int e = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(in, 0);
      ::dup2(o, 1);
      ::dup2(e, 2);
      std::vector<char*> v;
      for (auto& a : argv) v.push_back(a.data());
      v.push_back(nullptr);
      ::execv(v[0], v.data());
      ::_exit(127);
    }
    return pid;
  }

  static int Wait(pid_t pid) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Waits for a Spawn()ed command and reads what it wrote to `out` and `err`.
  static Result Finish(pid_t pid, const std::string& out, const std::string& err) {
    Result r;
    r.exit_code = Wait(pid);
    r.out = ReadWholeFile(out);
    r.err = ReadWholeFile(err);
    return r;
  }

  Result Run(const std::vector<std::string>& args) const {
    const std::string out = home_ + "/.run-out", err = home_ + "/.run-err";
    return Finish(Spawn(args, out, err), out, err);
  }

 private:
  std::string home_;
};

// Prompt/completion lines "What is i+1?" -> "i+1".
inline std::string AdditionJsonl(int n, int start = 0) {
  std::string s;
  for (int i = start; i < start + n; ++i) {
    s += "{\"prompt\": \"What is " + std::to_string(i) + "+1?\\n\", \"completion\": \"" +
         std::to_string(i + 1) + "\"}\n";
  }
  return s;
}

// A tiny CPU job in `dir`: job.yaml + data/{train,eval}.jsonl. Returns the spec path.
inline std::string WriteTinyJob(const std::string& dir, int steps, int checkpoint_interval = 0) {
  WriteWholeFile(dir + "/data/train.jsonl", AdditionJsonl(48));
  WriteWholeFile(dir + "/data/eval.jsonl", AdditionJsonl(8, 1000));
  std::string yaml =
      "name: tiny\n"
      "tokenizer: byte\n"
      "precision: fp32\n"
      "device: cpu\n"
      "threads: 1\n"
      "model:\n"
      "  config: {model_type: llama, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,\n"
      "           num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}\n"
      "data:\n"
      "  train: data/train.jsonl\n"
      "  eval: data/eval.jsonl\n"
      "  max_seq_len: 32\n"
      "train:\n"
      "  batch_size: 4\n"
      "  max_steps: " +
      std::to_string(steps) +
      "\n"
      "  log_interval: 1\n"
      "checkpoint:\n"
      "  interval: " +
      std::to_string(checkpoint_interval) +
      "\n"
      "  keep: 3\n";
  WriteWholeFile(dir + "/job.yaml", yaml);
  return dir + "/job.yaml";
}

inline std::string Sha(const std::string& path) {
  auto s = Sha256File(path);
  return s.ok() ? *s : "missing:" + path;
}

// Every regular file under `dir`, relative, sorted.
inline std::vector<std::string> ListFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(std::filesystem::relative(e.path(), dir).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Width and height from a PNG's IHDR, or {0, 0} when `data` is not a PNG.
inline std::pair<uint32_t, uint32_t> PngSize(const std::string& data) {
  static const char kSig[] = "\x89PNG\r\n\x1a\n";
  if (data.size() < 24 || data.compare(0, 8, std::string(kSig, 8)) != 0 || data.compare(12, 4, "IHDR") != 0) {
    return {0, 0};
  }
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(static_cast<unsigned char>(data[at])) << 24) |
           (static_cast<uint32_t>(static_cast<unsigned char>(data[at + 1])) << 16) |
           (static_cast<uint32_t>(static_cast<unsigned char>(data[at + 2])) << 8) |
           static_cast<uint32_t>(static_cast<unsigned char>(data[at + 3]));
  };
  return {be32(16), be32(20)};
}

// The seqs of a `logs --json` output, checked to be 1..N exactly once. Returns N, or -1 on a gap or
// duplicate (with `why` set).
inline int64_t CheckSeqs(const std::vector<nlohmann::json>& lines, std::string* why) {
  int64_t expect = 1;
  for (const auto& j : lines) {
    if (!j.is_object() || !j.contains("seq")) continue;
    const int64_t seq = j["seq"].get<int64_t>();
    if (seq != expect) {
      *why = "seq " + std::to_string(seq) + " where " + std::to_string(expect) + " was expected";
      return -1;
    }
    ++expect;
  }
  return expect - 1;
}

}  // namespace sftctl::remotetest
