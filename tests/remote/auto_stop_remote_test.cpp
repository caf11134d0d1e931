// `submit --stop-when-done`, and the host's uptime, cost and stop policy in `status` and `list`: the
// real sftctl against a real local agent that runs the stub trainer (no LibTorch needed) and records
// its stop action in a file instead of stopping anything.
#include <gtest/gtest.h>

#include "client/remote/host_summary.h"
#include "tests/remote/remote_test_util.h"

namespace sftctl::remotetest {
namespace {

using ::sftctl::client::FormatSeconds;
using ::sftctl::client::HostSummaryText;

int Lines(const std::string& path) {
  std::ifstream f(path);
  int n = 0;
  for (std::string line; std::getline(f, line);) n += !line.empty();
  return n;
}

TEST(AutoStopRemoteTest, StopWhenDoneStopsTheHostOnceAndStatusAndListShowIt) {
  TempDir tmp;
  const std::string data = tmp.path() + "/agent", record = tmp.path() + "/record";
  CommandResult started = RunCommand({Bin("sftd"),
                                      "start",
                                      "--detach",
                                      "--data-dir",
                                      data,
                                      "--port",
                                      "0",
                                      "--gpus",
                                      "none",
                                      "--trainer",
                                      Bin("sftd-stub-trainer"),
                                      "--stop-command",
                                      "echo fired >> '" + record + "'",
                                      "--stop-grace",
                                      "1s",
                                      "--stop-storage",
                                      "survives",
                                      "--price-per-hour",
                                      "2",
                                      "--stop-check",
                                      "50ms"});
  ASSERT_EQ(started.exit_code, 0) << started.output;
  struct StopAgent {
    std::string dir;
    ~StopAgent() { RunCommand({Bin("sftd"), "stop", "--data-dir", dir}); }
  } stop_agent{data};
  std::filesystem::create_directories(tmp.path() + "/home");
  Sftctl sftctl(tmp.path() + "/home");
  const std::string host = "local:" + data;

  Result r = sftctl.Run({"list", "--host", host, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  nlohmann::json info = r.Json()["hosts"][0];
  EXPECT_EQ(info["host"], host);
  EXPECT_EQ(info["price_per_hour"], 2.0);
  EXPECT_EQ(info["auto_stop"]["state"], "off");  // no idle policy, no stop-when-done job yet
  EXPECT_EQ(info["auto_stop"]["policy"], "stop 1s after a stop-when-done job; action command; $2.00/h");

  const std::string spec = WriteTinyJob(tmp.path() + "/work", /*steps=*/5);
  r = sftctl.Run({"submit", "--host", host, spec, "--stop-when-done", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const std::string job = r.Json()["job"];
  // Only the recording file is polled: every call to the agent would renew its lease.
  ASSERT_TRUE(WaitFor([&] { return Lines(record) == 1; }));

  r = sftctl.Run({"status", job});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.out.find("SUCCEEDED"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stops the host when done"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  " + host + ": sftd up "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at $2.00/h"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("auto-stop now: stopped (a stop-when-done job ended"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("last stop action: "), std::string::npos) << r.out;
  r = sftctl.Run({"status", job, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["nodes"][0]["stop_when_done"], true);
  EXPECT_EQ(r.Json()["nodes"][0]["agent"]["auto_stop"]["state"], "stopped");
  r = sftctl.Run({"list"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.out.find("auto-stop now: stopped"), std::string::npos) << r.out;
  EXPECT_EQ(Lines(record), 1);  // once
}

TEST(AutoStopRemoteTest, HostSummaryText) {
  ::sftctl::v1::HealthResponse h;
  h.set_uptime_s(3 * 3600 + 12 * 60);
  auto* as = h.mutable_auto_stop();
  as->set_policy("stop when idle 2h00m, or 1m00s after a stop-when-done job; action runpod; $1.30/h");
  as->set_state("countdown");
  as->set_remaining_s(6000);
  as->set_detail("quiet for 20m00s of 2h00m");
  as->set_price_per_hour(1.3);
  as->set_cost_estimate(4.16);
  EXPECT_EQ(HostSummaryText("gpu1", h, "  "),
            "  gpu1: sftd up 3h12m, ~$4.16 so far at $1.30/h\n"
            "  auto-stop: stop when idle 2h00m, or 1m00s after a stop-when-done job; action runpod; $1.30/h\n"
            "  auto-stop now: countdown, stops in 1h40m (quiet for 20m00s of 2h00m)\n");
  EXPECT_EQ(HostSummaryText("old-agent", ::sftctl::v1::HealthResponse(), ""),
            "old-agent: sftd up 0s (no --price-per-hour: no cost estimate)\nauto-stop: off\n");
  // The cost cap: what is spent and when it stops, then that it stopped the host.
  as->set_max_cost(25);
  as->set_spent(3.1);
  as->set_cost_cap_remaining_s(8 * 3600 + 46 * 60 + 5);
  EXPECT_EQ(HostSummaryText("gpu1", h, ""),
            "gpu1: sftd up 3h12m, ~$4.16 so far at $1.30/h\n"
            "auto-stop: stop when idle 2h00m, or 1m00s after a stop-when-done job; action runpod; $1.30/h\n"
            "auto-stop now: countdown, stops in 1h40m (quiet for 20m00s of 2h00m)\n"
            "cost cap $25.00: $3.10 spent, stops in 8h46m\n");
  const std::string reason = "cost cap $25.00 reached: $24.61 spent at $2.49/h since 2026-11-28T10:00:00Z";
  as->set_cost_cap_reached(true);
  as->set_cost_cap_remaining_s(0);
  as->set_cost_cap_reason(reason);
  as->set_state("stopped");
  as->set_detail(reason);
  EXPECT_EQ(HostSummaryText("gpu1", h, ""),
            "gpu1: sftd up 3h12m, ~$4.16 so far at $1.30/h\n"
            "auto-stop: stop when idle 2h00m, or 1m00s after a stop-when-done job; action runpod; $1.30/h\n"
            "auto-stop now: stopped (" +
                reason + ")\n" + reason + "; jobs cancelled; the cap stopped the host\n");
  as->set_state("no_action");
  as->set_cost_cap_reason(reason + "; no stop action: the host keeps running");
  EXPECT_NE(HostSummaryText("gpu1", h, "")
                .find(reason + "; no stop action: the host keeps running; jobs cancelled\n"),
            std::string::npos);
  const nlohmann::json j = ::sftctl::client::HostSummaryJson(h);
  EXPECT_EQ(j["cost_cap"]["max_cost"], 25.0);
  EXPECT_EQ(j["cost_cap"]["reached"], true);
  EXPECT_EQ(FormatSeconds(59), "59s");
  EXPECT_EQ(FormatSeconds(61), "1m01s");
  EXPECT_EQ(FormatSeconds(2 * 86400 + 3600), "2d01h");
}

}  // namespace
}  // namespace sftctl::remotetest
