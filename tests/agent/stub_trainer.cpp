// A stand-in for sftctl-trainer used by the agent tests and benchmarks. It follows the trainer contract
// (`train --spec <job_dir>/spec.json --events-fd 3`, JSON events on fd 3, checkpoint-<step>/DONE under
// output_dir, resume from the newest complete checkpoint) and misbehaves on request. Its spec is a valid
// job spec (the agent validates every spec it takes): the requests are the object model.config.stub
// (a from-scratch model's config, which the agent passes on as it is; agent_test_util.h StubSpec):
//   mode: "normal" (default) | "sleep" (steps forever) | "hang" (stops emitting after hang_after steps)
//         | "crash" (rank crash_rank exits exit_code at step crash_at; with crash_once only on a fresh start)
//   steps, step_ms, model_bytes, checkpoint_every, log_lines (extra stdout lines per step),
//   bulk_lines (print this many stdout lines at start; bulk_line_bytes pads each to that length),
//   ignore_term, spawn_child,
//   print_env (variable names: prints "envvar NAME=value" or "envvar NAME unset"),
//   extra_events, last_events (JSON values emitted on the event stream as they are, after "start" and
//   before "done": malformed records)
// With model.path instead (a model folder; then nothing is requested, every request has its default),
// it reads the folder as the trainer would, printing "entry <relative path> <content>" for each file in
// it ("<N bytes>" instead of a content over 4 KiB).
// At start it prints its distributed environment: "env RANK=.. WORLD_SIZE=.. LOCAL_RANK=..
// LOCAL_WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.." and emits {"event":"start","rank":..,"world_size":..}.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/util/file_util.h"

namespace fs = std::filesystem;

static FILE* g_events = nullptr;

static void Emit(const nlohmann::json& j) {
  if (!g_events) return;
  std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), g_events);
  std::fflush(g_events);
}

static void WriteCheckpoint(const std::string& out, int step, long long model_bytes) {
  char name[64];
  std::snprintf(name, sizeof(name), "checkpoint-%06d", step);
  fs::path dir = fs::path(out) / name;
  fs::create_directories(dir);
  std::ofstream f(dir / "model.bin", std::ios::binary);
  unsigned long long x = 0x9E3779B97F4A7C15ULL ^ static_cast<unsigned long long>(step);
  std::string buf(1 << 16, '\0');
  for (long long left = model_bytes; left > 0;) {
    size_t n = static_cast<size_t>(std::min<long long>(left, static_cast<long long>(buf.size())));
    for (size_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      buf[i] = static_cast<char>(x);
    }
    f.write(buf.data(), static_cast<std::streamsize>(n));
    left -= static_cast<long long>(n);
  }
  f.close();
  std::ofstream(dir / "DONE") << "ok\n";
  Emit({{"event", "checkpoint"}, {"step", step}, {"path", name}});
}

static int NewestCheckpoint(const std::string& out) {
  int best = 0;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(out, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind("checkpoint-", 0) == 0 && fs::exists(e.path() / "DONE"))
      best = std::max(best, std::atoi(n.c_str() + 11));
  }
  return best;
}

int main(int argc, char** argv) {
  std::string spec_path;
  int events_fd = -1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--spec") == 0) spec_path = argv[i + 1];
    if (std::strcmp(argv[i], "--events-fd") == 0) events_fd = std::atoi(argv[i + 1]);
  }
  if (argc < 2 || std::strcmp(argv[1], "train") != 0 || spec_path.empty()) {
    std::cerr << "usage: stub train --spec FILE --events-fd N\n";
    return 2;
  }
  if (events_fd >= 0) g_events = fdopen(events_fd, "w");
  nlohmann::json spec;
  try {
    std::ifstream f(spec_path);
    spec = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    Emit({{"event", "error"}, {"message", std::string("bad spec: ") + e.what()}});
    return 2;
  }
  const nlohmann::json::json_pointer stub_at("/model/config/stub");
  nlohmann::json stub = nlohmann::json::object();
  if (spec.contains(stub_at) && spec[stub_at].is_object()) stub = spec[stub_at];
  std::string mode = stub.value("mode", "normal");
  int steps = stub.value("steps", 5);
  int step_ms = stub.value("step_ms", 20);
  long long model_bytes = stub.value("model_bytes", 1024LL);
  int ckpt_every = stub.value("checkpoint_every", 0);
  int log_lines = stub.value("log_lines", 0);
  long long bulk_lines = stub.value("bulk_lines", 0LL);
  const size_t bulk_line_bytes = stub.value("bulk_line_bytes", 0);
  int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  std::string out = spec.value("output_dir", "run");
  fs::create_directories(out);
  if (stub.value("ignore_term", false)) ::signal(SIGTERM, SIG_IGN);
  if (stub.value("spawn_child", false)) {
    pid_t c = ::fork();
    if (c == 0) {
      for (;;) ::pause();
    }
  }
  int start = NewestCheckpoint(out);
  std::cout << "stub rank " << rank << " world "
            << (std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "?") << " CUDA_VISIBLE_DEVICES="
            << (std::getenv("CUDA_VISIBLE_DEVICES") ? std::getenv("CUDA_VISIBLE_DEVICES") : "")
            << " MASTER_PORT=" << (std::getenv("MASTER_PORT") ? std::getenv("MASTER_PORT") : "")
            << " resume_from=" << start << std::endl;
  auto env = [](const char* k) { return std::string(std::getenv(k) ? std::getenv(k) : ""); };
  std::cout << "env RANK=" << env("RANK") << " WORLD_SIZE=" << env("WORLD_SIZE")
            << " LOCAL_RANK=" << env("LOCAL_RANK") << " LOCAL_WORLD_SIZE=" << env("LOCAL_WORLD_SIZE")
            << " MASTER_ADDR=" << env("MASTER_ADDR") << " MASTER_PORT=" << env("MASTER_PORT") << std::endl;
  for (const auto& name : stub.value("print_env", nlohmann::json::array())) {
    const char* v = std::getenv(name.get<std::string>().c_str());
    std::cout << "envvar " << name.get<std::string>() << (v ? std::string("=") + v : std::string(" unset"))
              << std::endl;
  }
  const nlohmann::json::json_pointer model_at("/model/path");
  if (spec.contains(model_at) && spec[model_at].is_string() && !spec[model_at].get<std::string>().empty()) {
    const std::string dir = spec[model_at].get<std::string>();
    std::vector<std::string> lines;
    std::error_code ec;
    for (auto& e : fs::recursive_directory_iterator(dir, ec)) {
      if (!e.is_regular_file()) continue;
      std::string content = ::sftctl::testing::ReadWholeFile(e.path().string());
      if (content.size() > 4096) content = "<" + std::to_string(content.size()) + " bytes>";
      lines.push_back("entry " + e.path().lexically_relative(dir).string() + " " +
                      content);  // its name here, not its link target
    }
    std::sort(lines.begin(), lines.end());
    for (auto& l : lines) std::cout << l << std::endl;
  }
  std::cerr << "stub stderr line" << std::endl;
  Emit({{"event", "start"},
        {"rank", rank},
        {"world_size", std::atoi(env("WORLD_SIZE").empty() ? "1" : env("WORLD_SIZE").c_str())},
        {"resume_step", start}});
  for (const auto& e : stub.value("extra_events", nlohmann::json::array())) Emit(e);
  for (long long i = 0; i < bulk_lines; ++i) {
    std::string line = "bulk line " + std::to_string(i) + " of the log";
    if (line.size() < bulk_line_bytes) line.resize(bulk_line_bytes, 'x');
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
  for (int step = start + 1; mode == "sleep" || step <= steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    if (mode == "hang" && step > stub.value("hang_after", 1)) {
      for (;;) ::pause();
    }
    if (mode == "crash" && rank == stub.value("crash_rank", 0) && step == stub.value("crash_at", 2) &&
        !(stub.value("crash_once", false) && start > 0)) {
      std::cerr << "stub crashing at step " << step << std::endl;
      Emit({{"event", "error"}, {"message", "stub crash at step " + std::to_string(step)}});
      return stub.value("exit_code", 3);
    }
    Emit({{"event", "step"}, {"step", step}, {"loss", 1.0 / step}, {"lr", 1e-4}, {"tokens_per_s", 1000.0}});
    std::cout << "step " << step << std::endl;
    for (int l = 0; l < log_lines; ++l) std::cout << "log line " << l << " of step " << step << "\n";
    if (rank == 0 && ckpt_every > 0 && step % ckpt_every == 0 && step < steps)
      WriteCheckpoint(out, step, 1024);
  }
  if (rank == 0) WriteCheckpoint(out, steps, model_bytes);
  for (const auto& e : stub.value("last_events", nlohmann::json::array())) Emit(e);
  Emit({{"event", "done"}, {"steps", steps}});
  std::cout << "stub done" << std::endl;
  return 0;
}
