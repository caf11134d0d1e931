// A fake Hugging Face Hub for tests: tests/util/fake_hub.py (python3) on two 127.0.0.1 ports, the
// Hub and its "CDN", started by FakeHub::Start with a config (see the script for its fields and the
// API it serves) and stopped (SIGTERM, reaped) when the object goes away. Log() returns the requests
// it served, oldest first, each a JSON object: port, method, path, auth, range, status, bytes.
// One thread at a time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/util/python_server.h"

namespace sftctl::testing {

class FakeHub {
 public:
  FakeHub() = default;
  FakeHub(const FakeHub&) = delete;
  FakeHub& operator=(const FakeHub&) = delete;
  // Writes `config` to <dir>/hub.json and starts the server; false when it did not print its ports.
  bool Start(const std::string& dir, const nlohmann::json& config) {
    const std::string config_path = dir + "/hub.json";
    log_path_ = dir + "/hub-log.jsonl";
    std::ofstream(config_path) << config.dump();
    int hub = 0, cdn = 0;
    const std::string ports = server_.Start("fake_hub.py", {config_path, log_path_});
    if (std::sscanf(ports.c_str(), "PORTS %d %d", &hub, &cdn) != 2) return false;
    url_ = "http://127.0.0.1:" + std::to_string(hub);
    cdn_port_ = cdn;
    return true;
  }

  // "http://127.0.0.1:<hub port>" (HF_ENDPOINT).
  const std::string& url() const { return url_; }
  int cdn_port() const { return cdn_port_; }

  std::vector<nlohmann::json> Log() const { return ReadJsonLines(log_path_); }

  // Body bytes the CDN port served (content of LFS files).
  uint64_t CdnBytes() const {
    uint64_t n = 0;
    for (const auto& e : Log())
      if (e["port"] == "cdn") n += e["bytes"].get<uint64_t>();
    return n;
  }

 private:
  PythonServer server_;
  std::string url_, log_path_;
  int cdn_port_ = 0;
};

}  // namespace sftctl::testing
