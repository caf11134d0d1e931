// The multi-rank test harness of tests/trainer/distributed_test.cpp and zero_test.cpp: the real
// sftctl-trainer launched as W rank processes on 127.0.0.1 (Gloo), and the helpers that compare
// their runs (events, weights).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/trainer/test_util.h"
#include "tests/util/file_util.h"
#include "tests/util/test_paths.h"
#include "tests/util/wait_for.h"
#include "trainer/distributed/distributed.h"
#include "trainer/runtime/tensor_io.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer::testing {

using ::sftctl::testing::ReadMetrics;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::TinySpec;
using ::sftctl::testing::WaitFor;

inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct Rank {
  pid_t pid = -1;
  std::string log;     // stderr + stdout
  std::string events;  // --events-fd 3
};

// The trainer a test launches by default: the shipped one.
inline constexpr char kShippedTrainer[] = "sftctl-trainer";
// The shipped command line whose first checkpoint takes SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S seconds
// longer (tests/trainer/slow_checkpoint_trainer.cpp).
inline constexpr char kSlowCheckpointTrainer[] = "sftctl_trainer_slow_checkpoint";

// Writes the spec to <dir>/spec-<tag>.json and starts one `program` (a trainer in the build's bin/)
// per rank (world 1: no distributed variables at all). Each rank gets 1 thread, its own TMPDIR and
// an events file, and `extra_env` ("NAME=value") besides.
inline std::vector<Rank> Launch(const JobSpec& spec, int world, const std::string& tag,
                                const std::vector<std::string>& extra_env = {},
                                const std::string& program = kShippedTrainer) {
  const std::string dir = std::filesystem::path(spec.output_dir).parent_path().string();
  const std::string spec_path = dir + "/spec-" + tag + ".json";
  sftctl::testing::WriteWholeFile(spec_path, ToJson(spec).dump(2));
  const int port = FreePort();
  std::vector<Rank> ranks(world);
  for (int r = 0; r < world; ++r) {
    Rank& k = ranks[r];
    k.log = dir + "/" + tag + "-rank" + std::to_string(r) + ".log";
    k.events = dir + "/" + tag + "-rank" + std::to_string(r) + ".events";
    const std::string tmp = dir + "/tmp-" + tag + "-rank" + std::to_string(r);
    std::filesystem::create_directories(tmp);
    std::vector<std::string> env = {"PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "OMP_NUM_THREADS=1"};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    if (world > 1) {
      env.insert(env.end(), {"WORLD_SIZE=" + std::to_string(world), "RANK=" + std::to_string(r),
                             "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                             "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)});
    }
    const std::string bin = std::string(SFTCTL_BIN_DIR) + "/" + program;
    std::vector<std::string> args = {bin, "train", "--spec", spec_path, "--events-fd", "3"};
    k.pid = ::fork();
    if (k.pid == 0) {
      int log = ::open(k.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int ev = ::open(k.events.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(log, 1);
      ::dup2(log, 2);
      ::dup2(ev, 3);
      std::vector<char*> argv, envp;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      for (auto& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);
      ::execve(bin.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
  }
  return ranks;
}

// Waits for `pid` up to `limit`; returns its exit code (128 + signal when killed), or -1 after
// killing it when it overran.
inline int WaitExit(pid_t pid, std::chrono::seconds limit) {
  int status = 0;
  if (!WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, limit)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

// Runs a job to completion; every rank must exit 0.
inline void RunJob(const JobSpec& spec, int world, const std::string& tag) {
  auto ranks = Launch(spec, world, tag);
  for (int r = 0; r < world; ++r) {
    const int code = WaitExit(ranks[r].pid, std::chrono::seconds(240));
    ASSERT_EQ(code, 0) << tag << " rank " << r << ":\n" << ReadWholeFile(ranks[r].log);
  }
}

// A spec for process tests: 1 thread per rank, fp32, no eval unless asked.
inline JobSpec ProcSpec(const std::string& dir, int64_t steps, int64_t batch, int64_t accum) {
  JobSpec s = TinySpec(dir, steps);
  s.threads = 1;
  s.train.batch_size = batch;
  s.train.grad_accum = accum;
  s.distributed.timeout_s = 20;
  s.distributed.bucket_mb = 0.01;  // ~2600 values: the tiny model's gradients span several buckets
  return s;
}

inline std::vector<nlohmann::json> Events(const std::string& path, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& r : ReadMetrics(path))
    if (r["event"] == kind) out.push_back(r);
  return out;
}

inline double MaxRelDiff(const NamedTensors& a, const std::map<std::string, torch::Tensor>& b,
                         std::string* worst) {
  double m = 0;
  for (const auto& [name, t] : a) {
    const torch::Tensor& u = b.at(name);
    const double rel = (t - u).norm().item<double>() / (u.norm().item<double>() + 1e-30);
    if (rel > m) m = rel, *worst = name;
  }
  return m;
}

inline std::map<std::string, torch::Tensor> Weights(const std::string& checkpoint) {
  auto w = LoadTensors(checkpoint + "/model.safetensors");
  EXPECT_TRUE(w.ok()) << checkpoint << ": " << w.status().ToString();
  return w.ok() ? *w : std::map<std::string, torch::Tensor>();
}

}  // namespace sftctl::trainer::testing

// CPU ranks need Gloo. A LibTorch laid out like a pip wheel (no gloo headers; the Debian 13 root of
// tests/portability) has none: those tests are skipped there, and the clear error is tested instead.
#define SFTCTL_SKIP_WITHOUT_GLOO()                                                 \
  if (!GlooAvailable())                                                            \
  GTEST_SKIP() << "this trainer was built without Gloo (no gloo headers, as in a " \
                  "pip wheel): multi-rank CPU training cannot run here"
