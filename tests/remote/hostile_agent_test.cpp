// The client against a hostile or flaky agent (the laptop does not trust the GPU host):
//   - pull (client/transfer/pull_plan.h): listed paths that would escape the destination are refused
//     before anything is written, a symbolic link in the way is refused, and a checkpoint's DONE
//     marker is fetched last, so an interrupted pull never leaves a folder the trainer would
//     resume from;
//   - logs: control sequences in the agent's text never reach the terminal raw, and a metric
//     record with unexpected field types is shown, not thrown;
//   - submit: a job id that could not name a folder is refused, and --accept-new-host-key is
//     not recorded for later reconnects.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

#include "client/remote/agent_session.h"
#include "client/remote/job_registry.h"
#include "client/remote/log_follower.h"
#include "client/transfer/checkpoint_sync.h"
#include "client/transfer/pull_plan.h"
#include "client/transfer/puller.h"
#include "common/sha256.h"
#include "tests/remote/remote_test_util.h"
#include "tests/util/in_process_agent.h"
#include "tests/util/status_matchers.h"

namespace sftctl::remotetest {
namespace {

namespace v1 = ::sftctl::v1;
namespace fs = std::filesystem;
using ::sftctl::testing::InProcessAgent;
using ::sftctl::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// Serves `files` (job-relative path -> bytes) whole, in one chunk each.
class MapAgent final : public v1::Agent::Service {
 public:
  std::map<std::string, std::string> files;
  std::vector<std::string> pulled;
  std::vector<v1::Event> events;  // served by StreamEvents, then the stream ends

  grpc::Status PullArtifact(grpc::ServerContext*, const v1::PullArtifactRequest* req,
                            grpc::ServerWriter<v1::ArtifactChunk>* w) override {
    auto it = files.find(req->path());
    if (it == files.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, req->path());
    pulled.push_back(req->path());
    v1::ArtifactChunk c;
    c.set_offset(req->offset());
    c.set_total_size(it->second.size());
    c.set_sha256(Sha256Hex(it->second));
    c.set_data(it->second.substr(req->offset()));
    w->Write(c);
    return grpc::Status::OK;
  }

  grpc::Status StreamEvents(grpc::ServerContext*, const v1::StreamEventsRequest*,
                            grpc::ServerWriter<v1::StreamEventsResponse>* w) override {
    v1::StreamEventsResponse resp;
    for (const auto& e : events) *resp.add_events() = e;
    w->Write(resp);
    return grpc::Status::OK;
  }
};

// A listing the way the agent makes it: byte-sorted, so "DONE" sorts before "model.safetensors".
v1::ListArtifactsResponse Listing(const std::map<std::string, std::string>& files, int64_t step) {
  v1::ListArtifactsResponse list;
  for (const auto& [path, data] : files) {
    v1::Artifact* a = list.add_artifacts();
    a->set_path(path);
    a->set_size(data.size());
    a->set_sha256(Sha256Hex(data));
    const bool in_ckpt = path.rfind("run/checkpoint-", 0) == 0;
    a->set_checkpoint_step(in_ckpt ? step : -1);
    a->set_checkpoint_complete(in_ckpt);
  }
  return list;
}

class PullPlanTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.Start(&agent_)); }

  std::unique_ptr<client::Reconnector> MakeReconnector() { return server_.NewReconnector(2); }

  MapAgent agent_;
  InProcessAgent server_;  // (after agent_: it shuts down first)
  TempDir tmp_;
};

TEST_F(PullPlanTest, RefusesListedPathsThatEscapeTheDestinationAndWritesNothing) {
  const std::string dir = tmp_.path() + "/out";
  const std::vector<std::string> hostile = {
      "run/checkpoint-000001/../../../../home/u/.bash_aliases",
      "run/checkpoint-000001//etc/passwd",
      "run/checkpoint-000001/./x",
      "run/checkpoint-000001/title\x1b]0;pwned\x07",
  };
  for (const auto& bad : hostile) {
    std::map<std::string, std::string> files = {
        {"run/checkpoint-000001/DONE", "x"}, {"run/checkpoint-000001/model.safetensors", "w"}, {bad, "evil"}};
    auto plan = client::PlanPull(Listing(files, 1), -1, dir, "gpu/job-1");
    // The error is printable: the hostile name is shown escaped.
    ASSERT_THAT(plan, StatusIs(StatusCode::kInvalidArgument,
                               AllOf(HasSubstr("gpu/job-1 lists a file that cannot be pulled safely"),
                                     Not(HasSubstr("\x1b")))))
        << bad;
  }
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp_.path()), fs::directory_iterator()), 0);
}

TEST_F(PullPlanTest, RefusesASymlinkInTheDestination) {
  const std::string dir = tmp_.path() + "/out";
  fs::create_directories(dir);
  fs::create_directories(tmp_.path() + "/elsewhere");
  fs::create_directory_symlink(tmp_.path() + "/elsewhere", dir + "/checkpoint-000001");
  std::map<std::string, std::string> files = {{"run/checkpoint-000001/model.safetensors", "w"}};
  auto plan = client::PlanPull(Listing(files, 1), -1, dir, "gpu/job-1");
  EXPECT_THAT(plan, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("symbolic link")));
  EXPECT_TRUE(fs::is_empty(tmp_.path() + "/elsewhere"));
}

TEST_F(PullPlanTest, AnInterruptedPullLeavesNoDoneAndTheNextPullCompletesIt) {
  agent_.files = {{"run/checkpoint-000002/DONE", "checkpoint-000002\n"},
                  {"run/checkpoint-000002/model.safetensors", std::string(10000, 'w')},
                  {"run/checkpoint-000002/optimizer.safetensors", std::string(7000, 'o')},
                  {"run/metrics.jsonl", "{\"step\":2}\n"}};
  const std::string dir = tmp_.path() + "/out";
  auto plan = client::PlanPull(Listing(agent_.files, 2), -1, dir, "gpu/job-1");
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->items.size(), 4u);
  EXPECT_EQ(plan->checkpoint_dir, "checkpoint-000002");
  EXPECT_EQ(plan->items.back().remote_path, "run/checkpoint-000002/DONE");

  // Killed after the first file: whatever was fetched, the folder is not complete.
  auto rc = MakeReconnector();
  client::PullStats stats;
  fs::create_directories(dir);
  ASSERT_TRUE(client::PullFile(rc.get(), "job-1", plan->items[0], false, nullptr, &stats).ok());
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-000002/DONE"));

  // The next pull fetches the rest, skips what it has, and DONE arrives last.
  agent_.pulled.clear();
  for (const auto& item : plan->items) {
    Status s = client::PullFile(rc.get(), "job-1", item, false, nullptr, &stats);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  EXPECT_EQ(stats.files_skipped, 1);
  ASSERT_EQ(agent_.pulled.size(), 3u);
  EXPECT_EQ(agent_.pulled.back(), "run/checkpoint-000002/DONE");
  EXPECT_EQ(ReadWholeFile(dir + "/checkpoint-000002/model.safetensors"), std::string(10000, 'w'));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-000002/DONE"));
}

v1::Event MakeEvent(uint64_t seq, v1::Event::Kind kind, const std::string& text) {
  v1::Event e;
  e.set_seq(seq);
  e.set_kind(kind);
  e.set_text(text);
  return e;
}

TEST_F(PullPlanTest, LogsNeverPrintTheAgentsControlSequencesRaw) {
  agent_.events = {MakeEvent(1, v1::Event::STDOUT, "step 1\x1b]0;owned\x07\x1b[2J done"),
                   MakeEvent(2, v1::Event::METRIC, R"({"event":"start","device":5,"total_steps":"x"})"),
                   MakeEvent(3, v1::Event::STDERR,
                             "progress 10%\rprogress 20%\xc2\x9b"
                             "1A"),
                   MakeEvent(4, v1::Event::STATE, "reason \x1b[31mred")};
  agent_.events.back().set_state(v1::SUCCEEDED);
  auto rc = MakeReconnector();
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  auto r = client::PrintEvents(rc.get(), "job-1", 0, /*follow=*/false, /*json=*/false);
  std::cout.rdbuf(old);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::string out = captured.str();
  EXPECT_THAT(out, Not(HasSubstr("\x1b")));
  EXPECT_THAT(out, Not(HasSubstr("\xc2\x9b")));
  EXPECT_THAT(out, HasSubstr("step 1\\x1b]0;owned\\x07\\x1b[2J done\n"));
  EXPECT_THAT(out, HasSubstr("metric: {\"event\":\"start\",\"device\":5"));
  EXPECT_THAT(out, HasSubstr("progress 10%\rprogress 20%\\u009b1A\n"));  // \r kept
  EXPECT_THAT(out, HasSubstr("== SUCCEEDED: reason \\x1b[31mred"));
}

TEST(HostileJobId, OnlyNamesThatCanBeAFolderAreAccepted) {
  EXPECT_TRUE(client::CheckJobId("job-12").ok());
  EXPECT_FALSE(client::CheckJobId("job_1.retry").ok());  // job-<digits> only
  for (const std::string& bad :
       std::vector<std::string>{"", ".", "..", "../../home/u", "job/1", "job\x1b[2J", std::string(65, 'a')}) {
    Status s = client::CheckJobId(bad);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument,
                            AllOf(HasSubstr("unusable job id"), Not(HasSubstr("\x1b")))))
        << bad;
  }
}

// --accept-new-host-key records the key at submit; the registry must not carry the flag, or every
// later `logs`/`pull` would accept whatever key a swapped host presents.
TEST(RegistryTrust, AcceptNewHostKeyIsNeverRecorded) {
  TempDir tmp;
  client::ConnectOptions o;
  o.host = "gpu-box";
  o.accept_new_host_key = true;
  client::JobRecord rec;
  rec.host = "gpu-box";
  rec.id = "job-1";
  rec.nodes.push_back(client::NodeRecord::From(o, "job-1"));
  client::JobRegistry registry(tmp.path() + "/jobs.json");
  ASSERT_TRUE(registry.Add(rec).ok());
  EXPECT_THAT(ReadWholeFile(registry.path()), Not(HasSubstr("accept_new")));
  auto back = registry.Resolve("gpu-box/job-1");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->nodes[0].ToConnectOptions().accept_new_host_key);

  // A registry written by an older version that did record it is read strictly too.
  WriteWholeFile(registry.path(), R"({"version": 1, "jobs": [{"host": "gpu-box", "id": "job-2", "name": "",
    "submitted_unix_ms": 0, "nodes": [{"host": "gpu-box", "id": "job-2", "accept_new_host_key": true}]}]})");
  back = registry.Resolve("gpu-box/job-2");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->nodes[0].ToConnectOptions().accept_new_host_key);
}

// pull --follow --keep: what it removes locally. Only folders this tool pulled (recorded in the pull
// state before anything lands in them) are ever removed, ordered by the step the agent listed; a
// folder the user put there, a link named like a checkpoint and every other entry stay.
TEST(KeepNewestCheckpoints, RemovesOnlyOlderPulledFoldersAndNeverFollowsALink) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/out", outside = tmp.path() + "/outside";
  auto make = [](const std::string& folder, bool done) {
    fs::create_directories(folder);
    WriteWholeFile(folder + "/model.safetensors", "w");
    if (done) WriteWholeFile(folder + "/DONE", "");
  };
  make(dir + "/checkpoint-000001", true);  // the user's, there before any pull
  make(outside, true);
  fs::create_directory_symlink(outside, dir + "/checkpoint-000003");
  auto pulled = [&](const std::string& name, int64_t step, bool done) {
    auto recorded = client::RecordPulledCheckpoint(dir, name, step);
    ASSERT_TRUE(recorded.ok() && *recorded) << name << " " << recorded.status().ToString();
    make(dir + "/" + name, done);
  };
  pulled("checkpoint-000002", 2, true);
  pulled("checkpoint-000004", 4, false);  // a partial download the host rotated away
  pulled("checkpoint-000006", 6, true);
  pulled("checkpoint-000008", 8, true);
  pulled("checkpoint-000010", 10, false);  // newer than every complete one: in progress
  // What was there before a pull is never recorded: the user's folder, a link, a path outside.
  for (const char* name : {"checkpoint-000001", "checkpoint-000003", "../outside", "metrics.jsonl"}) {
    if (std::string(name) == "metrics.jsonl") WriteWholeFile(dir + "/metrics.jsonl", "{}\n");
    auto recorded = client::RecordPulledCheckpoint(dir, name, 99);
    ASSERT_TRUE(recorded.ok()) << recorded.status().ToString();
    EXPECT_FALSE(*recorded) << name;
  }

  // What a replacement host resumes from: the newest complete folder (not the in-progress one, not a
  // link), and what of a lost run can never be completed.
  const client::LocalCheckpoints local = client::ScanLocalCheckpoints(dir);
  EXPECT_EQ(local.newest_complete, dir + "/checkpoint-000008");
  EXPECT_THAT(local.partial, ElementsAre(dir + "/checkpoint-000004", dir + "/checkpoint-000010"));
  EXPECT_EQ(client::ScanLocalCheckpoints(tmp.path() + "/missing").newest_complete, std::nullopt);

  auto removed = client::KeepNewestCheckpoints(dir, 2);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, 2);
  for (const char* gone : {"checkpoint-000002", "checkpoint-000004"})
    EXPECT_FALSE(fs::exists(dir + "/" + gone));
  for (const char* kept : {"checkpoint-000001", "checkpoint-000003", "checkpoint-000006", "checkpoint-000008",
                           "checkpoint-000010", "metrics.jsonl"})
    EXPECT_NE(fs::symlink_status(dir + "/" + kept).type(), fs::file_type::not_found) << kept;
  EXPECT_TRUE(fs::is_symlink(dir + "/checkpoint-000003"));
  EXPECT_TRUE(fs::exists(outside + "/DONE"));
  EXPECT_TRUE(fs::exists(outside + "/model.safetensors"));
  EXPECT_EQ(*client::KeepNewestCheckpoints(dir, 1), 1);  // now checkpoint-000006
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-000006"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-000008/DONE"));
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-000001/DONE"));
}

// The listing may not write the pull state, nor spread one step over two folders.
TEST(KeepNewestCheckpoints, TheListingCannotWriteThePullState) {
  TempDir tmp;
  std::map<std::string, std::string> files = {{"run/checkpoint-000001/DONE", "x"},
                                              {std::string("run/") + client::kPullStateFile, "{}"}};
  auto plan = client::PlanPull(Listing(files, 1), -1, tmp.path(), "gpu/job-1");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->items.size(), 1u);
  EXPECT_EQ(plan->items[0].remote_path, "run/checkpoint-000001/DONE");
  files = {{"run/checkpoint-000001/DONE", "x"}, {"run/checkpoint-000002/model.safetensors", "w"}};
  EXPECT_THAT(client::PlanPull(Listing(files, 1), -1, tmp.path(), "gpu/job-1"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("gpu/job-1 lists step 1 in two folders ('checkpoint-000001' and "
                                 "'checkpoint-000002')")));
}

// Lists `listings` in turn (the last one repeats) and serves `files`; the job runs until the last
// listing has been asked for.
class FollowAgent final : public v1::Agent::Service {
 public:
  std::vector<v1::ListArtifactsResponse> listings;
  std::map<std::string, std::string> files;

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::Job* job) override {
    std::lock_guard<std::mutex> l(mu_);
    job->set_id(req->job_id());
    job->set_state(listed_ + 1 >= listings.size() ? v1::SUCCEEDED : v1::RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status ListArtifacts(grpc::ServerContext*, const v1::ListArtifactsRequest*,
                             v1::ListArtifactsResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    *resp = listings[std::min(listed_, listings.size() - 1)];
    ++listed_;
    return grpc::Status::OK;
  }
  grpc::Status PullArtifact(grpc::ServerContext*, const v1::PullArtifactRequest* req,
                            grpc::ServerWriter<v1::ArtifactChunk>* w) override {
    auto it = files.find(req->path());
    if (it == files.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, req->path());
    v1::ArtifactChunk c;
    c.set_offset(req->offset());
    c.set_total_size(it->second.size());
    c.set_sha256(Sha256Hex(it->second));
    c.set_data(it->second.substr(req->offset()));
    w->Write(c);
    return grpc::Status::OK;
  }

 private:
  std::mutex mu_;
  size_t listed_ = 0;
};

// A hostile agent names the folder of its step 3 "checkpoint-999999999". `pull --follow --keep 1`
// orders by the listed step: the user's own checkpoints in the folder are never touched, and the
// later step 4 is kept over the folder with the larger name.
TEST(KeepNewestCheckpoints, FollowKeepTrustsTheListedStepAndSparesTheUsersFolders) {
  TempDir tmp;
  const std::string dir = tmp.path() + "/out";
  for (const char* mine : {"checkpoint-000001", "checkpoint-000002"}) {
    WriteWholeFile(dir + "/" + mine + "/model.safetensors", "mine");
    WriteWholeFile(dir + "/" + mine + "/DONE", "");
  }
  FollowAgent agent;
  std::map<std::string, std::string> big = {{"run/checkpoint-999999999/DONE", "x"},
                                            {"run/checkpoint-999999999/model.safetensors", "three"}};
  std::map<std::string, std::string> four = {{"run/checkpoint-000004/DONE", "x"},
                                             {"run/checkpoint-000004/model.safetensors", "four"}};
  agent.listings = {Listing(big, 3), Listing(four, 4)};
  agent.files = big;
  agent.files.insert(four.begin(), four.end());
  InProcessAgent server;
  ASSERT_TRUE(server.Start(&agent));
  auto rc = server.NewReconnector(2);
  client::JobRecord rec;
  rec.host = "gpu";
  rec.id = "job-1";
  client::NodeRecord node;
  node.id = "job-1";
  client::SyncOptions o;
  o.dir = dir;
  o.interval_s = 0.01;
  o.keep = 1;
  o.json = true;
  std::ostringstream captured;
  std::streambuf* old = std::cout.rdbuf(captured.rdbuf());
  const int code = client::SyncCheckpoints(o, rec, node, rc.get());
  std::cout.rdbuf(old);
  EXPECT_EQ(code, 0) << captured.str();
  for (const char* mine : {"checkpoint-000001", "checkpoint-000002"})
    EXPECT_EQ(ReadWholeFile(dir + "/" + mine + "/model.safetensors"), "mine") << mine;
  EXPECT_EQ(ReadWholeFile(dir + "/checkpoint-000004/model.safetensors"), "four");
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-999999999"));
}

TEST(PullPlanMarkers, OnlyDoneMarksAFolderComplete) {
  EXPECT_TRUE(client::IsCompletionMarker("run/checkpoint-000001/DONE"));
  EXPECT_TRUE(client::IsCompletionMarker("DONE"));
  EXPECT_FALSE(client::IsCompletionMarker("run/checkpoint-000001/NOT_DONE"));
  EXPECT_FALSE(client::IsCompletionMarker("run/checkpoint-000001/DONE.part"));
}

TEST(PullPlanMarkers, TopLevelFilesAreThoseDirectlyInRun) {
  EXPECT_TRUE(client::IsRunTopLevelFile("run/metrics.jsonl"));
  EXPECT_FALSE(client::IsRunTopLevelFile("run/checkpoint-000001/model.safetensors"));
  EXPECT_FALSE(client::IsRunTopLevelFile("logs/rank-0.stdout"));
  EXPECT_FALSE(client::IsRunTopLevelFile("metrics.jsonl"));
}

}  // namespace
}  // namespace sftctl::remotetest
