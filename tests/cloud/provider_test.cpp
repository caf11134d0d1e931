// The Lambda Cloud and RunPod providers (client/cloud/lambda_cloud.h, runpod.h) against
// tests/util/fake_cloud.py, and the shared retry policy (provider_api.h) against a scripted HttpClient.
// Time is a ManualClock: it moves only when the code under test sleeps, so a test reads exactly how
// long the provider waited (Retry-After, launch spacing) and nothing really sleeps.
#include "client/cloud/provider.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "client/cloud/lambda_cloud.h"
#include "client/cloud/provider_api.h"
#include "client/cloud/provider_factory.h"
#include "client/cloud/runpod.h"
#include "tests/util/fake_cloud.h"
#include "tests/util/file_util.h"
#include "tests/util/offset_clock.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/wait_for.h"

namespace sftctl::client::cloud {
namespace {

using ::sftctl::testing::FakeCloud;
using ::sftctl::testing::ManualClock;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WaitFor;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using json = nlohmann::json;
using std::chrono::seconds;

constexpr char kKey[] = "sk-test-9f8e7d6c5b4a";
constexpr char kPublicKey[] =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZha2Uta2V5LWZvci10ZXN0cy0xMjM0NTY3OA user@laptop";

// Seconds the clock moved since it started.
double Elapsed(const ManualClock& clock) {
  return std::chrono::duration<double>(clock.Now().time_since_epoch()).count();
}

json LambdaCatalog() {
  return {{"offers",
           {{{"id", "gpu_1x_h100_sxm5"},
             {"gpu", "H100 (80 GB SXM5)"},
             {"gpu_count", 1},
             {"price_per_hour", 3.29},
             {"vcpus", 26},
             {"memory_gib", 225},
             {"regions", {{"us-east-1", true}, {"us-west-2", false}, {"us-south-1", true}}}},
            {{"id", "gpu_8x_a100"},
             {"gpu", "A100 (40 GB SXM4)"},
             {"gpu_count", 8},
             {"price_per_hour", 10.32},
             {"regions", {{"us-east-1", false}}}}}}};
}

json RunPodCatalog() {
  return {{"offers",
           {{{"id", "NVIDIA H100 80GB HBM3"},
             {"gpu", "H100 SXM"},
             {"gpu_memory_gib", 80},
             {"price_per_hour", 2.69},
             {"max_count", 8},
             {"regions", {{"US-TX-3", true}, {"EU-RO-1", false}}}},
            {{"id", "NVIDIA A40"},
             {"gpu", "A40"},
             {"gpu_memory_gib", 48},
             {"price_per_hour", 0.4},
             {"max_count", 2},
             {"regions", {{"US-KS-2", true}}}}}}};
}

class ProviderTest : public ::testing::Test {
 protected:
  // Starts the fake in `dialect` with `config` and makes the provider for it (api key kKey unless
  // `key` says otherwise).
  void Start(const std::string& dialect, const json& config, const std::vector<std::string>& args = {},
             const std::string& key = kKey) {
    ASSERT_TRUE(fake_.Start(tmp_.path(), dialect, kKey, config, args));
    profile_.name = "fake-" + dialect;
    profile_.type = dialect;
    profile_.api_url = fake_.api_url();
    profile_.api_key = key;
    auto p = NewProvider(profile_, CurlHttpClient(), &clock_);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    provider_ = std::move(p).value();
  }

  LaunchRequest Request(const Offer& offer, const std::string& name = "sftctl-test-1") {
    LaunchRequest r;
    r.offer = offer;
    r.name = name;
    r.ssh_public_key = kPublicKey;
    return r;
  }

  // The one offer of `gpu` (fails the test when there is not exactly one).
  Offer OneOffer(const std::string& gpu) {
    auto offers = provider_->ListOffers(gpu, 0);
    EXPECT_TRUE(offers.ok()) << offers.status().ToString();
    if (!offers.ok() || offers->size() != 1) {
      ADD_FAILURE() << "expected one offer of " << gpu;
      return Offer{};
    }
    return offers->front();
  }

  TempDir tmp_{"cloud-provider"};
  FakeCloud fake_;
  ManualClock clock_;
  ProviderProfile profile_;
  std::unique_ptr<CloudProvider> provider_;
};

// ---- offers ----

TEST_F(ProviderTest, LambdaOffersAreTheRegionsWithCapacityWithPricesAndSpecs) {
  Start("lambda", LambdaCatalog());
  auto all = provider_->ListOffers("", 0);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 2u);  // the H100 in two regions; us-west-2 and the A100 have no capacity
  std::vector<std::string> regions;
  for (const Offer& o : *all) {
    regions.push_back(o.region);
    EXPECT_EQ(o.provider, "fake-lambda");
    EXPECT_EQ(o.instance_type, "gpu_1x_h100_sxm5");
    EXPECT_EQ(o.gpu, "H100 (80 GB SXM5)");
    EXPECT_EQ(o.gpu_count, 1);
    EXPECT_EQ(o.gpu_memory_gib, 80);
    EXPECT_DOUBLE_EQ(o.price_per_hour, 3.29);
    EXPECT_EQ(o.vcpus, 26);
    EXPECT_EQ(o.memory_gib, 225);
  }
  EXPECT_THAT(regions, ::testing::UnorderedElementsAre("us-east-1", "us-south-1"));

  auto h100 = provider_->ListOffers("h100", 1);  // case-insensitive, exact count
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->size(), 2u);
  auto eight = provider_->ListOffers("H100", 8);
  ASSERT_TRUE(eight.ok());
  EXPECT_TRUE(eight->empty());
  auto a100 = provider_->ListOffers("a100", 0);  // known type, no capacity anywhere
  ASSERT_TRUE(a100.ok());
  EXPECT_TRUE(a100->empty());
  for (const json& e : fake_.Log()) EXPECT_TRUE(e["auth"].get<bool>()) << e.dump();
}

TEST_F(ProviderTest, RunPodOffersAreDataCentersWithStockForTheGpuCount) {
  Start("runpod", RunPodCatalog());
  auto four = provider_->ListOffers("", 4);
  ASSERT_TRUE(four.ok()) << four.status().ToString();
  ASSERT_EQ(four->size(), 1u);  // the A40 has at most 2 GPUs a pod; EU-RO-1 has no stock
  const Offer& o = four->front();
  EXPECT_EQ(o.provider, "fake-runpod");
  EXPECT_EQ(o.instance_type, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(o.gpu, "H100 SXM");
  EXPECT_EQ(o.gpu_count, 4);
  EXPECT_EQ(o.gpu_memory_gib, 80);
  EXPECT_EQ(o.region, "US-TX-3");
  EXPECT_DOUBLE_EQ(o.price_per_hour, 4 * 2.69);
  auto catalog = fake_.Requests("GET", "/v2/catalog/gpus");
  ASSERT_EQ(catalog.size(), 1u);
  EXPECT_THAT(catalog[0]["path"].get<std::string>(),
              AllOf(HasSubstr("include=AVAILABILITY"), HasSubstr("product=POD"), HasSubstr("count=4")));

  auto a40 = provider_->ListOffers("a40", 0);  // any count: one GPU
  ASSERT_TRUE(a40.ok());
  ASSERT_EQ(a40->size(), 1u);
  EXPECT_EQ((*a40)[0].region, "US-KS-2");
  EXPECT_EQ((*a40)[0].gpu_count, 1);
  EXPECT_DOUBLE_EQ((*a40)[0].price_per_hour, 0.4);
}

// ---- errors ----

TEST_F(ProviderTest, NoCapacityAtLaunchIsResourceExhausted) {
  for (const std::string dialect : {"lambda", "runpod"}) {
    SCOPED_TRACE(dialect);
    json config = dialect == "lambda" ? LambdaCatalog() : RunPodCatalog();
    const std::string id = dialect == "lambda" ? "gpu_1x_h100_sxm5" : "NVIDIA H100 80GB HBM3";
    config["capacity_fail"] = {id};
    fake_.Stop();
    Start(dialect, config);
    auto offers = provider_->ListOffers("h100", 1);
    ASSERT_TRUE(offers.ok() && !offers->empty()) << offers.status().ToString();
    const Offer offer = offers->front();
    EXPECT_THAT(provider_->Launch(Request(offer)),
                StatusIs(StatusCode::kResourceExhausted, StartsWith("fake-" + dialect + ": ")));
    ASSERT_TRUE(fake_.State()["instances"].empty());
  }
}

TEST_F(ProviderTest, A429IsRetriedAfterItsRetryAfter) {
  json config = LambdaCatalog();
  config["rate_limit_once"] = true;
  Start("lambda", config);
  auto offers = provider_->ListOffers("", 0);
  ASSERT_TRUE(offers.ok()) << offers.status().ToString();
  EXPECT_EQ(offers->size(), 2u);
  EXPECT_DOUBLE_EQ(Elapsed(clock_), 1.0);  // Retry-After: 1, on the clock
  auto calls = fake_.Requests("GET", "/api/v1/instance-types");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["status"], 429);
  EXPECT_EQ(calls[1]["status"], 200);
}

TEST_F(ProviderTest, AWrongKeyIsUnauthenticatedAndNoKeyIsInTheMessage) {
  const std::string wrong = "sk-wrong-0123456789abcdef";
  for (const std::string dialect : {"lambda", "runpod"}) {
    SCOPED_TRACE(dialect);
    fake_.Stop();
    Start(dialect, dialect == "lambda" ? LambdaCatalog() : RunPodCatalog(), {}, wrong);
    auto offers = provider_->ListOffers("", 0);
    EXPECT_THAT(offers, StatusIs(StatusCode::kUnauthenticated,
                                 AllOf(StartsWith("fake-" + dialect + ": "), Not(HasSubstr(wrong)),
                                       Not(HasSubstr(kKey)), Not(HasSubstr("sk-")))));
    EXPECT_THAT(provider_->GetInstance("i-1"), StatusIs(StatusCode::kUnauthenticated, Not(HasSubstr(wrong))));
    EXPECT_EQ(Elapsed(clock_), 0.0);  // a 401 is not retried
    for (const json& e : fake_.Log()) EXPECT_THAT(e.dump(), Not(HasSubstr(wrong)));
  }
}

ProviderProfile Profile(const std::string& type, const std::string& url) {
  ProviderProfile p;
  p.name = p.type = type;
  p.api_url = url;
  p.api_key = kKey;
  return p;
}

// An HttpClient that answers from a script and records what it was sent.
class ScriptedHttp final : public HttpClient {
 public:
  std::deque<StatusOr<HttpResponse>> answers;
  std::vector<HttpRequest> sent;
  StatusOr<HttpResponse> Send(const HttpRequest& req, const HttpSink&, const HttpHeadersCheck&) override {
    sent.push_back(req);
    if (answers.empty()) return UnavailableError("script ran out");
    StatusOr<HttpResponse> r = answers.front();
    answers.pop_front();
    return r;
  }
};

HttpResponse Answer(long status, const std::string& body, std::map<std::string, std::string> headers = {}) {
  HttpResponse r;
  r.status = status;
  r.body = body;
  r.headers = std::move(headers);
  return r;
}

TEST(ProviderApiTest, TheKeyIsRedactedEvenWhenTheProviderOrTheTransportEchoesIt) {
  ScriptedHttp http;
  ManualClock clock;
  ProviderProfile profile = Profile("lambda", "https://cloud.example/api/v1");
  auto p = NewProvider(profile, &http, &clock);
  ASSERT_TRUE(p.ok());
  http.answers.push_back(Answer(
      401, json({{"error",
                  {{"code", "global/invalid-api-key"}, {"message", std::string("key ") + kKey + " is bad"}}}})
               .dump()));
  EXPECT_THAT((*p)->ListOffers("", 0),
              StatusIs(StatusCode::kUnauthenticated, AllOf(Not(HasSubstr(kKey)), HasSubstr("<redacted>"))));
  ASSERT_EQ(http.sent.size(), 1u);
  EXPECT_THAT(http.sent[0].headers, ::testing::Contains(std::make_pair(std::string("Authorization"),
                                                                       std::string("Bearer ") + kKey)));
  http.answers.push_back(InvalidArgumentError(std::string("bad URL with ") + kKey));
  EXPECT_THAT((*p)->GetInstance("x"), StatusIs(StatusCode::kInvalidArgument, Not(HasSubstr(kKey))));
}

TEST(ProviderApiTest, FiveXxIsRetriedWithBackoffButALaunchIsNot) {
  ScriptedHttp http;
  ManualClock clock;
  ProviderProfile profile = Profile("runpod", "https://api.example");
  auto p = NewProvider(profile, &http, &clock);
  ASSERT_TRUE(p.ok());
  http.answers.push_back(Answer(503, ""));
  http.answers.push_back(UnavailableError("connection refused"));
  http.answers.push_back(Answer(200, R"({"pods": []})"));
  auto pods = (*p)->ListInstances();
  ASSERT_TRUE(pods.ok()) << pods.status().ToString();
  EXPECT_TRUE(pods->empty());
  EXPECT_EQ(http.sent.size(), 3u);
  EXPECT_DOUBLE_EQ(Elapsed(clock), 1.0 + 2.0);  // 1 s, then 2 s

  http.sent.clear();
  http.answers.push_back(Answer(502, R"({"title": "Bad Gateway", "status": 502, "detail": "upstream"})"));
  Offer offer;
  offer.instance_type = "NVIDIA A40";
  offer.gpu_count = 1;
  LaunchRequest req{offer, "sftctl-x", "", kPublicKey};
  EXPECT_THAT((*p)->Launch(req), StatusIs(StatusCode::kUnavailable, HasSubstr("upstream")));
  EXPECT_EQ(http.sent.size(), 1u);  // it may have launched: never sent twice

  http.sent.clear();
  for (int i = 0; i < 10; ++i) http.answers.push_back(Answer(500, ""));
  const double before = Elapsed(clock);
  EXPECT_THAT((*p)->ListInstances(), StatusIs(StatusCode::kUnavailable, HasSubstr("HTTP 500")));
  EXPECT_EQ(http.sent.size(), 5u);                           // max_attempts
  EXPECT_DOUBLE_EQ(Elapsed(clock) - before, 1 + 2 + 4 + 8);  // bounded
}

TEST(ProviderApiTest, RetryAfterIsHonouredAndCappedByTheTotalWait) {
  ScriptedHttp http;
  ManualClock clock;
  auto p = NewProvider(Profile("lambda", "https://cloud.example/api/v1"), &http, &clock);
  ASSERT_TRUE(p.ok());
  http.answers.push_back(Answer(429, "", {{"retry-after", "7"}}));
  http.answers.push_back(Answer(200, R"({"data": []})"));
  ASSERT_TRUE((*p)->ListInstances().ok());
  EXPECT_DOUBLE_EQ(Elapsed(clock), 7.0);
  // Retry-After past the total wait allowed (RetryPolicy::max_total_pause, 120 s): waited 60 s (the
  // longest single pause) twice, then no further pause fits.
  http.sent.clear();
  for (int i = 0; i < 5; ++i) http.answers.push_back(Answer(429, "", {{"retry-after", "3600"}}));
  EXPECT_THAT((*p)->ListInstances(), StatusIs(StatusCode::kUnavailable, HasSubstr("HTTP 429")));
  EXPECT_EQ(http.sent.size(), 3u);
  EXPECT_DOUBLE_EQ(Elapsed(clock), 7.0 + 60 + 60);
}

TEST(ProviderApiTest, RetryAfterIsReadAsSecondsOnly) {
  EXPECT_EQ(ParseRetryAfter({{"retry-after", "7"}}), seconds(7));
  EXPECT_EQ(ParseRetryAfter({{"retry-after", " 12 "}}), seconds(12));
  EXPECT_EQ(ParseRetryAfter({{"retry-after", "Wed, 21 Oct 2026 07:28:00 GMT"}}), std::nullopt);
  EXPECT_EQ(ParseRetryAfter({}), std::nullopt);
  EXPECT_EQ(RedactSecret("a KEY b KEY", "KEY"), "a <redacted> b <redacted>");
}

// ---- instance life ----

TEST_F(ProviderTest, LambdaInstanceBootsThenRuns) {
  json config = LambdaCatalog();
  config["boot_polls"] = 2;
  Start("lambda", config);
  const Offer offer = provider_->ListOffers("h100", 1)->front();
  auto id = provider_->Launch(Request(offer, "sftctl-boot"));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  for (int i = 0; i < 2; ++i) {
    auto booting = provider_->GetInstance(*id);
    ASSERT_TRUE(booting.ok()) << booting.status().ToString();
    EXPECT_EQ(booting->state, InstanceState::kStarting);
    EXPECT_EQ(booting->status, "booting");
    EXPECT_EQ(booting->ssh_host, "");
  }
  auto up = provider_->GetInstance(*id);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_EQ(up->state, InstanceState::kRunning);
  EXPECT_EQ(up->id, *id);
  EXPECT_EQ(up->name, "sftctl-boot");
  EXPECT_EQ(up->instance_type, "gpu_1x_h100_sxm5");
  EXPECT_EQ(up->region, offer.region);
  EXPECT_EQ(up->ssh_host, "127.0.0.1");
  EXPECT_EQ(up->ssh_port, 22);
  EXPECT_EQ(up->ssh_user, "ubuntu");
  EXPECT_DOUBLE_EQ(up->price_per_hour, 3.29);
  // The key was registered once and launched with.
  json state = fake_.State();
  ASSERT_EQ(state["ssh_keys"].size(), 1u);
  EXPECT_EQ(state["ssh_keys"][0]["public_key"], kPublicKey);
}

TEST_F(ProviderTest, RunPodPodReportsItsSshPortMapping) {
  json config = RunPodCatalog();
  config["boot_polls"] = 2;
  Start("runpod", config);
  const Offer offer = OneOffer("H100");
  auto id = provider_->Launch(Request(offer, "sftctl-pod"));
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  for (int i = 0; i < 2; ++i) {
    auto booting = provider_->GetInstance(*id);
    ASSERT_TRUE(booting.ok()) << booting.status().ToString();
    EXPECT_EQ(booting->state, InstanceState::kStarting);
    EXPECT_EQ(booting->status, "PROVISIONING");
    EXPECT_EQ(booting->ssh_host, "");
  }
  auto up = provider_->GetInstance(*id);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  json state = fake_.State();
  ASSERT_EQ(state["instances"].size(), 1u);
  const int port = state["instances"][0]["ssh_port"].get<int>();
  ASSERT_GT(port, 0);
  ASSERT_NE(port, 22);
  EXPECT_EQ(up->state, InstanceState::kRunning);
  EXPECT_EQ(up->status, "RUNNING");
  EXPECT_EQ(up->name, "sftctl-pod");
  EXPECT_EQ(up->instance_type, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(up->region, "US-TX-3");
  EXPECT_EQ(up->ssh_host, "127.0.0.1");
  EXPECT_EQ(up->ssh_port, port);
  EXPECT_EQ(up->ssh_user, "root");
  EXPECT_DOUBLE_EQ(up->price_per_hour, 2.69);
  EXPECT_GT(up->created_unix_ms, 1'700'000'000'000);
  auto create = fake_.Requests("POST", "/v2/pods");
  ASSERT_EQ(create.size(), 1u);
  EXPECT_EQ(create[0]["status"], 201);
}

TEST_F(ProviderTest, TerminatedInstancesGoAway) {
  for (const std::string dialect : {"lambda", "runpod"}) {
    SCOPED_TRACE(dialect);
    fake_.Stop();
    Start(dialect, dialect == "lambda" ? LambdaCatalog() : RunPodCatalog());
    const Offer offer = provider_->ListOffers("h100", 1)->front();
    auto id = provider_->Launch(Request(offer));
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ASSERT_EQ(provider_->GetInstance(*id)->state, InstanceState::kRunning);
    ASSERT_EQ(provider_->ListInstances()->size(), 1u);
    ASSERT_TRUE(provider_->Terminate(*id).ok());
    if (dialect == "lambda") {  // "terminating" for a while; RunPod drops a pod from its list at once
      auto listed = provider_->ListInstances();
      ASSERT_TRUE(listed.ok() && listed->size() == 1u);
      EXPECT_EQ((*listed)[0].state, InstanceState::kStopping);
      EXPECT_EQ(provider_->GetInstance(*id)->state, InstanceState::kStopping);
    } else {
      EXPECT_TRUE(provider_->ListInstances()->empty());
    }
    auto last = provider_->GetInstance(*id);
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    EXPECT_EQ(last->state, InstanceState::kTerminated);
    EXPECT_THAT(provider_->GetInstance(*id), StatusIs(StatusCode::kNotFound, HasSubstr(*id)));
    EXPECT_TRUE(provider_->ListInstances()->empty());
    EXPECT_TRUE(provider_->Terminate(*id).ok());  // already gone
  }
}

TEST_F(ProviderTest, OrphansAreListed) {
  for (const std::string dialect : {"lambda", "runpod"}) {
    SCOPED_TRACE(dialect);
    fake_.Stop();
    Start(dialect, dialect == "lambda" ? LambdaCatalog() : RunPodCatalog());
    const std::string id = fake_.AddOrphan("sftctl-lost");
    ASSERT_FALSE(id.empty());
    auto all = provider_->ListInstances();
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    ASSERT_EQ(all->size(), 1u);
    EXPECT_EQ((*all)[0].id, id);
    EXPECT_EQ((*all)[0].name, "sftctl-lost");
    EXPECT_EQ((*all)[0].state, InstanceState::kRunning);
  }
}

// The contract e2e tests build on: --instance-command runs per instance with its id, the launched
// public key and the SSH port, in a process group that a terminate ends.
TEST_F(ProviderTest, InstancesAreBackedByAProcessThatTerminateEnds) {
  const std::string out = tmp_.path();
  // (The trap and the key copy come before the .env file the test waits for.)
  const std::string at = out + "/$FAKE_INSTANCE_ID";
  const std::string command = "trap 'echo term > " + at +
                              ".term; exit 0' TERM; cp \"$FAKE_AUTHORIZED_KEYS\" " + at +
                              ".keys; printf '%s %s\\n' \"$FAKE_INSTANCE_ID\" \"$FAKE_SSH_PORT\" > " + at +
                              ".env.tmp && mv " + at + ".env.tmp " + at + ".env; while :; do sleep 0.1; done";
  for (const std::string dialect : {"lambda", "runpod"}) {
    SCOPED_TRACE(dialect);
    fake_.Stop();
    Start(dialect, dialect == "lambda" ? LambdaCatalog() : RunPodCatalog(),
          {"--instance-command", command, "--ssh-port", "2299"});
    const Offer offer = provider_->ListOffers("h100", 1)->front();
    auto id = provider_->Launch(Request(offer));
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    auto up = provider_->GetInstance(*id);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    ASSERT_EQ(up->state, InstanceState::kRunning);
    const std::string env = out + "/" + *id + ".env";
    ASSERT_TRUE(WaitFor([&] { return !ReadWholeFile(env).empty(); }));
    const int port = dialect == "lambda" ? 2299 : up->ssh_port;  // RunPod: the mapping it reports
    EXPECT_EQ(ReadWholeFile(env), *id + " " + std::to_string(port) + "\n");
    EXPECT_EQ(ReadWholeFile(out + "/" + *id + ".keys"), std::string(kPublicKey) + "\n");
    json before = fake_.State()["instances"][0];
    EXPECT_TRUE(before["exit_code"].is_null());
    ASSERT_TRUE(provider_->Terminate(*id).ok());
    EXPECT_TRUE(WaitFor([&] { return !ReadWholeFile(out + "/" + *id + ".term").empty(); }));
    EXPECT_TRUE(WaitFor([&] { return fake_.State()["instances"][0]["exit_code"] == 0; }));
  }
}

// ---- keys and launches ----

TEST_F(ProviderTest, EnsureSshKeyRegistersAKeyOnce) {
  json config = LambdaCatalog();
  config["ssh_keys"] = {{{"name", "someone-else"}, {"public_key", "ssh-ed25519 AAAAother other@host"}}};
  Start("lambda", config);
  auto first = provider_->EnsureSshKey(kPublicKey);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_THAT(*first, StartsWith("sftctl-"));
  EXPECT_EQ(first->size(), std::string("sftctl-").size() + 12);
  // The same key (another comment) again: found, not added.
  const std::string material = PublicKeyMaterial(kPublicKey);
  auto second = provider_->EnsureSshKey(material + " another-comment");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(fake_.Requests("POST", "/api/v1/ssh-keys").size(), 1u);
  EXPECT_EQ(fake_.State()["ssh_keys"].size(), 2u);
  // A key registered by hand under another name is used under that name.
  auto other = provider_->EnsureSshKey("ssh-ed25519 AAAAother");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(*other, "someone-else");
  EXPECT_EQ(fake_.Requests("POST", "/api/v1/ssh-keys").size(), 1u);
  EXPECT_THAT(provider_->EnsureSshKey("not-a-key"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("OpenSSH")));
}

TEST_F(ProviderTest, LambdaLaunchesAreSpacedOnTheClock) {
  Start("lambda", LambdaCatalog(), {"--no-launch-limit"});
  const Offer offer = provider_->ListOffers("h100", 1)->front();
  auto key = provider_->EnsureSshKey(kPublicKey);
  ASSERT_TRUE(key.ok());
  LaunchRequest req = Request(offer);
  req.ssh_key_name = *key;
  ASSERT_TRUE(provider_->Launch(req).ok());
  EXPECT_EQ(Elapsed(clock_), 0.0);
  ASSERT_TRUE(provider_->Launch(req).ok());
  EXPECT_DOUBLE_EQ(Elapsed(clock_), 12.0);  // LambdaCloud::kLaunchInterval after the first
  clock_.Advance(seconds(5));
  ASSERT_TRUE(provider_->Launch(req).ok());
  EXPECT_DOUBLE_EQ(Elapsed(clock_), 12.0 + 12.0);  // 5 s had passed: 7 s more
  clock_.Advance(seconds(30));
  ASSERT_TRUE(provider_->Launch(req).ok());
  EXPECT_DOUBLE_EQ(Elapsed(clock_), 24.0 + 30.0);  // no wait
  EXPECT_EQ(fake_.State()["launches"], 4);
}

TEST_F(ProviderTest, TheFakeEnforcesLambdasLaunchLimit) {
  Start("lambda", LambdaCatalog());
  const Offer offer = provider_->ListOffers("h100", 1)->front();
  ASSERT_TRUE(provider_->Launch(Request(offer)).ok());
  // A second client (its own spacing) launching at once: 429s with Retry-After, retried on the clock
  // (which the fake does not see), until the retries run out.
  auto other = NewProvider(profile_, CurlHttpClient(), &clock_);
  ASSERT_TRUE(other.ok());
  const double before = Elapsed(clock_);
  EXPECT_THAT((*other)->Launch(Request(offer, "sftctl-second")),
              StatusIs(StatusCode::kUnavailable, HasSubstr("HTTP 429")));
  auto launches = fake_.Requests("POST", "/api/v1/instance-operations/launch");
  ASSERT_EQ(launches.size(), 1u + 5u);
  for (size_t i = 1; i < launches.size(); ++i) EXPECT_EQ(launches[i]["status"], 429);
  EXPECT_GE(Elapsed(clock_) - before, 4 * 10.0);  // four Retry-After pauses of about 12 s
  EXPECT_EQ(fake_.State()["launches"], 1);
}

// ---- shapes ----

TEST_F(ProviderTest, AMalformedAnswerIsDataLoss) {
  for (const std::string dialect : {"lambda", "runpod"}) {
    SCOPED_TRACE(dialect);
    json config = dialect == "lambda" ? LambdaCatalog() : RunPodCatalog();
    config["malformed"] = {"catalog", "instance"};
    fake_.Stop();
    Start(dialect, config);
    EXPECT_THAT(provider_->ListOffers("", 0), StatusIs(StatusCode::kDataLoss, StartsWith("fake-" + dialect)));
    const std::string id = fake_.AddOrphan("sftctl-odd");
    ASSERT_FALSE(id.empty());
    EXPECT_THAT(provider_->GetInstance(id), StatusIs(StatusCode::kDataLoss, HasSubstr("unexpected answer")));
  }
}

// An answer nested 150,000 deep (300 KB) is refused by the bounded parse before anything copies or
// walks it: DATA_LOSS naming the profile and the nesting, for every call that reads an answer.
TEST_F(ProviderTest, AnAnswerNestedTooDeepIsDataLossNotACrash) {
  for (const std::string dialect : {"lambda", "runpod"}) {
    SCOPED_TRACE(dialect);
    json config = dialect == "lambda" ? LambdaCatalog() : RunPodCatalog();
    config["deep"] = {"catalog", "instance", "list", "terminate"};
    fake_.Stop();
    Start(dialect, config);
    const auto deep = StatusIs(StatusCode::kDataLoss, AllOf(StartsWith("fake-" + dialect + ": "),
                                                            HasSubstr("JSON nested more than 64 levels deep"),
                                                            Not(HasSubstr(kKey))));
    EXPECT_THAT(provider_->ListOffers("", 0), deep);
    EXPECT_THAT(provider_->ListInstances(), deep);
    const std::string id = fake_.AddOrphan("sftctl-deep");
    ASSERT_FALSE(id.empty());
    EXPECT_THAT(provider_->GetInstance(id), deep);
    EXPECT_THAT(provider_->Terminate(id), deep);
    EXPECT_EQ(fake_.State()["instances"][0]["phase"], "terminating") << "the terminate itself went out";
  }
}

TEST(NewProviderTest, KnowsLambdaAndRunPodOnly) {
  ProviderProfile p = Profile("vast", "");
  p.name = "mine";
  EXPECT_THAT(NewProvider(p, CurlHttpClient()), StatusIs(StatusCode::kInvalidArgument, HasSubstr("'vast'")));
  p.type = "lambda";
  auto lambda = NewProvider(p, CurlHttpClient());
  ASSERT_TRUE(lambda.ok());
  EXPECT_EQ((*lambda)->profile().api_url, "https://cloud.lambda.ai/api/v1");
  p.type = "runpod";
  auto runpod = NewProvider(p, CurlHttpClient());
  ASSERT_TRUE(runpod.ok());
  EXPECT_EQ((*runpod)->profile().api_url, "https://api.runpod.io");
  EXPECT_STREQ(InstanceStateName(InstanceState::kRunning), "running");
  EXPECT_STREQ(InstanceStateName(InstanceState::kTerminated), "terminated");
  EXPECT_EQ(LambdaState("preempted"), InstanceState::kTerminated);
  EXPECT_EQ(RunPodState("EXITED"), InstanceState::kStopping);
  EXPECT_EQ(ParseRfc3339Millis("2026-06-01T12:00:00.250Z"), 1780315200250);
  EXPECT_EQ(ParseRfc3339Millis("yesterday"), 0);
}

}  // namespace
}  // namespace sftctl::client::cloud
