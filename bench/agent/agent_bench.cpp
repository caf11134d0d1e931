// agent_bench: measures the sftd agent against the targets of issue 4 and prints them side by side.
//   idle RSS and CPU of a freshly started agent (target RSS < 30 MB)
//   events/s through StreamEvents (replay of a finished job's journal, and live follow while it runs)
//   PullArtifact MB/s on loopback vs reading the same file locally (target ratio >= 0.8)
// Usage: agent_bench [--pull-mb N] [--events N] [--bin-dir DIR]
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/sha256.h"
#include "sftctl/v1/agent.grpc.pb.h"

namespace v1 = ::sftctl::v1;
using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

long RssKb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// utime + stime in clock ticks.
long CpuTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  std::istringstream ss(line.substr(line.rfind(')') + 2));
  std::string field;
  long ut = 0, st = 0;
  for (int i = 3; i <= 15; ++i) {
    ss >> field;
    if (i == 14) ut = std::atol(field.c_str());
    if (i == 15) st = std::atol(field.c_str());
  }
  return ut + st;
}

struct Agent {
  pid_t pid = 0;
  std::string token;
  std::unique_ptr<v1::Agent::Stub> stub;
  std::unique_ptr<grpc::ClientContext> Ctx() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->AddMetadata("authorization", "Bearer " + token);
    return c;
  }
  ~Agent() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

bool StartAgent(const std::string& bin, const std::string& dir, Agent* a) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return false;
  std::vector<std::string> args = {
      bin + "/sftd", "start",  "--data-dir", dir,         "--port",
      "0",           "--gpus", "none",       "--trainer", bin + "/sftd-stub-trainer"};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  a->pid = ::fork();
  if (a->pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(p[1], 1);
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 2);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  ::close(p[1]);
  std::string line;
  char c;
  while (::read(p[0], &c, 1) == 1 && c != '\n') line += c;
  ::close(p[0]);
  if (line.rfind("SFTD_READY ", 0) != 0) return false;
  auto j = nlohmann::json::parse(line.substr(11));
  std::ifstream tf(j["token_file"].get<std::string>());
  std::getline(tf, a->token);
  a->stub = v1::Agent::NewStub(
      grpc::CreateChannel(j["addr"].get<std::string>(), grpc::InsecureChannelCredentials()));
  return true;
}

v1::Job WaitFinal(Agent& a, const std::string& id) {
  for (;;) {
    v1::GetJobRequest r;
    r.set_job_id(id);
    v1::Job j;
    a.stub->GetJob(a.Ctx().get(), r, &j);
    if (j.state() == v1::SUCCEEDED || j.state() == v1::FAILED || j.state() == v1::CANCELLED) return j;
    std::this_thread::sleep_for(20ms);
  }
}

std::string Submit(Agent& a, const nlohmann::json& stub) {
  v1::SubmitJobRequest r;
  nlohmann::json spec = {{"output_dir", "x"}};  // a valid spec; the stub's requests in model.config.stub
  spec["model"]["config"]["stub"] = stub;
  spec["data"]["train"] = nlohmann::json::array({"train.jsonl"});
  r.set_spec_json(spec.dump());
  v1::Job j;
  grpc::Status s = a.stub->SubmitJob(a.Ctx().get(), r, &j);
  if (!s.ok()) {
    std::cerr << "submit: " << s.error_message() << "\n";
    std::exit(1);
  }
  return j.id();
}

uint64_t CountEvents(Agent& a, const std::string& id, bool follow) {
  v1::StreamEventsRequest r;
  r.set_job_id(id);
  r.set_follow(follow);
  auto ctx = a.Ctx();
  auto reader = a.stub->StreamEvents(ctx.get(), r);
  v1::StreamEventsResponse m;
  uint64_t n = 0;
  while (reader->Read(&m)) n += static_cast<uint64_t>(m.events_size());
  reader->Finish();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string bin = SFTCTL_BIN_DIR;
  long pull_mb = 512;
  long events = 300000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--pull-mb")) pull_mb = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--events")) events = std::atol(argv[i + 1]);
    if (!std::strcmp(argv[i], "--bin-dir")) bin = argv[i + 1];
  }
  std::string dir =
      (std::filesystem::temp_directory_path() / ("sftd-bench-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  {
    Agent a;
    if (!StartAgent(bin, dir, &a)) {
      std::cerr << "cannot start sftd from " << bin << "\n";
      return 1;
    }
    // --- idle ---
    std::this_thread::sleep_for(1s);
    long rss0 = RssKb(a.pid);
    long t0 = CpuTicks(a.pid);
    auto w0 = SteadyClock::now();
    std::this_thread::sleep_for(5s);
    double idle_cpu = 100.0 * static_cast<double>(CpuTicks(a.pid) - t0) /
                      static_cast<double>(sysconf(_SC_CLK_TCK)) / Seconds(w0, SteadyClock::now());

    // --- events ---
    auto e0 = SteadyClock::now();
    std::string ev_job = Submit(a, {{"steps", 1}, {"step_ms", 1}, {"bulk_lines", events}});
    uint64_t live = CountEvents(a, ev_job, /*follow=*/true);
    double live_s = Seconds(e0, SteadyClock::now());
    WaitFinal(a, ev_job);
    auto r0 = SteadyClock::now();
    uint64_t replayed = CountEvents(a, ev_job, /*follow=*/false);
    double replay_s = Seconds(r0, SteadyClock::now());

    // --- pull vs local read ---
    std::string pj = Submit(a, {{"steps", 1}, {"step_ms", 1}, {"model_bytes", pull_mb << 20}});
    v1::Job pjob = WaitFinal(a, pj);
    std::string rel = "run/checkpoint-000001/model.bin";
    std::string local = pjob.job_dir() + "/" + rel;
    v1::ListArtifactsRequest lr;
    lr.set_job_id(pj);
    v1::ListArtifactsResponse list;
    auto h0 = SteadyClock::now();
    a.stub->ListArtifacts(a.Ctx().get(), lr, &list);  // computes and caches the sha256
    double hash_s = Seconds(h0, SteadyClock::now());
    auto pull = [&](bool verify) {
      v1::PullArtifactRequest r;
      r.set_job_id(pj);
      r.set_path(rel);
      auto ctx = a.Ctx();
      auto t = SteadyClock::now();
      auto reader = a.stub->PullArtifact(ctx.get(), r);
      v1::ArtifactChunk c;
      uint64_t bytes = 0;
      std::string want;
      sftctl::Sha256 h;
      while (reader->Read(&c)) {
        if (c.offset() == 0) want = c.sha256();
        bytes += c.data().size();
        if (verify) h.Update(c.data());
      }
      grpc::Status s = reader->Finish();
      double secs = Seconds(t, SteadyClock::now());
      if (!s.ok() || bytes != static_cast<uint64_t>(pull_mb) << 20 || (verify && h.HexDigest() != want)) {
        std::cerr << "pull failed: " << s.error_message() << "\n";
        std::exit(1);
      }
      return static_cast<double>(bytes) / (1 << 20) / secs;
    };
    auto local_read = [&](bool hash) {
      int fd = ::open(local.c_str(), O_RDONLY);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // as the agent does
      std::vector<char> buf(1 << 20);
      uint64_t bytes = 0;
      sftctl::Sha256 h;
      auto t = SteadyClock::now();
      ssize_t n;
      while ((n = ::read(fd, buf.data(), buf.size())) > 0) {
        bytes += static_cast<uint64_t>(n);
        if (hash) h.Update(buf.data(), static_cast<size_t>(n));
      }
      double secs = Seconds(t, SteadyClock::now());
      ::close(fd);
      if (hash) (void)h.HexDigest();
      return static_cast<double>(bytes) / (1 << 20) / secs;
    };
    // Cold: drop the file's pages from the page cache (clean pages, no root needed), then read.
    auto drop_cache = [&] {
      int fd = ::open(local.c_str(), O_RDONLY);
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    };
    drop_cache();
    double local_cold = local_read(false);
    drop_cache();
    double pull_cold = pull(false);
    drop_cache();
    local_cold = std::max(local_cold, local_read(false));
    drop_cache();
    pull_cold = std::max(pull_cold, pull(false));
    pull(false);  // warm-up (page cache, connection)
    double pull_raw = std::max({pull(false), pull(false), pull(false)});
    double pull_verified = std::max(pull(true), pull(true));
    double local_raw = std::max({local_read(false), local_read(false), local_read(false)});
    double local_hashed = std::max(local_read(true), local_read(true));
    long rss1 = RssKb(a.pid);

    std::printf("sftd agent benchmark (%u CPUs)\n", std::thread::hardware_concurrency());
    std::printf("%-44s %14s %14s\n", "metric", "measured", "target");
    std::printf("%-44s %11.1f MB %11s\n", "idle RSS", static_cast<double>(rss0) / 1024, "< 30 MB");
    std::printf("%-44s %12.2f %% %14s\n", "idle CPU (5 s)", idle_cpu, "~0");
    std::printf("%-44s %11.1f MB %14s\n", "RSS after the runs below", static_cast<double>(rss1) / 1024, "");
    std::printf("%-44s %12.0f/s %14s\n", "events/s live follow (ingest + stream)",
                static_cast<double>(live) / live_s, "");
    std::printf("%-44s %12.0f/s %14s\n", "events/s StreamEvents replay",
                static_cast<double>(replayed) / replay_s, "");
    std::printf("%-44s %10.0f MB/s %14s\n", "first sha256 of artifact (ListArtifacts)",
                static_cast<double>(pull_mb) / hash_s, "");
    std::printf("%-44s %10.0f MB/s %14s\n", "hot cache: PullArtifact (loopback gRPC)", pull_raw, "");
    std::printf("%-44s %10.0f MB/s %14s\n", "hot cache: local read(2), 1 MiB buffers", local_raw, "");
    std::printf("%-44s %13.2fx %14s\n", "hot cache: ratio pull / local read", pull_raw / local_raw, "");
    std::printf("%-44s %10.0f MB/s %14s\n", "cold cache: PullArtifact", pull_cold, "");
    std::printf("%-44s %10.0f MB/s %14s\n", "cold cache: local read(2) (disk)", local_cold, "");
    std::printf("%-44s %13.2fx %14s\n", "cold cache: ratio pull / local disk read", pull_cold / local_cold,
                ">= 0.8x");
    std::printf("%-44s %10.0f MB/s %14s\n", "PullArtifact + client sha256 verify", pull_verified, "");
    std::printf("%-44s %10.0f MB/s %14s\n", "local read + sha256", local_hashed, "");
    std::printf("%-44s %13.2fx %14s\n", "ratio verified pull / hashed local read",
                pull_verified / local_hashed, "");
    std::printf("(events: %llu live, %llu replayed; pull file %ld MiB)\n",
                static_cast<unsigned long long>(live), static_cast<unsigned long long>(replayed), pull_mb);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
