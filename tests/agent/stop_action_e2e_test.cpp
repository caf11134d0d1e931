// The "lambda" stop action in the real sftd against a stand-in Lambda API on 127.0.0.1
// (tests/util/fake_cloud.py, which answers only a request that carries the planted key in its
// Authorization header), on every path by which the agent stops its host: idle (the laptop went away),
// a stop-when-done job (`submit --down-when-done`), and the cost cap (`--max-cost`). The terminate
// request is held in flight (tests/util/tcp_relay.h) while every process of the agent's tree is read:
// the key is on no command line (/proc/<pid>/cmdline, which any user of the host can read), and in no
// log line or status the agent gives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>

#include "tests/agent/agent_test_util.h"
#include "tests/util/fake_cloud.h"
#include "tests/util/tcp_relay.h"

namespace sftctl::agent::testing {
namespace {

using ::testing::HasSubstr;

const std::string kKey = "secret_lambda_key_0f8e2c4b";

// pid -> (parent pid, command line with its NULs as spaces) of every process that can be read.
std::map<pid_t, std::pair<pid_t, std::string>> Processes() {
  std::map<pid_t, std::pair<pid_t, std::string>> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = ReadWholeFile(e.path().string() + "/stat");
    const size_t rp = stat.rfind(')');
    if (rp == std::string::npos || rp + 4 > stat.size()) continue;
    std::string cmdline = ReadWholeFile(e.path().string() + "/cmdline");
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    out[std::stoi(name)] = {static_cast<pid_t>(std::atol(stat.c_str() + rp + 4)), cmdline};
  }
  return out;
}

// The command lines of `root` and of every process below it that hold `secret`.
std::vector<std::string> CommandLinesHolding(pid_t root, const std::string& secret) {
  const auto procs = Processes();
  std::vector<std::string> found;
  for (const auto& [pid, info] : procs) {
    if (info.second.find(secret) == std::string::npos) continue;
    pid_t p = pid;
    for (int depth = 0; p > 1 && p != root && depth < 64; ++depth) {
      auto it = procs.find(p);
      p = it == procs.end() ? 0 : it->second.first;
    }
    if (p == root) found.push_back(std::to_string(pid) + ": " + info.second);
  }
  return found;
}

v1::AutoStopStatus Health(Agent& a) {
  v1::HealthResponse h;
  grpc::Status s = a.stub()->Health(a.Ctx().get(), v1::HealthRequest(), &h);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return h.auto_stop();
}

class StopActionE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.Start(dir_.path(), "lambda", kKey, nlohmann::json::object())) << "fake_cloud.py";
    const std::string base = fake_.base_url();
    relay_ = std::make_unique<::sftctl::testing::TcpRelay>(std::stoi(base.substr(base.rfind(':') + 1)));
    ASSERT_GT(relay_->port(), 0);
  }

  // An agent whose stop action is "lambda", started with `flags` (a stop path), the key and the
  // instance in its environment only (as ~/.config/sftd/env puts them there); `stop_when_done`: a job
  // submitted with it. Checks, while the terminate request is held in flight, that no process of the
  // agent's tree has the key on its command line; then that the request reached the API with the key
  // (only that one is answered 200) and terminated the instance.
  void StopsWithTheKeyOffEveryCommandLine(const std::string& path, std::vector<std::string> flags,
                                          bool stop_when_done) {
    SCOPED_TRACE(path);
    const std::string id = fake_.AddOrphan(path);
    ASSERT_FALSE(id.empty());
    const size_t before = fake_.Requests("POST", "/api/v1/instance-operations/terminate").size();
    const std::string log = dir_.path() + "/" + path + ".log";
    relay_->Hold();
    Agent a(dir_.path() + "/" + path);
    a.set_env({"LAMBDA_API_KEY=" + kKey, "LAMBDA_INSTANCE_ID=" + id,
               "LAMBDA_API_URL=http://127.0.0.1:" + std::to_string(relay_->port()) + "/api/v1"});
    a.set_stderr_file(log);
    flags.insert(flags.end(), {"--stop-action", "lambda", "--stop-check", "50ms"});
    ASSERT_TRUE(a.Start(flags));
    if (stop_when_done) {
      v1::SubmitJobRequest req;
      req.set_spec_json(StubSpec({{"steps", 2}}).dump());
      req.set_stop_when_done(true);
      v1::Job job;
      ASSERT_TRUE(a.stub()->SubmitJob(a.Ctx().get(), req, &job).ok());
    }
    // No other call until the request is in flight: each would put the idle stop off.
    ASSERT_TRUE(WaitFor([&] { return relay_->held() > 0; })) << "no terminate request\n"
                                                             << ReadWholeFile(log);
    const std::vector<std::string> holding = CommandLinesHolding(a.pid(), kKey);
    EXPECT_TRUE(holding.empty()) << "the Lambda key is on a command line: "
                                 << ::testing::PrintToString(holding);
    relay_->Release();

    v1::AutoStopStatus st;
    ASSERT_TRUE(WaitFor([&] {
      st = Health(a);
      return !st.last_action().empty();  // the action's outcome is recorded
    })) << st.state();
    EXPECT_EQ(st.state(), "stopped") << st.last_action();
    EXPECT_THAT(st.last_action(), HasSubstr("lambda: HTTP 200"));
    const auto calls = fake_.Requests("POST", "/api/v1/instance-operations/terminate");
    ASSERT_EQ(calls.size(), before + 1);
    EXPECT_EQ(calls.back()["status"], 200);  // the fake answers 401 to any other key
    EXPECT_EQ(calls.back()["auth"], true);
    const nlohmann::json state = fake_.State();
    std::string status;
    for (const auto& inst : state.value("instances", nlohmann::json::array()))
      if (inst.value("id", "") == id) status = inst.value("status", "");
    EXPECT_THAT(status, ::testing::AnyOf("terminating", "terminated")) << state.dump();
    for (const std::string& text : {ReadWholeFile(log), st.SerializeAsString()})
      EXPECT_EQ(text.find(kKey), std::string::npos) << "the key leaked: " << text;
  }

  TempDir dir_;
  ::sftctl::testing::FakeCloud fake_;
  std::unique_ptr<::sftctl::testing::TcpRelay> relay_;
};

TEST_F(StopActionE2eTest, IdleStopKeepsTheKeyOffEveryCommandLine) {
  StopsWithTheKeyOffEveryCommandLine("idle", {"--stop-when-idle", "1s"}, false);
}

TEST_F(StopActionE2eTest, StopWhenDoneKeepsTheKeyOffEveryCommandLine) {
  StopsWithTheKeyOffEveryCommandLine("down-when-done", {"--stop-grace", "1s", "--stop-storage", "survives"},
                                     true);
}

TEST_F(StopActionE2eTest, CostCapKeepsTheKeyOffEveryCommandLine) {
  const int64_t since =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count() -
      100;  // $100 spent at $3600/h: past the cap at once
  StopsWithTheKeyOffEveryCommandLine(
      "max-cost", {"--price-per-hour", "3600", "--max-cost", "10", "--billing-since", std::to_string(since)},
      false);
}

}  // namespace
}  // namespace sftctl::agent::testing
