// The real `sftctl offers`, `hosts`, `up` and `down` against the stand-in provider APIs
// (tests/util/fake_cloud.py) when the provider answers with JSON nested 150,000 deep (300 KB): each
// exits with an error that names the provider and says what was wrong, never a crash, and `down`
// leaves a registry record that tells the truth (the terminate was asked for: "terminating", still
// live, so `hosts` and `down` find it again).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/remote/rented_hosts.h"
#include "tests/util/command.h"
#include "tests/util/fake_cloud.h"
#include "tests/util/file_util.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client {
namespace {

using ::sftctl::testing::Bin;
using ::sftctl::testing::CommandResult;
using ::sftctl::testing::FakeCloud;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

constexpr char kKey[] = "sk-deep-test-5e4d3c2b1a";

json Catalog() {
  return {{"offers",
           {{{"id", "gpu_1x_h100_pcie"},
             {"gpu", "H100 (80 GB PCIe)"},
             {"gpu_count", 1},
             {"price_per_hour", 2.49},
             {"regions", {{"us-east-1", true}}}}}}};
}

class DeepAnswerTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dialect() const { return GetParam(); }
  std::string profile() const { return "fake-" + dialect(); }
  std::string config_dir() const { return tmp_.path() + "/config/sftctl"; }

  // Starts the fake answering `deep` (fake_cloud.py's config "deep") and writes the profile for it.
  void StartFake(const std::vector<std::string>& deep) {
    json config = Catalog();
    config["deep"] = deep;
    ASSERT_TRUE(fake_.Start(tmp_.path(), dialect(), kKey, config, {"--no-launch-limit"}));
    json entry = {{"type", dialect()}, {"api_url", fake_.api_url()}};
    ASSERT_TRUE(testing::WriteWholeFile(config_dir() + "/providers.json",
                                        json({{"providers", {{profile(), entry}}}}).dump()));
    ASSERT_TRUE(testing::WriteWholeFile(tmp_.path() + "/home/.ssh/id_ed25519.pub",
                                        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGRlZXA deep@test\n"));
  }

  CommandResult Sftctl(std::vector<std::string> args) {
    args.insert(args.begin(), Bin("sftctl"));
    std::string key_var = "FAKE_" + dialect() + "_API_KEY=";
    for (char& c : key_var) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return RunCommand(args, {"XDG_CONFIG_HOME=" + tmp_.path() + "/config", "HOME=" + tmp_.path() + "/home",
                             key_var + kKey});
  }

  // A clean failure: an exit code of sftctl's own (no signal), the provider named, the nesting said.
  void ExpectCleanDeepError(const CommandResult& r, const std::string& what) {
    EXPECT_GT(r.exit_code, 0) << what << ": " << r.output;
    EXPECT_LT(r.exit_code, 128) << what << " crashed: " << r.output;
    EXPECT_THAT(r.output, HasSubstr("error: " + profile() + ": ")) << what;
    EXPECT_THAT(r.output, HasSubstr("nested more than 64 levels deep")) << what;
    EXPECT_THAT(r.output, Not(HasSubstr(kKey))) << what;
  }

  RentedHosts Registry() const { return RentedHosts(config_dir() + "/hosts.json"); }

  // Whether the fake was asked to terminate instance `id` (its phase moved on from running; a GET
  // after the terminate moves it further).
  bool FakeTerminated(const std::string& id) {
    for (const json& i : fake_.State().value("instances", json::array())) {
      const std::string phase = i.value("phase", "");
      if (i.value("id", "") == id) return phase == "terminating" || phase == "terminated" || phase == "gone";
    }
    return false;
  }

  TempDir tmp_{"cloud-cli"};
  FakeCloud fake_;
};

TEST_P(DeepAnswerTest, OffersAndHostsFailCleanly) {
  StartFake({"catalog", "list"});
  ExpectCleanDeepError(Sftctl({"offers", "--provider", profile()}), "offers");
  ExpectCleanDeepError(Sftctl({"hosts", "--provider", profile()}), "hosts");
  ExpectCleanDeepError(Sftctl({"up", "--provider", profile(), "--gpu", "H100", "--name", "box"}),
                       "up (catalog)");
  EXPECT_FALSE(Registry().Get("box").ok()) << "nothing was rented";
}

// `up` after the launch: the instance's answer is unreadable, so up gives the instance back, whose
// answers are unreadable too; the record says it was asked to terminate, not that it is up or gone.
TEST_P(DeepAnswerTest, UpAfterTheLaunchGivesBackAndRecordsTheTruth) {
  StartFake({"instance"});
  const CommandResult r = Sftctl({"up", "--provider", profile(), "--gpu", "H100", "--name", "box"});
  ExpectCleanDeepError(r, "up (instance)");
  EXPECT_THAT(r.output, HasSubstr("terminating the instance failed too"));
  auto rec = Registry().Get("box");
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_EQ(rec->state, "terminating");
  EXPECT_TRUE(rec->Live()) << "it may still bill: hosts and down --all must still see it";
  EXPECT_TRUE(FakeTerminated(rec->instance_id)) << "the terminate went out";
}

TEST_P(DeepAnswerTest, DownRecordsTerminatingBeforeAskingAndKeepsItWhenTheAnswerIsUnreadable) {
  StartFake({"terminate"});
  const std::string id = fake_.AddOrphan("box");
  ASSERT_FALSE(id.empty());
  RentedHost h;
  h.name = "box", h.provider = profile(), h.instance_id = id, h.state = "up";
  h.ssh_user = "root", h.ssh_host = "127.0.0.1", h.price_per_hour = 2.49;
  ASSERT_TRUE(Registry().Put(h).ok());
  ExpectCleanDeepError(Sftctl({"down", "box", "--force"}), "down");
  auto rec = Registry().Get("box");
  ASSERT_TRUE(rec.ok()) << rec.status().message();
  EXPECT_EQ(rec->state, "terminating");
  EXPECT_TRUE(FakeTerminated(id)) << "the terminate went out before the unreadable answer";
}

// `down --provider P --instance ID` waits, as `down NAME` does, until the provider reports it gone.
TEST_P(DeepAnswerTest, DownOfAnInstanceWaitsForTheProvider) {
  StartFake({"instance"});
  const std::string id = fake_.AddOrphan("stray");
  ASSERT_FALSE(id.empty());
  ExpectCleanDeepError(Sftctl({"down", "--provider", profile(), "--instance", id}), "down --instance");
  EXPECT_TRUE(FakeTerminated(id));
}

INSTANTIATE_TEST_SUITE_P(Providers, DeepAnswerTest, ::testing::Values("lambda", "runpod"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace sftctl::client
