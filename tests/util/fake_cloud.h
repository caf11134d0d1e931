// A fake GPU cloud API for tests: tests/util/fake_cloud.py (python3) on a 127.0.0.1 port, speaking
// Lambda Cloud API v1 or RunPod REST API v2, started by FakeCloud::Start with a config (see the script
// for its fields, flags and the instance-command contract) and stopped (SIGTERM, which also ends the
// instances' process groups; reaped) when the object goes away. Log() returns the requests it served,
// oldest first, each a JSON object: method, path, status, auth (whether an Authorization header came).
// State() and AddOrphan() use its /_fake/ endpoints. One thread at a time.
#pragma once

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/net/http_client.h"
#include "tests/util/python_server.h"

namespace sftctl::testing {

class FakeCloud {
 public:
  FakeCloud() = default;
  FakeCloud(const FakeCloud&) = delete;
  FakeCloud& operator=(const FakeCloud&) = delete;
  ~FakeCloud() { Stop(); }

  // Writes `config` to <dir>/cloud-<dialect>.json and starts the server with `--dialect dialect
  // --api-key api_key` and `extra_args` (e.g. "--no-launch-limit", "--instance-command", CMD); its
  // state folder is <dir>/cloud-state. False when it did not print its port.
  bool Start(const std::string& dir, const std::string& dialect, const std::string& api_key,
             const nlohmann::json& config, const std::vector<std::string>& extra_args = {}) {
    dialect_ = dialect;
    const std::string config_path = dir + "/cloud-" + dialect + ".json";
    log_path_ = dir + "/cloud-" + dialect + "-log.jsonl";
    std::ofstream(config_path) << config.dump();
    std::vector<std::string> args = {"--dialect", dialect, "--api-key", api_key,       "--config",
                                     config_path, "--log", log_path_,   "--state-dir", dir + "/cloud-state"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    int port = 0;
    if (std::sscanf(server_.Start("fake_cloud.py", args).c_str(), "PORT %d", &port) != 1) return false;
    base_url_ = "http://127.0.0.1:" + std::to_string(port);
    return true;
  }

  void Stop() { server_.Stop(); }

  // "http://127.0.0.1:<port>".
  const std::string& base_url() const { return base_url_; }
  // The profile's api_url: base_url() + "/api/v1" (lambda) or base_url() (runpod).
  std::string api_url() const { return dialect_ == "lambda" ? base_url_ + "/api/v1" : base_url_; }

  std::vector<nlohmann::json> Log() const { return ReadJsonLines(log_path_); }
  // The logged requests with this method whose path starts with `path_prefix`.
  std::vector<nlohmann::json> Requests(const std::string& method, const std::string& path_prefix) const {
    std::vector<nlohmann::json> out;
    for (auto& e : Log())
      if (e["method"] == method && e["path"].get<std::string>().rfind(path_prefix, 0) == 0) out.push_back(e);
    return out;
  }

  // GET /_fake/state (null on failure).
  nlohmann::json State() const {
    HttpRequest req;
    req.url = base_url_ + "/_fake/state";
    auto r = CurlHttpClient()->Send(req);
    if (!r.ok() || r->status != 200) return nullptr;
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  // POST /_fake/orphan: a running instance the client did not launch; its id ("" on failure).
  std::string AddOrphan(const std::string& name) {
    HttpRequest req;
    req.method = "POST";
    req.url = base_url_ + "/_fake/orphan";
    req.body = nlohmann::json({{"name", name}}).dump();
    auto r = CurlHttpClient()->Send(req);
    if (!r.ok() || r->status != 200) return "";
    nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
    return j.is_object() && j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>() : "";
  }

 private:
  PythonServer server_;
  std::string dialect_, base_url_, log_path_;
};

}  // namespace sftctl::testing
