// A fake Hugging Face Hub for tests: tests/util/fake_hub.py (python3) on two 127.0.0.1 ports, the
// Hub and its "CDN", started by FakeHub::Start with a config (see the script for its fields and the
// API it serves) and stopped (SIGTERM, reaped) when the object goes away. Log() returns the requests
// it served, oldest first, each a JSON object: port, method, path, auth, range, status, bytes.
// One thread at a time.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sftctl::testing {

class FakeHub {
 public:
  FakeHub() = default;
  FakeHub(const FakeHub&) = delete;
  FakeHub& operator=(const FakeHub&) = delete;
  ~FakeHub() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  // Writes `config` to <dir>/hub.json and starts the server; false when it did not print its ports.
  bool Start(const std::string& dir, const nlohmann::json& config) {
    const std::string config_path = dir + "/hub.json";
    log_path_ = dir + "/hub-log.jsonl";
    std::ofstream(config_path) << config.dump();
    int p[2];
    if (::pipe(p) != 0) return false;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(p[1], 1);
      ::close(p[0]);
      ::close(p[1]);
      const std::string script = std::string(SFTCTL_SOURCE_DIR) + "/tests/util/fake_hub.py";
      ::execlp("python3", "python3", script.c_str(), config_path.c_str(), log_path_.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(p[1]);
    FILE* out = ::fdopen(p[0], "r");
    int hub = 0, cdn = 0;
    const bool ok = out != nullptr && std::fscanf(out, "PORTS %d %d", &hub, &cdn) == 2;
    if (out != nullptr) std::fclose(out);
    if (!ok) return false;
    url_ = "http://127.0.0.1:" + std::to_string(hub);
    cdn_port_ = cdn;
    return true;
  }

  // "http://127.0.0.1:<hub port>" (HF_ENDPOINT).
  const std::string& url() const { return url_; }
  int cdn_port() const { return cdn_port_; }

  std::vector<nlohmann::json> Log() const {
    std::vector<nlohmann::json> out;
    std::ifstream in(log_path_);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }

  // Body bytes the CDN port served (content of LFS files).
  uint64_t CdnBytes() const {
    uint64_t n = 0;
    for (const auto& e : Log())
      if (e["port"] == "cdn") n += e["bytes"].get<uint64_t>();
    return n;
  }

 private:
  pid_t pid_ = -1;
  std::string url_, log_path_;
  int cdn_port_ = 0;
};

}  // namespace sftctl::testing
