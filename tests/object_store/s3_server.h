// A real S3-compatible server for tests: moto_server (Debian's python3-moto, installed by
// deploy/install-deps.sh) on a free 127.0.0.1 port, started and stopped by
// tests/object_store/s3_server.sh. Strict mode (the default) checks every SigV4 signature against an
// IAM key made at start; each server starts empty. The server is stopped (its pid only) when the
// object goes away. One thread at a time.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "common/object_store/s3_client.h"
#include "common/os/process_util.h"
#include "tests/util/command.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl::testing {

class S3Server {
 public:
  S3Server() = default;
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;
  ~S3Server() {
    if (started_) RunCommand({Script(), "stop", dir_.path()});
  }

  // "" on success, else the script's output (what went wrong).
  std::string Start(bool strict = true) {
    CommandResult r;
    for (int attempt = 0; attempt < 3; ++attempt) {  // another process may take the free port first
      r = RunCommand(
          {Script(), "start", dir_.path(), std::to_string(FreeTcpPort()), strict ? "strict" : "lenient"});
      if (r.exit_code == 0) break;
    }
    if (r.exit_code != 0) return r.output.empty() ? "s3_server.sh start failed" : r.output;
    started_ = true;
    std::ifstream in(dir_.path() + "/env");
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      if (eq != std::string::npos) env_[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return env_.count("S3_ENDPOINT") ? "" : "no S3_ENDPOINT in " + dir_.path() + "/env";
  }

  const std::string& endpoint() { return env_["S3_ENDPOINT"]; }
  const std::string& access_key() { return env_["AWS_ACCESS_KEY_ID"]; }
  const std::string& secret_key() { return env_["AWS_SECRET_ACCESS_KEY"]; }
  // A key whose every PutObject the server refuses (403 AccessDenied; reads, lists and deletes pass):
  // uploads refused as by a full quota. Strict mode only.
  const std::string& refused_access_key() { return env_["S3_REFUSED_ACCESS_KEY_ID"]; }
  const std::string& refused_secret_key() { return env_["S3_REFUSED_SECRET_ACCESS_KEY"]; }
  // The server's log (moto's request lines), for failure messages.
  std::string Log() const {
    std::ifstream in(dir_.path() + "/server.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // KEY=VALUE entries for RunCommand: the endpoint and the key, with no AWS config file in the way.
  std::vector<std::string> ClientEnv() {
    return {"AWS_ACCESS_KEY_ID=" + access_key(),     "AWS_SECRET_ACCESS_KEY=" + secret_key(),
            "AWS_DEFAULT_REGION=us-east-1",          "AWS_CONFIG_FILE=/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true"};
  }

 private:
  static std::string Script() { return std::string(SFTCTL_SOURCE_DIR) + "/tests/object_store/s3_server.sh"; }
  TempDir dir_{"s3server"};
  bool started_ = false;
  std::map<std::string, std::string> env_;
};

// A test suite around one strict server (each test uses its own bucket): derive as
// `class T : public S3SuiteTest<T>`; a SetUp of the derived class calls S3SuiteTest::SetUp() first
// and returns on a fatal failure (the server did not start).
template <typename Suite>
class S3SuiteTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new S3Server();
    start_error_ = server_->Start(/*strict=*/true);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_EQ(start_error_, "") << "the S3 test server did not start (deploy/install-deps.sh installs moto)";
  }
  // A client with the server's key; `region` "" lets the client choose.
  static std::unique_ptr<S3Client> NewClient(const std::string& region) {
    return std::make_unique<S3Client>(
        S3Endpoint{server_->endpoint(), region},
        AwsCredentials{server_->access_key(), server_->secret_key(), "", "test"});
  }

  static inline S3Server* server_ = nullptr;
  static inline std::string start_error_;
};

}  // namespace sftctl::testing
