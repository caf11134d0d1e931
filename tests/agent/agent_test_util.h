// Helpers for the agent tests: temporary dirs, a real `sftd` child process, gRPC calls with a token,
// poll-with-deadline waits (no fixed sleeps as assertions), and bystander processes that tell at once
// whether anything signalled them.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sftctl/v1/agent.grpc.pb.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl::agent::testing {

namespace v1 = ::sftctl::v1;
using namespace std::chrono_literals;

using ::sftctl::testing::Bin;
using ::sftctl::testing::CommandResult;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::RunForStdout;
// Removed with its contents at the end of the test.
using ::sftctl::testing::TempDir;

inline std::string SftdPath() { return Bin("sftd"); }
inline std::string StubPath() { return Bin("sftd-stub-trainer"); }

// Polling with a deadline: tests/util/wait_for.h; whole files: tests/util/file_util.h.
using ::sftctl::testing::kWaitTimeout;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::WaitFor;
using ::sftctl::testing::WriteWholeFile;

inline bool ProcessAlive(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return false;
  std::string line;
  std::getline(f, line);
  size_t rp = line.rfind(')');
  return rp != std::string::npos && rp + 2 < line.size() && line[rp + 2] != 'Z';
}

// A bystander: `argv` started (PATH lookup) with every signal blocked but SIGKILL and SIGSTOP, which
// cannot be. A signal sent to it then stays pending instead of racing its death, so NoSignalReached
// can tell at once, with no waiting, whether anything signalled it. -1 when it could not start. The
// caller kills (SIGKILL) and reaps it.
inline pid_t SpawnBystander(std::vector<std::string> argv) {
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  posix_spawnattr_t attr;
  sigset_t all;
  sigfillset(&all);
  pid_t pid = -1;
  if (posix_spawnattr_init(&attr) != 0) return -1;
  const bool ok = posix_spawnattr_setsigmask(&attr, &all) == 0 &&
                  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK) == 0 &&
                  posix_spawnp(&pid, args[0], nullptr, &attr, args.data(), environ) == 0;
  posix_spawnattr_destroy(&attr);
  return ok ? pid : -1;
}

// True when the bystander `pid` runs (not stopped, a zombie or exiting) and has no signal pending:
// a kill() of it with any signal but SIGSTOP (even SIGKILL, pending until the process dies) makes
// this false from the moment kill() returns. (A SIGSTOP is consumed as it stops the process: it
// shows only once the stop has happened.)
inline bool NoSignalReached(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string stat = ReadWholeFile(proc + "/stat");
  const size_t rp = stat.rfind(')');
  if (rp == std::string::npos) return false;
  std::istringstream fields(stat.substr(rp + 2));
  char state = 0;
  long ppid = 0, pgrp = 0, session = 0, tty = 0, tpgid = 0;
  unsigned long flags = 0;
  fields >> state >> ppid >> pgrp >> session >> tty >> tpgid >> flags;
  constexpr unsigned long kExiting = 0x4;  // PF_EXITING
  if (!fields || (state != 'S' && state != 'R' && state != 'D') || (flags & kExiting) != 0) return false;
  std::istringstream status(ReadWholeFile(proc + "/status"));
  int pending_lines = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigPnd:", 0) != 0 && line.rfind("ShdPnd:", 0) != 0) continue;
    if (line.find_first_not_of("0\t ", 7) != std::string::npos) return false;
    ++pending_lines;
  }
  return pending_lines == 2;
}

// Live processes whose process group is `pgid`.
inline std::vector<pid_t> GroupMembers(pid_t pgid) {
  std::vector<pid_t> out;
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    size_t rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream ss(line.substr(rp + 2));
    char state;
    long ppid, pgrp;
    ss >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != 'Z') out.push_back(std::stoi(name));
  }
  return out;
}

// A foreground `sftd start` child process.
class Agent {
 public:
  explicit Agent(std::string data_dir) : data_dir_(std::move(data_dir)) {}
  ~Agent() { Kill(); }

  // Starts sftd with test-friendly settings plus `extra` flags; parses its SFTD_READY line.
  ::testing::AssertionResult Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {SftdPath(),     "start", "--data-dir", data_dir_, "--port",      "0",
                                     "--kill-grace", "500ms", "--poll",     "20ms",    "--cpu-slots", "8"};
    bool has_gpus = false, has_trainer = false;
    for (auto& e : extra) {
      has_gpus |= e == "--gpus";
      has_trainer |= e == "--trainer";
    }
    if (!has_gpus) extra.insert(extra.end(), {"--gpus", "none"});
    if (!has_trainer) extra.insert(extra.end(), {"--trainer", StubPath()});
    args.insert(args.end(), extra.begin(), extra.end());
    // The environment: env_ first (their names replace ours), then ours.
    std::vector<std::string> env = env_;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('=')) + "=";
      bool replaced = false;
      for (const std::string& mine : env_) replaced |= mine.rfind(name, 0) == 0;
      if (!replaced) env.push_back(entry);
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return ::testing::AssertionFailure() << "pipe";
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) return ::testing::AssertionFailure() << "fork: " << std::strerror(errno);
    if (pid_ == 0) {
      // The agent dies with the test process, so a crashed test cannot leak it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(p[1], 1);
      if (!stderr_file_.empty()) {  // the agent's log, for tests that read it
        const int log = ::open(stderr_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (log >= 0) ::dup2(log, 2);
      }
      ::execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    ::close(p[1]);
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + kWaitTimeout;
    while (line.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{p[0], POLLIN, 0};
      if (::poll(&pfd, 1, 200) <= 0) continue;
      char buf[512];
      ssize_t n = ::read(p[0], buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    ::close(p[0]);
    if (line.rfind("SFTD_READY ", 0) != 0) {
      return ::testing::AssertionFailure() << "no ready line, got '" << line << "'";
    }
    ready_ = nlohmann::json::parse(line.substr(11));
    std::ifstream tf(ready_["token_file"].get<std::string>());
    std::getline(tf, token_);
    channel_ = grpc::CreateChannel(ready_["addr"].get<std::string>(), grpc::InsecureChannelCredentials());
    stub_ = v1::Agent::NewStub(channel_);
    return ::testing::AssertionSuccess();
  }

  // NAME=value entries added to (or replacing those of) the agent's environment from the next Start on.
  void set_env(std::vector<std::string> env) { env_ = std::move(env); }
  // Sends the agent's stderr (its log) to `path` (appended) from the next Start on.
  void set_stderr_file(std::string path) { stderr_file_ = std::move(path); }

  // SIGTERM and wait (graceful stop).
  void Stop() { Signal(SIGTERM); }
  // SIGKILL and wait (crash).
  void Kill() { Signal(SIGKILL); }

  pid_t pid() const { return pid_; }
  const nlohmann::json& ready() const { return ready_; }
  const std::string& token() const { return token_; }
  v1::Agent::Stub* stub() { return stub_.get(); }
  const std::string& data_dir() const { return data_dir_; }

  // A context with the bearer token and a deadline.
  std::unique_ptr<grpc::ClientContext> Ctx(std::chrono::seconds timeout = 60s) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", "Bearer " + token_);
    ctx->set_deadline(std::chrono::system_clock::now() + timeout);
    return ctx;
  }

  grpc::Status Submit(const nlohmann::json& spec, v1::Job* job, uint32_t gpus = 0, uint32_t cpu_ranks = 0,
                      uint32_t max_restarts = 0, uint32_t heartbeat_s = 0) {
    v1::SubmitJobRequest req;
    req.set_spec_json(spec.dump());
    req.set_gpus(gpus);
    req.set_cpu_ranks(cpu_ranks);
    req.set_max_restarts(max_restarts);
    req.set_heartbeat_timeout_s(heartbeat_s);
    return stub_->SubmitJob(Ctx().get(), req, job);
  }

  v1::Job Get(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    v1::Job job;
    grpc::Status s = stub_->GetJob(Ctx().get(), req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  // Waits until the job satisfies `pred`; returns the last seen job.
  v1::Job WaitJob(const std::string& id, const std::function<bool(const v1::Job&)>& pred) {
    v1::Job last;
    bool ok = WaitFor([&] {
      last = Get(id);
      return pred(last);
    });
    EXPECT_TRUE(ok) << "timed out; last state " << v1::JobState_Name(last.state()) << " reason '"
                    << last.reason() << "' step " << last.last_step();
    return last;
  }
  v1::Job WaitState(const std::string& id, v1::JobState state) {
    return WaitJob(id, [state](const v1::Job& j) { return j.state() == state; });
  }

  // All events after `after` (follow: until the job's final state).
  std::vector<v1::Event> Events(const std::string& id, uint64_t after, bool follow,
                                grpc::Status* status = nullptr) {
    v1::StreamEventsRequest req;
    req.set_job_id(id);
    req.set_after_seq(after);
    req.set_follow(follow);
    auto ctx = Ctx();
    auto reader = stub_->StreamEvents(ctx.get(), req);
    std::vector<v1::Event> out;
    v1::StreamEventsResponse msg;
    while (reader->Read(&msg)) {
      for (const auto& e : msg.events()) out.push_back(e);
    }
    grpc::Status s = reader->Finish();
    if (status)
      *status = s;
    else
      EXPECT_TRUE(s.ok()) << s.error_message();
    return out;
  }

 private:
  void Signal(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
  }

  std::string data_dir_;
  std::string stderr_file_;
  std::vector<std::string> env_;
  pid_t pid_ = 0;
  nlohmann::json ready_;
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Agent::Stub> stub_;
};

// Uploads `data` as one blob (sha256 of data) in a single stream; returns the RPC status.
inline grpc::Status UploadWhole(Agent& a, const std::string& sha256, const std::string& data) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + a.token());
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  v1::BlobStatus resp;
  auto writer = a.stub()->UploadBlob(&ctx, &resp);
  v1::UploadBlobRequest first;
  first.set_sha256(sha256);
  first.set_size(data.size());
  writer->Write(first);
  v1::UploadBlobRequest chunk;
  chunk.set_data(data);
  writer->Write(chunk);
  writer->WritesDone();
  return writer->Finish();
}

// A multi-node rendezvous for node `node_rank`.
inline v1::Rendezvous MakeRendezvous(uint32_t num_nodes, uint32_t node_rank, uint32_t world_size,
                                     uint32_t rank_offset, const std::string& group_id = "g1",
                                     const std::string& master_addr = "", uint32_t master_port = 0) {
  v1::Rendezvous r;
  r.set_num_nodes(num_nodes);
  r.set_node_rank(node_rank);
  r.set_world_size(world_size);
  r.set_rank_offset(rank_offset);
  r.set_group_id(group_id);
  r.set_master_addr(master_addr);
  r.set_master_port(master_port);
  return r;
}

// The lines a job's ranks printed to stdout, by rank.
inline std::map<int, std::vector<std::string>> StdoutByRank(const std::vector<v1::Event>& events) {
  std::map<int, std::vector<std::string>> out;
  for (const auto& e : events) {
    if (e.kind() == v1::Event::STDOUT) out[e.rank()].push_back(e.text());
  }
  return out;
}

// A job spec for the stub trainer (stub_trainer.cpp): a valid one, as the agent takes no other
// (agent/state/job_spec.h), with the stub's requests in model.config.stub.
inline nlohmann::json StubSpec(nlohmann::json stub) {
  nlohmann::json spec = nlohmann::json::object();
  spec["model"]["config"]["stub"] = std::move(stub);
  spec["data"]["train"] = nlohmann::json::array({"train.jsonl"});
  spec["output_dir"] = "ignored";
  return spec;
}

// Kills every process of a group (test cleanup).
inline void KillGroup(pid_t pgid) {
  if (pgid > 0) ::killpg(pgid, SIGKILL);
}

}  // namespace sftctl::agent::testing
