// The renting policy (client/cloud/rental.h), the rented-host registry (client/remote/rented_hosts.h)
// and provider profiles (client/cloud/provider_config.h), with an in-memory provider and injected host
// seams on a ManualClock: which offer is taken, what is recorded when, what a failure leaves behind.
#include "client/cloud/rental.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "client/cloud/provider_config.h"
#include "client/remote/job_registry.h"
#include "client/remote/job_target.h"
#include "client/remote/remote_options.h"
#include "client/remote/rented_hosts.h"
#include "client/remote/ssh/ssh_config.h"
#include "tests/util/file_util.h"
#include "tests/util/offset_clock.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client::cloud {
namespace {

using ::sftctl::testing::ManualClock;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

// A provider in memory: offers, capacity failures, instances that boot after `boot_polls` GETs and go
// `gone_polls` GETs after a terminate.
class MemoryProvider : public CloudProvider {
 public:
  MemoryProvider() {
    profile_.name = profile_.type = "lambda";
    profile_.api_url = "http://127.0.0.1:1/api/v1";
    profile_.api_key = "secret-key-123";
  }
  const ProviderProfile& profile() const override { return profile_; }
  StatusOr<std::vector<Offer>> ListOffers(const std::string&, int) override { return offers; }
  StatusOr<std::string> EnsureSshKey(const std::string& key) override {
    keys.push_back(key);
    return std::string("sftctl-key");
  }
  StatusOr<std::string> Launch(const LaunchRequest& req) override {
    launches.push_back(req.offer.instance_type + "/" + req.offer.region);
    if (no_capacity.count(req.offer.instance_type)) return ResourceExhaustedError("lambda: no capacity");
    const std::string id = "i-" + std::to_string(launches.size());
    Instance i;
    i.id = id, i.name = req.name, i.state = InstanceState::kStarting, i.status = "booting";
    i.ssh_user = "ubuntu", i.ssh_port = 22;
    instances[id] = i;
    polls[id] = 0;
    return id;
  }
  StatusOr<Instance> GetInstance(const std::string& id) override {
    if (fail_get) return UnavailableError("lambda: connection refused");
    auto it = instances.find(id);
    if (it == instances.end()) return NotFoundError("lambda: no instance " + id);
    Instance& i = it->second;
    ++polls[id];
    if (i.state == InstanceState::kStarting && polls[id] > boot_polls) {
      i.state = InstanceState::kRunning, i.status = "active", i.ssh_host = address;
    }
    if (i.state == InstanceState::kStopping && ++gone[id] > gone_polls) {
      instances.erase(it);
      return NotFoundError("lambda: no instance " + id);
    }
    return i;
  }
  StatusOr<std::vector<Instance>> ListInstances() override {
    if (fail_list) return UnavailableError("lambda: connection refused");
    std::vector<Instance> out;
    for (auto& [id, i] : instances) out.push_back(i);
    return out;
  }
  Status Terminate(const std::string& id) override {
    terminated.push_back(id);
    if (on_terminate) on_terminate();
    auto it = instances.find(id);
    if (it == instances.end()) return NotFoundError("lambda: no instance " + id);
    it->second.state = InstanceState::kStopping, it->second.status = "terminating";
    return OkStatus();
  }

  ProviderProfile profile_;
  std::vector<Offer> offers;
  std::set<std::string> no_capacity;
  std::vector<std::string> keys, launches, terminated;
  std::map<std::string, Instance> instances;
  std::map<std::string, int> polls, gone;
  int boot_polls = 2, gone_polls = 1;
  bool fail_get = false, fail_list = false;
  std::function<void()> on_terminate;  // called as each terminate is asked for
  std::string address = "192.0.2.7";
};

Offer MakeOffer(const std::string& type, const std::string& region, double price, int mem = 80) {
  Offer o;
  o.provider = "lambda", o.instance_type = type, o.region = region, o.price_per_hour = price;
  o.gpu = "H100", o.gpu_count = 1, o.gpu_memory_gib = mem;
  return o;
}

class RentalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("HOME", home_.path().c_str(), 1);
    std::filesystem::create_directories(home_.path() + "/.ssh");
    testing::WriteWholeFile(home_.path() + "/.ssh/id_ed25519.pub", "ssh-ed25519 AAAAC3Nz test@laptop\n");
    provider_.offers = {MakeOffer("gpu_1x_h100_sxm5", "us-east-1", 3.29),
                        MakeOffer("gpu_1x_h100_pcie", "us-west-1", 2.49),
                        MakeOffer("gpu_1x_h100_pcie", "us-south-1", 2.49, 94)};
    seams_.ready = [this](const ConnectOptions& o) {
      ready_hosts_.push_back(o.host + (o.accept_new_host_key ? " (accept-new)" : ""));
      known_hosts_files_.insert(o.known_hosts_file);
      return ready_failures_-- > 0 ? UnavailableError("connection refused") : OkStatus();
    };
    seams_.setup = [this](const ConnectOptions& o, bool bootstrap, const std::vector<std::string>& args) {
      setups_.push_back(o.host + (bootstrap ? " bootstrap" : " agent"));
      agent_args_ = args;
      return setup_status_;
    };
    seams_.set_agent_env = [this](const ConnectOptions&, const std::vector<std::string>& lines) {
      sent_.insert(sent_.end(), lines.begin(), lines.end());
      return OkStatus();
    };
    options_.gpu = "H100";
    options_.name = "box";
    options_.poll = std::chrono::seconds(5);
  }

  StatusOr<RentedHost> RunUp() { return Up(&provider_, registry_, options_, seams_, &clock_, err_); }

  TempDir home_{"rental"};
  RentedHosts registry_{home_.path() + "/hosts.json"};
  MemoryProvider provider_;
  RentalSeams seams_;
  UpOptions options_;
  ManualClock clock_;
  std::ostringstream err_;
  std::vector<std::string> ready_hosts_, setups_, agent_args_;
  std::set<std::string> known_hosts_files_;
  std::vector<std::string> sent_;
  int ready_failures_ = 0;
  Status setup_status_;
};

TEST_F(RentalTest, RankOffersIsCheapestFirstThenMoreMemoryWithinRegionAndPrice) {
  auto ranked = RankOffers(provider_.offers, UpOptions{});
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].region, "us-south-1");  // same price, 94 GiB beats 80
  EXPECT_EQ(ranked[1].region, "us-west-1");
  UpOptions o;
  o.max_price = 3.0;
  EXPECT_EQ(RankOffers(provider_.offers, o).size(), 2u);
  o.region = "us-east-1";
  EXPECT_TRUE(RankOffers(provider_.offers, o).empty());
}

TEST_F(RentalTest, UpRentsTheCheapestWaitsForBootAndSshRecordsTheHostKeyAndSetsUp) {
  ready_failures_ = 2;  // sshd answers on the third try
  auto h = RunUp();
  ASSERT_TRUE(h.ok()) << h.status().message() << err_.str();
  EXPECT_THAT(provider_.launches, ElementsAre("gpu_1x_h100_pcie/us-south-1"));
  EXPECT_THAT(provider_.keys, ElementsAre("ssh-ed25519 AAAAC3Nz test@laptop"));
  EXPECT_EQ(h->state, "up");
  EXPECT_EQ(h->SshTarget(), "ubuntu@192.0.2.7");
  EXPECT_DOUBLE_EQ(h->price_per_hour, 2.49);
  // Every SSH probe accepts a new host key; the setup after them checks it strictly.
  ASSERT_EQ(ready_hosts_.size(), 3u);
  EXPECT_EQ(ready_hosts_[0], "ubuntu@192.0.2.7 (accept-new)");
  EXPECT_THAT(setups_, ElementsAre("ubuntu@192.0.2.7 bootstrap"));
  EXPECT_THAT(agent_args_, ::testing::IsSupersetOf({"--price-per-hour", "2.4900", "--billing-since"}));
  // Two polls booting, then three SSH tries: four pauses of 5 s on the clock.
  EXPECT_EQ(clock_.Now().time_since_epoch(), std::chrono::seconds(20));
  EXPECT_THAT(err_.str(), HasSubstr("waiting for the instance (booting)"));
  auto stored = registry_.Get("box");
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->state, "up");
  EXPECT_EQ(stored->instance_id, "i-1");
  // The host's key goes to a known_hosts file of its own, never ~/.ssh/known_hosts.
  EXPECT_EQ(stored->known_hosts, home_.path() + "/known_hosts.d/box");
  EXPECT_THAT(known_hosts_files_, ElementsAre(stored->known_hosts));
}

TEST_F(RentalTest, ACapacityErrorTakesTheNextOffer) {
  provider_.no_capacity = {"gpu_1x_h100_pcie"};
  auto h = RunUp();
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_THAT(provider_.launches, ElementsAre("gpu_1x_h100_pcie/us-south-1", "gpu_1x_h100_pcie/us-west-1",
                                              "gpu_1x_h100_sxm5/us-east-1"));
  EXPECT_EQ(h->instance_type, "gpu_1x_h100_sxm5");
  EXPECT_THAT(err_.str(), HasSubstr("trying the next offer"));
}

TEST_F(RentalTest, NoCapacityAnywhereIsResourceExhaustedAndRecordsNothing) {
  provider_.no_capacity = {"gpu_1x_h100_pcie", "gpu_1x_h100_sxm5"};
  EXPECT_THAT(RunUp(), StatusIs(StatusCode::kResourceExhausted, HasSubstr("every matching offer")));
  EXPECT_FALSE(registry_.Get("box").ok());
}

TEST_F(RentalTest, NoMatchingOfferSaysWhatWasAsked) {
  options_.max_price = 1.0;
  EXPECT_THAT(RunUp(), StatusIs(StatusCode::kNotFound, HasSubstr("at most $1.00/h")));
  EXPECT_TRUE(provider_.launches.empty());
}

TEST_F(RentalTest, TheRecordExistsBeforeTheHostIsReachable) {
  seams_.ready = [this](const ConnectOptions&) {
    auto rec = registry_.Get("box");
    EXPECT_TRUE(rec.ok());
    if (rec.ok()) {
      EXPECT_EQ(rec->state, "starting");
    }
    return OkStatus();
  };
  ASSERT_TRUE(RunUp().ok());
}

TEST_F(RentalTest, NotReachableInTimeTerminatesAndSaysSo) {
  provider_.boot_polls = 1000;
  options_.wait_limit = std::chrono::seconds(60);
  auto h = RunUp();
  EXPECT_THAT(h, StatusIs(StatusCode::kDeadlineExceeded, HasSubstr("the instance was terminated")));
  EXPECT_THAT(provider_.terminated, ElementsAre("i-1"));
  EXPECT_TRUE(provider_.instances.empty());  // the provider reported it gone
  auto rec = registry_.Get("box");
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->state, "down");
  EXPECT_GT(rec->ended_unix_ms, 0);
}

TEST_F(RentalTest, ASetupFailureTerminatesUnlessKept) {
  setup_status_ = FailedPreconditionError("box: build-agent failed");
  EXPECT_THAT(RunUp(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("build-agent failed; the instance was")));
  EXPECT_THAT(provider_.terminated, ElementsAre("i-1"));

  options_.name = "kept";
  options_.keep_on_failure = true;
  EXPECT_THAT(RunUp(), StatusIs(StatusCode::kFailedPrecondition, HasSubstr("sftctl down kept")));
  EXPECT_EQ(provider_.terminated.size(), 1u);
  EXPECT_EQ(registry_.Get("kept")->state, "failed");
}

TEST_F(RentalTest, ANameInUseIsRefusedBeforeRenting) {
  ASSERT_TRUE(RunUp().ok());
  EXPECT_THAT(RunUp(), StatusIs(StatusCode::kAlreadyExists, HasSubstr("'box' is already up")));
  EXPECT_EQ(provider_.launches.size(), 1u);
}

TEST_F(RentalTest, AHostileAddressIsRefused) {
  provider_.address = "1.2.3.4;touch /tmp/x";
  EXPECT_THAT(RunUp(), StatusIs(StatusCode::kDataLoss, HasSubstr("is not a host name")));
  EXPECT_THAT(provider_.terminated, ElementsAre("i-1"));
}

TEST_F(RentalTest, TerminateFromHostSendsTheKeyInAFileNeverInTheAgentArgs) {
  options_.down_when_done = true;
  options_.terminate_from_host = true;
  options_.max_cost = 25;
  ASSERT_TRUE(RunUp().ok());
  EXPECT_THAT(sent_, ElementsAre("LAMBDA_API_KEY='secret-key-123'", "LAMBDA_INSTANCE_ID='i-1'",
                                 "LAMBDA_API_URL='http://127.0.0.1:1/api/v1'"));
  EXPECT_THAT(agent_args_, ::testing::IsSupersetOf({"--stop-action", "lambda", "--max-cost", "25.00"}));
  for (const auto& a : agent_args_) EXPECT_THAT(a, Not(HasSubstr("secret-key-123")));
  // Neither the registry nor the progress output holds the key.
  EXPECT_THAT(testing::ReadWholeFile(registry_.path()), Not(HasSubstr("secret-key-123")));
  EXPECT_THAT(err_.str(), Not(HasSubstr("secret-key-123")));
}

TEST_F(RentalTest, WithoutConsentNoKeyLeavesAndLambdaGetsNoStopAction) {
  options_.down_when_done = true;
  ASSERT_TRUE(RunUp().ok());
  EXPECT_TRUE(sent_.empty());
  EXPECT_THAT(agent_args_, Not(::testing::Contains("--stop-action")));
}

TEST_F(RentalTest, DownWaitsUntilGoneAndKeepsTheCost) {
  auto h = RunUp();
  ASSERT_TRUE(h.ok());
  testing::WriteWholeFile(h->known_hosts, "[192.0.2.7]:22 ssh-ed25519 AAAA\n");
  provider_.gone_polls = 3;
  ASSERT_TRUE(Down(&provider_, registry_, *h, &clock_, err_).ok()) << err_.str();
  EXPECT_TRUE(provider_.instances.empty());
  EXPECT_THAT(err_.str(), HasSubstr("waiting for box to go (terminating)"));
  auto rec = registry_.Get("box");
  EXPECT_EQ(rec->state, "down");
  EXPECT_FALSE(rec->Live());
  EXPECT_FALSE(std::filesystem::exists(rec->known_hosts));
  EXPECT_GE(rec->SpentUsd(rec->ended_unix_ms + 3600000), 0.0);
  EXPECT_DOUBLE_EQ(rec->SpentUsd(rec->ended_unix_ms + 3600000), rec->SpentUsd(rec->ended_unix_ms));
  // A second down is a no-op.
  EXPECT_TRUE(Down(&provider_, registry_, *rec, &clock_, err_).ok());
  EXPECT_EQ(provider_.terminated.size(), 1u);
}

// A host the provider took away (preempted, or terminated in its console) is gone, and says so;
// `down` of it still ends its record, though the provider no longer knows the instance.
TEST_F(RentalTest, APreemptedHostIsGoneAndDownStillEndsItsRecord) {
  auto h = RunUp();
  ASSERT_TRUE(h.ok());
  auto gone = GoneBecause(&provider_, *h);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(*gone, std::nullopt) << "a running host is not gone";
  Instance& i = provider_.instances.at(h->instance_id);
  i.state = InstanceState::kTerminated, i.status = "preempted";
  gone = GoneBecause(&provider_, *h);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->value_or(""), "lambda reports instance " + h->instance_id + " preempted");
  const Instance preempted = i;  // (i dies with the map's entries)
  provider_.instances.clear();
  gone = GoneBecause(&provider_, *h);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->value_or(""), "lambda no longer knows instance " + h->instance_id);
  ASSERT_TRUE(Down(&provider_, registry_, *h, &clock_, err_).ok()) << err_.str();
  EXPECT_EQ(registry_.Get("box")->state, "down");
  // A provider that cannot be asked is an error, not "gone".
  provider_.instances[h->instance_id] = preempted;
  provider_.fail_get = true;
  EXPECT_THAT(GoneBecause(&provider_, *h),
              StatusIs(StatusCode::kUnavailable, HasSubstr("connection refused")));
}

// Losing the connection is not losing the host: a host the provider still runs (or that cannot be
// asked: this machine may be the one offline) has its job followed again; a replacement is rented
// only when the provider says the host is gone, and only as often as --replace-lost allows.
// A lost host that could not be given back may still bill: it is not doubled by a replacement.
TEST(LostHostTest, NoReplacementWhileTheLostHostMayStillBill) {
  EXPECT_TRUE(CheckReplaceable("box", OkStatus()).ok());
  EXPECT_THAT(CheckReplaceable("box", UnavailableError("lambda: connection refused")),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("no replacement is rented while box may still bill"),
                             HasSubstr("lambda: connection refused"), HasSubstr("`sftctl down box`"))));
}

TEST(LostHostTest, FollowAgainUnlessTheProviderSaysGoneThenReplaceWhileAllowed) {
  RentedHost h;
  h.name = "box", h.provider = "lambda";
  const std::optional<std::string> gone("lambda reports instance i-1 preempted");
  LostHostVerdict v = DecideOnLostHost(h, gone, 0, 2, true);
  EXPECT_EQ(v.action, LostHostAction::kReplace);
  EXPECT_EQ(v.why, "lost box: lambda reports instance i-1 preempted");
  v = DecideOnLostHost(h, gone, 2, 2, true);
  EXPECT_EQ(v.action, LostHostAction::kGiveBack);
  EXPECT_EQ(v.why, "lost box: lambda reports instance i-1 preempted; --replace-lost 2 used up");
  EXPECT_EQ(DecideOnLostHost(h, gone, 0, 0, true).action, LostHostAction::kGiveBack);
  v = DecideOnLostHost(h, std::optional<std::string>(), 0, 2, true);
  EXPECT_EQ(v.action, LostHostAction::kFollowAgain);
  EXPECT_EQ(v.why, "lambda still reports box running; following its job again");
  v = DecideOnLostHost(h, UnavailableError("no route to api.lambdalabs.com"), 0, 2, true);
  EXPECT_EQ(v.action, LostHostAction::kFollowAgain);
  EXPECT_THAT(v.why, HasSubstr("cannot ask lambda about box (no route to api.lambdalabs.com)"));
  // Tries used up (or nothing was submitted): given back, saying why.
  v = DecideOnLostHost(h, std::optional<std::string>(), 0, 2, false);
  EXPECT_EQ(v.action, LostHostAction::kGiveBack);
  EXPECT_THAT(v.why, HasSubstr("stayed out of reach; giving it back"));
}

// --max-cost covers a run's replacements too: each lost host is charged what it cost, the next one may
// cost the rest, and none is rented once less than a cent is left.
TEST(RunCostCapTest, ReplacementsStopWhenTheNextWouldPassMaxCost) {
  TempDir dir("cost-cap");
  RentedHosts registry(dir.path() + "/hosts.json");
  constexpr int64_t kHourMs = 3600 * 1000;
  auto put = [&](const std::string& name, double price, int64_t launched, int64_t ended) {
    RentedHost h;
    h.name = name, h.provider = "lambda", h.price_per_hour = price, h.state = "down";
    h.launched_unix_ms = launched, h.ended_unix_ms = ended;
    ASSERT_TRUE(registry.Put(h).ok());
  };
  put("box", 2.0, kHourMs, 2 * kHourMs);              // $2.00
  put("box-2", 2.0, kHourMs, kHourMs + kHourMs / 2);  // $1.00
  put("box-3", 3.0, kHourMs, 0);                      // no end yet: charged until `now`
  RunCostCap cap(5.0);
  ReplacementCost c = cap.ChargeLostHost(registry, "box", 10 * kHourMs);
  EXPECT_TRUE(c.allowed);
  EXPECT_DOUBLE_EQ(c.max_cost, 3.0);
  EXPECT_EQ(c.why, "$2.00 of --max-cost $5.00 spent; the replacement may cost the rest");
  c = cap.ChargeLostHost(registry, "box-2", 10 * kHourMs);  // the spend adds up across the run
  EXPECT_TRUE(c.allowed);
  EXPECT_DOUBLE_EQ(c.max_cost, 2.0);
  EXPECT_EQ(c.why, "$3.00 of --max-cost $5.00 spent; the replacement may cost the rest");
  // 40 minutes at $3/hour: $2.00 more leaves nothing for a next host.
  c = cap.ChargeLostHost(registry, "box-3", kHourMs + 2 * kHourMs / 3);
  EXPECT_FALSE(c.allowed);
  EXPECT_EQ(c.why, "$5.00 of --max-cost $5.00 spent: no replacement");

  // Less than a cent left: no replacement; two cents: one, capped at what is left.
  put("cheap", 3.6, kHourMs, kHourMs + 4980 * 1000);  // $4.98
  RunCostCap near(5.0);
  c = near.ChargeLostHost(registry, "cheap", 0);
  EXPECT_TRUE(c.allowed);
  EXPECT_NEAR(c.max_cost, 0.02, 1e-9);
  put("dear", 3.6, kHourMs, kHourMs + 4995 * 1000);  // $4.995
  RunCostCap over(5.0);
  c = over.ChargeLostHost(registry, "dear", 0);
  EXPECT_FALSE(c.allowed);
  EXPECT_THAT(c.why, EndsWith(": no replacement"));

  // A record that cannot be read is charged nothing.
  RunCostCap unknown(5.0);
  c = unknown.ChargeLostHost(registry, "nowhere", 10 * kHourMs);
  EXPECT_TRUE(c.allowed);
  EXPECT_DOUBLE_EQ(c.max_cost, 5.0);
  EXPECT_EQ(c.why, "$0.00 of --max-cost $5.00 spent; the replacement may cost the rest");

  // No cap: every replacement, uncapped, and nothing said.
  RunCostCap none(0);
  c = none.ChargeLostHost(registry, "box", 10 * kHourMs);
  EXPECT_TRUE(c.allowed);
  EXPECT_EQ(c.max_cost, 0);
  EXPECT_EQ(c.why, "");
}

TEST_F(RentalTest, DownGivesUpAfterItsLimit) {
  auto h = RunUp();
  ASSERT_TRUE(h.ok());
  provider_.gone_polls = 1000;
  EXPECT_THAT(Down(&provider_, registry_, *h, &clock_, err_, std::chrono::seconds(30)),
              StatusIs(StatusCode::kDeadlineExceeded, HasSubstr("still not gone")));
  // Asked to go, not seen gone: it may still bill, so it stays live for `hosts` and `down`.
  EXPECT_EQ(registry_.Get("box")->state, "terminating");
  EXPECT_TRUE(registry_.Get("box")->Live());
}

// The record says "terminating" before the provider is asked (a crash or kill after that leaves a
// true record), and "down" once the provider reports the instance gone.
TEST_F(RentalTest, DownRecordsTerminatingBeforeAskingTheProvider) {
  auto h = RunUp();
  ASSERT_TRUE(h.ok());
  std::string when_asked;
  provider_.on_terminate = [&] {
    auto rec = registry_.Get("box");
    when_asked = rec.ok() ? rec->state : rec.status().message();
  };
  ASSERT_TRUE(Down(&provider_, registry_, *h, &clock_, err_).ok()) << err_.str();
  EXPECT_EQ(when_asked, "terminating");
  EXPECT_EQ(registry_.Get("box")->state, "down");
}

// `down --provider P --instance ID` (an orphan) waits as `down NAME` does, with the same helper.
TEST_F(RentalTest, TerminateAndWaitWaitsUntilTheProviderReportsTheInstanceGone) {
  auto id = provider_.Launch(LaunchRequest{provider_.offers[0], "stray", "", ""});
  ASSERT_TRUE(id.ok());
  provider_.gone_polls = 2;
  ASSERT_TRUE(
      TerminateAndWait(&provider_, *id, "", &clock_, err_, std::chrono::seconds(300), std::chrono::seconds(5))
          .ok())
      << err_.str();
  EXPECT_TRUE(provider_.instances.empty());
  EXPECT_THAT(err_.str(), HasSubstr("waiting for instance i-1 to go (terminating)"));
  EXPECT_EQ(clock_.Now().time_since_epoch(), std::chrono::seconds(10));  // two polls while terminating
  provider_.gone_polls = 1000;
  auto again = provider_.Launch(LaunchRequest{provider_.offers[0], "stray2", "", ""});
  ASSERT_TRUE(again.ok());
  EXPECT_THAT(
      TerminateAndWait(&provider_, *again, "stray2", &clock_, err_, std::chrono::seconds(20),
                       std::chrono::seconds(5)),
      StatusIs(StatusCode::kDeadlineExceeded, HasSubstr("lambda: instance i-2 (stray2) still not gone")));
}

TEST_F(RentalTest, HostsSaysWhichProviderCouldNotBeAskedEvenWithoutRecords) {
  provider_.fail_list = true;
  std::vector<Status> unanswered;
  EXPECT_TRUE(ListRentedHosts({&provider_}, registry_, &unanswered).empty());
  ASSERT_EQ(unanswered.size(), 1u);
  EXPECT_THAT(unanswered[0], StatusIs(StatusCode::kUnavailable, HasSubstr("lambda: connection refused")));
}

TEST_F(RentalTest, AnIpv6AddressBecomesABracketedSshTarget) {
  provider_.address = "2001:db8::7";
  auto h = RunUp();
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->SshTarget(), "ubuntu@[2001:db8::7]");
  ASSERT_FALSE(ready_hosts_.empty());
  EXPECT_EQ(ready_hosts_[0], "ubuntu@[2001:db8::7] (accept-new)");
  h->ssh_port = 40022;
  EXPECT_EQ(h->SshTarget(), "ubuntu@[2001:db8::7]:40022");
  auto spec = ssh::ParseHostSpec(h->SshTarget());  // what connecting makes of it
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->user, "ubuntu");
  EXPECT_EQ(spec->host, "2001:db8::7");
  EXPECT_EQ(spec->port.value_or(0), 40022);
}

// A name the user's ssh config picks out (an alias such as `prod`) is never taken from a provider:
// it would bootstrap one of the user's own machines. IP literals and names the config has nothing
// particular for are fine.
TEST_F(RentalTest, AProviderAddressTheSshConfigKnowsIsRefused) {
  const std::string config = home_.path() + "/.ssh/config";
  testing::WriteWholeFile(config,
                          "Host *\n  IdentityFile ~/.ssh/id_ed25519\n\n"
                          "Host prod\n  HostName 10.0.0.5\n  User admin\n\n"
                          "Host *.corp.example\n  ProxyJump bastion\n");
  EXPECT_TRUE(CheckProviderAddress("lambda", "192.0.2.7", "").ok());
  EXPECT_TRUE(CheckProviderAddress("lambda", "2001:db8::7", "").ok());
  EXPECT_TRUE(CheckProviderAddress("lambda", "gpu-7.cloud.example", "").ok());  // only `Host *` applies
  const auto known = [&](const std::string& addr) {
    return StatusIs(StatusCode::kDataLoss, AllOf(HasSubstr("lambda: the instance's address '" + addr +
                                                           "' is a name " + config + " knows"),
                                                 HasSubstr("refused")));
  };
  EXPECT_THAT(CheckProviderAddress("lambda", "prod", ""), known("prod"));
  EXPECT_THAT(CheckProviderAddress("lambda", "PROD", ""), known("PROD"));  // as ssh matches: any case
  EXPECT_THAT(CheckProviderAddress("lambda", "db.corp.example", ""), known("db.corp.example"));
  EXPECT_THAT(CheckProviderAddress("lambda", "1:2:3", ""),
              StatusIs(StatusCode::kDataLoss, HasSubstr("neither an IP address nor a host name")));
  // Another config file (--ssh-config) is the one asked.
  testing::WriteWholeFile(home_.path() + "/other_config", "Host gpu-7.cloud.example\n  User me\n");
  EXPECT_THAT(CheckProviderAddress("lambda", "gpu-7.cloud.example", home_.path() + "/other_config"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("other_config knows")));
  // `up`: refused before any SSH; the instance is given back.
  provider_.address = "prod";
  EXPECT_THAT(RunUp(), StatusIs(StatusCode::kDataLoss, HasSubstr("'prod' is a name")));
  EXPECT_TRUE(ready_hosts_.empty());
  EXPECT_THAT(provider_.terminated, ElementsAre("i-1"));
}

// --replace-lost names the replacements <name>-2, -3, ...: always a valid name, however long the
// first, and never the first's own.
TEST(HostNamesTest, ReplacementsAndDefaultsStayWithin63Characters) {
  EXPECT_EQ(ReplacementHostName("box", 2), "box-2");
  EXPECT_EQ(ReplacementHostName("box", 11), "box-11");
  const std::string ends_like_a_replacement = "b" + std::string(60, 'x') + "-2";  // 63 characters
  for (const std::string& first : {std::string(62, 'a'), std::string(63, 'c'), ends_like_a_replacement}) {
    ASSERT_TRUE(CheckRentedHostName(first).ok());
    std::set<std::string> names = {first};
    for (int n = 2; n <= 12; ++n) {
      const std::string name = ReplacementHostName(first, n);
      SCOPED_TRACE(name);
      EXPECT_TRUE(CheckRentedHostName(name).ok());
      EXPECT_THAT(name, EndsWith("-" + std::to_string(n)));
      EXPECT_TRUE(names.insert(name).second) << "a name used before";
    }
  }
  const std::string long_default = DefaultHostName(std::string(63, 'p'), "H100 SXM");
  EXPECT_TRUE(CheckRentedHostName(long_default).ok()) << long_default;
  EXPECT_THAT(long_default.substr(0, long_default.size() - 4), EndsWith("-h100sxm-"));
}

TEST_F(RentalTest, HostsListsRecordsAndFlagsOrphans) {
  ASSERT_TRUE(RunUp().ok());
  Instance stray;
  stray.id = "i-99", stray.name = "someone-else", stray.state = InstanceState::kRunning,
  stray.status = "active";
  provider_.instances["i-99"] = stray;
  auto rows = ListRentedHosts({&provider_}, registry_);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_FALSE(rows[0].orphan);
  ASSERT_TRUE(rows[0].record && rows[0].instance);
  EXPECT_EQ(rows[0].record->name, "box");
  EXPECT_EQ(rows[0].instance->status, "active");
  EXPECT_TRUE(rows[1].orphan);
  EXPECT_EQ(rows[1].instance->id, "i-99");
}

TEST(RentedHostsTest, NamesAreCheckedAndARentedNameBecomesItsSshTarget) {
  TempDir dir("rented");
  ::setenv("XDG_CONFIG_HOME", dir.path().c_str(), 1);
  EXPECT_THAT(CheckRentedHostName("user@box"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("letters")));
  EXPECT_THAT(CheckRentedHostName("-box"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("letters")));
  EXPECT_TRUE(CheckRentedHostName("lambda-h100-1a2b").ok());
  RentedHost h;
  h.name = "pod1", h.provider = "runpod", h.instance_id = "p1", h.state = "up";
  h.ssh_user = "root", h.ssh_host = "203.0.113.5", h.ssh_port = 40022, h.identity_file = "/keys/id";
  h.sftd = "/opt/sftd", h.agent_data_dir = "/workspace/sftd", h.known_hosts = "/k/pod1";
  ASSERT_TRUE(RentedHosts().Put(h).ok());
  auto opts = MakeConnectOptions(RemoteOptions{}, "pod1");
  ASSERT_TRUE(opts.ok());
  EXPECT_EQ(opts->host, "root@203.0.113.5:40022");
  EXPECT_EQ(opts->identity_file, "/keys/id");
  EXPECT_EQ(opts->sftd, "/opt/sftd");
  EXPECT_EQ(opts->agent_data_dir, "/workspace/sftd");
  EXPECT_EQ(opts->known_hosts_file, "/k/pod1");
  // A job recorded with the SSH target finds the host's known_hosts file too.
  NodeRecord node;
  node.host = "root@203.0.113.5:40022";
  EXPECT_EQ(node.ToConnectOptions().known_hosts_file, "/k/pod1");
  RemoteOptions given;
  given.sftd = "/other/sftd";
  EXPECT_EQ(MakeConnectOptions(given, "pod1")->sftd, "/other/sftd");  // a flag wins
  h.state = "down";
  ASSERT_TRUE(RentedHosts().Put(h).ok());
  EXPECT_EQ(MakeConnectOptions(RemoteOptions{}, "pod1")->host, "pod1");  // gone: an ordinary name again
  // Its jobs went with it: a job recorded there is not dialled (ConnectNode says why at once)...
  h.ended_unix_ms = 1700000000000;
  ASSERT_TRUE(RentedHosts().Put(h).ok());
  EXPECT_EQ(RentedHosts().FindGivenBack("root@203.0.113.5:40022").value_or(RentedHost()).name, "pod1");
  EXPECT_EQ(RentedHosts().FindGivenBack("pod1").value_or(RentedHost()).name, "pod1");
  EXPECT_EQ(RentedHosts().FindGivenBack("root@203.0.113.6:40022"), std::nullopt);
  EXPECT_THAT(ConnectNode(node),
              StatusIs(StatusCode::kUnavailable, HasSubstr("it was the rented host pod1, given back")));
  // ... unless a host rented since has that address: then it is that one's.
  RentedHost reused = h;
  reused.name = "pod2", reused.instance_id = "p2", reused.state = "up", reused.ended_unix_ms = 0;
  ASSERT_TRUE(RentedHosts().Put(reused).ok());
  EXPECT_EQ(RentedHosts().FindGivenBack("root@203.0.113.5:40022"), std::nullopt);
  ::unsetenv("XDG_CONFIG_HOME");
}

TEST(RentedHostsTest, ACorruptRegistryIsDataLossNamingTheFile) {
  TempDir dir("rented");
  const std::string path = dir.path() + "/hosts.json";
  testing::WriteWholeFile(path, "{\"hosts\": 7}");
  EXPECT_THAT(RentedHosts(path).Load(), StatusIs(StatusCode::kDataLoss, HasSubstr(path)));
}

class ProviderConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("LAMBDA_API_KEY");
    ::unsetenv("RUNPOD_API_KEY");
    ::unsetenv("FAKE_LAMBDA_API_KEY");
    config_.config_dir = dir_.path();
  }
  void TearDown() override {
    for (const char* v : {"LAMBDA_API_KEY", "FAKE_LAMBDA_API_KEY", "MINE_API_KEY", "AWS_SECRET_ACCESS_KEY",
                          kProviderOverridesVariable})
      ::unsetenv(v);
  }
  void WriteConfig(const std::string& text) {
    testing::WriteWholeFile(dir_.path() + "/providers.json", text);
  }
  TempDir dir_{"providers"};
  ProviderConfig config_;
};

TEST_F(ProviderConfigTest, BuiltInsNeedAKeyFromTheEnvironmentOrA0600File) {
  EXPECT_THAT(FindProviderProfile("lambda", config_),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("set LAMBDA_API_KEY")));
  ::setenv("LAMBDA_API_KEY", "env-key", 1);
  auto p = FindProviderProfile("lambda", config_);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->api_key, "env-key");
  EXPECT_EQ(p->api_url, "https://cloud.lambda.ai/api/v1");
  ::unsetenv("LAMBDA_API_KEY");

  std::filesystem::create_directories(dir_.path() + "/keys");
  const std::string key = dir_.path() + "/keys/runpod";
  testing::WriteWholeFile(key, "file-key\n");
  ::chmod(key.c_str(), 0644);
  EXPECT_THAT(FindProviderProfile("runpod", config_),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("chmod 600")));
  ::chmod(key.c_str(), 0600);
  EXPECT_EQ(FindProviderProfile("runpod", config_)->api_key, "file-key");
  EXPECT_THAT(FindProviderProfile("vast", config_),
              StatusIs(StatusCode::kNotFound, HasSubstr("known: lambda, runpod")));
}

TEST_F(ProviderConfigTest, TheFileAddsProfilesAndNeverHoldsKeys) {
  WriteConfig(R"({"providers": {"fake-lambda": {"type": "lambda", "api_url": "http://127.0.0.1:9/api/v1/",
                                                "ssh_port": 2222, "ssh_user": "root"}}})");
  ::setenv("FAKE_LAMBDA_API_KEY", "k", 1);
  auto p = FindProviderProfile("fake-lambda", config_);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->type, "lambda");
  EXPECT_EQ(p->api_url, "http://127.0.0.1:9/api/v1");
  EXPECT_EQ(p->ssh_port, 2222);
  EXPECT_EQ(p->ssh_user, "root");

  WriteConfig(R"({"providers": {"mine": {"type": "lambda", "api_url": "https://x", "api_key": "oops"}}})");
  EXPECT_THAT(LoadProviderProfiles(config_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'providers.mine.api_key'")));
  WriteConfig(R"({"providers": {"mine": {"type": "vast", "api_url": "https://x"}}})");
  EXPECT_THAT(LoadProviderProfiles(config_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("'vast' is not one of lambda, runpod")));
  WriteConfig(R"({"providers": {"mine": {"type": "runpod", "api_url": "file:///etc"}}})");
  EXPECT_THAT(LoadProviderProfiles(config_), StatusIs(StatusCode::kInvalidArgument, HasSubstr("api_url")));
  WriteConfig("not json");
  EXPECT_THAT(LoadProviderProfiles(config_), StatusIs(StatusCode::kDataLoss, HasSubstr("providers.json")));
}

// The key goes with every request: https, or http only to this machine (the tests' stand-ins).
TEST_F(ProviderConfigTest, AKeyGoesOnlyOverHttpsOrToThisMachine) {
  ::setenv("MINE_API_KEY", "k", 1);
  const std::string file = dir_.path() + "/providers.json";
  WriteConfig(R"({"providers": {"mine": {"type": "lambda", "api_url": "http://api.example.com/v1"}}})");
  EXPECT_THAT(LoadProviderProfiles(config_),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(file + ": field 'providers.mine.api_url'"), HasSubstr("https://"))));
  WriteConfig(R"({"providers": {"mine": {"type": "lambda", "api_url": "http://127.0.0.1@evil.example/"}}})");
  EXPECT_THAT(LoadProviderProfiles(config_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'providers.mine.api_url'")));
  for (const std::string url :
       {"http://127.0.0.1:9/api/v1", "http://[::1]:9", "http://localhost:9", "https://api.example.com/v1"}) {
    WriteConfig(R"({"providers": {"mine": {"type": "lambda", "api_url": ")" + url + R"("}}})");
    auto p = FindProviderProfile("mine", config_);
    EXPECT_TRUE(p.ok()) << url << ": " << p.status().message();
  }
}

// providers.json is meant to be shared: a copy of someone else's must not decide which secret is
// sent (api_key_env) or where a built-in profile's key goes (its api_url), unless the user opted in
// on this machine (SFTCTL_PROVIDER_OVERRIDES).
TEST_F(ProviderConfigTest, ACopiedFileCannotPickTheSecretOrMoveABuiltInKeyWithoutTheUsersOptIn) {
  ::setenv("AWS_SECRET_ACCESS_KEY", "aws-secret", 1);
  ::setenv("LAMBDA_API_KEY", "lambda-key", 1);
  const std::string file = dir_.path() + "/providers.json";
  const std::string other_variable =
      R"({"providers": {"mine": {"type": "lambda", "api_url": "https://api.example.com",
                                 "api_key_env": "AWS_SECRET_ACCESS_KEY"}}})";
  const std::string moved_builtin =
      R"({"providers": {"lambda": {"api_url": "https://evil.example/api/v1"}}})";
  WriteConfig(other_variable);
  EXPECT_THAT(
      LoadProviderProfiles(config_),
      StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr(file + ": field 'providers.mine.api_key_env'"),
                                                   HasSubstr("not this profile's own variable MINE_API_KEY"),
                                                   HasSubstr("SFTCTL_PROVIDER_OVERRIDES=mine"))));
  WriteConfig(moved_builtin);
  EXPECT_THAT(LoadProviderProfiles(config_),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(file + ": field 'providers.lambda.api_url'"),
                             HasSubstr("LAMBDA_API_KEY"), HasSubstr("SFTCTL_PROVIDER_OVERRIDES=lambda"))));
  // Naming the profile's own variable is no override.
  WriteConfig(R"({"providers": {"mine": {"type": "lambda", "api_url": "https://api.example.com",
                                         "api_key_env": "MINE_API_KEY"}}})");
  EXPECT_TRUE(LoadProviderProfiles(config_).ok());
  // The user's own opt-in, outside the file.
  ::setenv(kProviderOverridesVariable, "other,mine,lambda", 1);
  WriteConfig(other_variable);
  auto mine = FindProviderProfile("mine", config_);
  ASSERT_TRUE(mine.ok()) << mine.status().message();
  EXPECT_EQ(mine->api_key, "aws-secret");
  WriteConfig(moved_builtin);
  auto lambda = FindProviderProfile("lambda", config_);
  ASSERT_TRUE(lambda.ok()) << lambda.status().message();
  EXPECT_EQ(lambda->api_url, "https://evil.example/api/v1");
}

TEST(ProviderConfigNames, KeyVariables) {
  EXPECT_EQ(DefaultKeyVariable("lambda"), "LAMBDA_API_KEY");
  EXPECT_EQ(DefaultKeyVariable("fake-lambda"), "FAKE_LAMBDA_API_KEY");
}

}  // namespace
}  // namespace sftctl::client::cloud
