// The client's resumable transfers against an in-process fake agent (real gRPC, no sockets) that
// drops streams on purpose: FollowEvents resumes with no gap or duplicate, PullFile resumes from the
// .part, UploadFile sends only what the agent does not hold. Also the registry and option helpers.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "client/remote/agent_session.h"
#include "client/remote/log_follower.h"
#include "client/remote/remote_options.h"
#include "client/transfer/puller.h"
#include "client/transfer/remote_spec.h"
#include "client/transfer/uploader.h"
#include "common/sha256.h"
#include "tests/remote/remote_test_util.h"
#include "tests/util/in_process_agent.h"
#include "tests/util/status_matchers.h"

namespace sftctl::remotetest {
namespace {

namespace v1 = ::sftctl::v1;
using client::AgentSession;
using client::Reconnector;
using ::sftctl::testing::InProcessAgent;
using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

class FakeAgent final : public v1::Agent::Service {
 public:
  // Events 1..n_events; the last is STATE SUCCEEDED. The first stream fails after `drop_after` events.
  int n_events = 50;
  int drop_after = 17;
  std::string file;            // served by PullArtifact
  size_t pull_drop_after = 0;  // bytes of the first pull before it fails (0: never)
  std::string blob;            // what UploadBlob assembles
  uint64_t held = 0;           // bytes of the blob the agent holds
  bool complete = false;
  bool always_fail = false;  // every StreamEvents fails UNAVAILABLE (a host that stays unreachable)

  std::mutex mu;
  std::vector<uint64_t> after_seqs, pull_offsets, upload_offsets;
  std::atomic<int> stream_calls{0}, pull_calls{0};

  grpc::Status StreamEvents(grpc::ServerContext*, const v1::StreamEventsRequest* req,
                            grpc::ServerWriter<v1::StreamEventsResponse>* w) override {
    const int call = stream_calls++;
    if (always_fail) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
    {
      std::lock_guard<std::mutex> l(mu);
      after_seqs.push_back(req->after_seq());
    }
    for (int seq = static_cast<int>(req->after_seq()) + 1; seq <= n_events; ++seq) {
      if (call == 0 && seq == drop_after + 1)
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "tunnel dropped");
      v1::StreamEventsResponse resp;
      v1::Event* e = resp.add_events();
      e->set_seq(static_cast<uint64_t>(seq));
      if (seq == n_events) {
        e->set_kind(v1::Event::STATE);
        e->set_state(v1::SUCCEEDED);
        e->set_rank(-1);
      } else {
        e->set_kind(v1::Event::STDOUT);
        e->set_text("line " + std::to_string(seq));
      }
      w->Write(resp);
    }
    return grpc::Status::OK;
  }

  grpc::Status PullArtifact(grpc::ServerContext*, const v1::PullArtifactRequest* req,
                            grpc::ServerWriter<v1::ArtifactChunk>* w) override {
    const int call = pull_calls++;
    {
      std::lock_guard<std::mutex> l(mu);
      pull_offsets.push_back(req->offset());
    }
    if (req->offset() > file.size()) return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "offset");
    size_t off = req->offset();
    bool first = true;
    do {
      v1::ArtifactChunk c;
      c.set_offset(off);
      if (first) {
        c.set_total_size(file.size());
        c.set_sha256(Sha256Hex(file));
        first = false;
      }
      const size_t n = std::min<size_t>(4096, file.size() - off);
      c.set_data(file.substr(off, n));
      off += n;
      w->Write(c);
      if (call == 0 && pull_drop_after > 0 && off >= pull_drop_after) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "tunnel dropped");
      }
    } while (off < file.size());
    return grpc::Status::OK;
  }

  grpc::Status StatBlob(grpc::ServerContext*, const v1::StatBlobRequest* req, v1::BlobStatus* resp) override {
    resp->set_sha256(req->sha256());
    resp->set_complete(complete);
    resp->set_size(complete ? blob.size() : held);
    return grpc::Status::OK;
  }

  grpc::Status UploadBlob(grpc::ServerContext*, grpc::ServerReader<v1::UploadBlobRequest>* r,
                          v1::BlobStatus* resp) override {
    v1::UploadBlobRequest msg;
    if (!r->Read(&msg)) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no first message");
    {
      std::lock_guard<std::mutex> l(mu);
      upload_offsets.push_back(msg.offset());
    }
    if (msg.offset() != held) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "offset differs");
    blob.resize(held);
    blob += msg.data();
    while (r->Read(&msg)) blob += msg.data();
    complete = true;
    resp->set_complete(true);
    resp->set_size(blob.size());
    return grpc::Status::OK;
  }
};

class RemoteUnit : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.Start(&agent_)); }

  // A Reconnector whose sessions are stubs on in-process channels; counts connections.
  std::unique_ptr<Reconnector> MakeReconnector() { return server_.NewReconnector(3); }

  FakeAgent agent_;
  InProcessAgent server_;  // (after agent_: it shuts down first)
};

TEST_F(RemoteUnit, FollowEventsResumesAfterADroppedStreamWithNoGapOrDuplicate) {
  auto rc = MakeReconnector();
  std::vector<uint64_t> seqs;
  auto r =
      client::FollowEvents(rc.get(), "job-1", 0, true, [&](const v1::Event& e) { seqs.push_back(e.seq()); });
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(seqs.size(), 50u);
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i + 1);
  EXPECT_EQ(r->last_seq, 50u);
  ASSERT_TRUE(r->final_state.has_value());
  EXPECT_EQ(*r->final_state, v1::SUCCEEDED);
  EXPECT_EQ(agent_.after_seqs, (std::vector<uint64_t>{0, 17}));
  EXPECT_EQ(rc->reconnects(), 1);
}

TEST_F(RemoteUnit, FollowEventsGivesUpAfterTheRetryBudgetWithAClearError) {
  agent_.drop_after = 0;
  agent_.n_events = 5;
  agent_.always_fail = true;
  auto rc = MakeReconnector();
  auto r = client::FollowEvents(rc.get(), "job-1", 0, true, [](const v1::Event&) {});
  ASSERT_THAT(r, StatusIs(StatusCode::kUnavailable,
                          HasSubstr("lost the connection to fake and could not resume after 3 attempt(s)")));
  EXPECT_EQ(client::ExitCodeFor(r.status()), 4);
  EXPECT_EQ(agent_.stream_calls.load(), 3);
}

TEST_F(RemoteUnit, PullFileResumesFromThePartAndAfterADroppedStream) {
  TempDir tmp;
  for (int i = 0; i < 50000; ++i) agent_.file += static_cast<char>('a' + i % 26 + (i / 977) % 3);
  const std::string sha = Sha256Hex(agent_.file);
  // A .part from an interrupted earlier run, and a stream that drops after ~20 KB.
  const std::string dest = tmp.path() + "/sub/model.bin";
  WriteWholeFile(dest + ".part", agent_.file.substr(0, 10000));
  agent_.pull_drop_after = 20000;
  auto rc = MakeReconnector();
  client::PullStats stats;
  client::PullItem item{"run/model.bin", dest, agent_.file.size(), sha};
  Status s = client::PullFile(rc.get(), "job-1", item, false, nullptr, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(dest), agent_.file);
  EXPECT_FALSE(std::filesystem::exists(dest + ".part"));
  ASSERT_EQ(agent_.pull_offsets.size(), 2u);
  EXPECT_EQ(agent_.pull_offsets[0], 10000u);
  EXPECT_GE(agent_.pull_offsets[1], 20000u);
  EXPECT_EQ(stats.bytes_fetched, agent_.file.size() - 10000);
  EXPECT_EQ(stats.files_fetched, 1);

  // Present with the right sha256: skipped without a request.
  s = client::PullFile(rc.get(), "job-1", item, false, nullptr, &stats);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(stats.files_skipped, 1);
  EXPECT_EQ(agent_.pull_offsets.size(), 2u);

  // Differing: refused, untouched; --force replaces it.
  WriteWholeFile(dest, "local edit");
  s = client::PullFile(rc.get(), "job-1", item, false, nullptr, &stats);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadWholeFile(dest), "local edit");
  s = client::PullFile(rc.get(), "job-1", item, true, nullptr, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(dest), agent_.file);
}

TEST_F(RemoteUnit, PullFileRefetchesAStaleResumedPart) {
  TempDir tmp;
  agent_.file = std::string(9000, 'x');
  const std::string dest = tmp.path() + "/f";
  WriteWholeFile(dest + ".part", std::string(3000, 'y'));  // not a prefix of the file
  auto rc = MakeReconnector();
  client::PullStats stats;
  Status s = client::PullFile(rc.get(), "job-1", {"run/f", dest, 9000, Sha256Hex(agent_.file)}, false,
                              nullptr, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(dest), agent_.file);
  EXPECT_EQ(agent_.pull_offsets, (std::vector<uint64_t>{3000, 0}));
}

TEST_F(RemoteUnit, UploadSendsOnlyWhatTheAgentDoesNotHold) {
  TempDir tmp;
  std::string data(300000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  WriteWholeFile(tmp.path() + "/d.bin", data);
  const std::string sha = Sha256Hex(data);
  agent_.blob = data.substr(0, 120000);
  agent_.held = 120000;
  auto rc = MakeReconnector();
  client::UploadStats stats;
  Status s = client::UploadFile(rc.get(), tmp.path() + "/d.bin", data.size(), sha, nullptr, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(agent_.blob, data);
  EXPECT_EQ(agent_.upload_offsets, (std::vector<uint64_t>{120000}));
  EXPECT_EQ(stats.bytes_sent, data.size() - 120000);
  EXPECT_EQ(stats.files_sent, 1);
  // Complete now: nothing is sent again.
  s = client::UploadFile(rc.get(), tmp.path() + "/d.bin", data.size(), sha, nullptr, &stats);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(stats.files_unchanged, 1);
  EXPECT_EQ(agent_.upload_offsets.size(), 1u);
}

TEST(RemoteSpec, FindsTheLocalFilesAndFoldersAndTheHosts) {
  TempDir tmp;
  const std::string spec = WriteTinyJob(tmp.path(), 2);
  // A model folder instead of model.config: its files (not dot files) travel as one folder.
  WriteWholeFile(tmp.path() + "/model/config.json", "{}");
  WriteWholeFile(tmp.path() + "/model/model.safetensors", "weights");
  WriteWholeFile(tmp.path() + "/model/sub/extra.txt", "x");
  WriteWholeFile(tmp.path() + "/model/.cache/huggingface/lock", "l");
  std::string yaml = ReadWholeFile(spec);
  yaml = yaml.substr(0, yaml.find("model:")) + "model:\n  path: model\nhosts: [gpu-a, gpu-b]\n" +
         yaml.substr(yaml.find("data:"));
  WriteWholeFile(tmp.path() + "/folder.yaml", yaml);
  auto r = client::LoadRemoteSpec(tmp.path() + "/folder.yaml", {"train.lr=0.01", "name=renamed"});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->hosts, (std::vector<std::string>{"gpu-a", "gpu-b"}));
  EXPECT_EQ(r->spec.name, "renamed");
  EXPECT_EQ(r->json["train"]["lr"], 0.01);
  std::vector<std::string> got;
  for (const auto& f : r->files) got.push_back(f.json_pointer + " " + f.dir_entry);
  EXPECT_EQ(got, (std::vector<std::string>{"/data/train/0 ", "/data/eval/0 ", "/model/path config.json",
                                           "/model/path model.safetensors", "/model/path sub/extra.txt"}));
  ASSERT_TRUE(client::HashSpecFiles(&r->files).ok());
  EXPECT_EQ(r->files[3].sha256, Sha256Hex("weights"));
  EXPECT_EQ(r->files[3].size, 7u);

  // A model.path that is not a folder here is a path on the host, with a note.
  yaml = ReadWholeFile(tmp.path() + "/folder.yaml");
  yaml.replace(yaml.find("path: model"), 11, "path: /opt/models/llama");
  WriteWholeFile(tmp.path() + "/hostpath.yaml", yaml);
  r = client::LoadRemoteSpec(tmp.path() + "/hostpath.yaml", {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->files.size(), 2u);
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_THAT(r->notes[0], HasSubstr("used as a path on the host"));
}

// hf:// paths are the agent's to download: kept as written (not resolved against the spec's folder),
// not uploaded, each with a note; a malformed one is refused naming the field.
TEST(RemoteSpec, KeepsHubPathsForTheAgent) {
  TempDir tmp;
  std::string yaml = ReadWholeFile(WriteTinyJob(tmp.path(), 2));
  yaml = yaml.substr(0, yaml.find("model:")) + "model:\n  path: hf://Qwen/Qwen2.5-0.5B@v1\n" +
         yaml.substr(yaml.find("data:"));
  yaml.replace(yaml.find("train: data/train.jsonl"), 23, "train: hf://datasets/org/sft/train.jsonl");
  WriteWholeFile(tmp.path() + "/hub.yaml", yaml);
  auto r = client::LoadRemoteSpec(tmp.path() + "/hub.yaml", {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->json["model"]["path"], "hf://Qwen/Qwen2.5-0.5B@v1");
  EXPECT_EQ(r->json["data"]["train"][0], "hf://datasets/org/sft/train.jsonl");
  std::vector<std::string> got;
  for (const auto& f : r->files) got.push_back(f.json_pointer);
  EXPECT_EQ(got, (std::vector<std::string>{"/data/eval/0"}));
  EXPECT_EQ(r->notes,
            (std::vector<std::string>{
                "model.path hf://Qwen/Qwen2.5-0.5B@v1 is downloaded by the agent from the Hugging Face Hub",
                "data.train hf://datasets/org/sft/train.jsonl is downloaded by the agent from the "
                "Hugging Face Hub"}));

  yaml.replace(yaml.find("hf://Qwen/Qwen2.5-0.5B@v1"), 25, "hf://Qwen");
  WriteWholeFile(tmp.path() + "/bad.yaml", yaml);
  EXPECT_EQ(client::LoadRemoteSpec(tmp.path() + "/bad.yaml", {}).status().message(),
            "field 'model.path': Hub reference 'hf://Qwen': names no ORG/NAME "
            "(expected hf://[datasets/]ORG/NAME[@REVISION][/PATH])");
}

TEST(RemoteOptions, ExitCodesAndEventRendering) {
  EXPECT_EQ(client::ExitCodeFor(InvalidArgumentError("x")), 2);
  EXPECT_EQ(client::ExitCodeFor(NotFoundError("x")), 2);
  EXPECT_EQ(client::ExitCodeFor(UnavailableError("x")), 4);
  EXPECT_EQ(client::ExitCodeFor(FailedPreconditionError("x")), 5);
  EXPECT_EQ(client::ExitCodeForState(v1::SUCCEEDED), 0);
  EXPECT_EQ(client::ExitCodeForState(v1::FAILED), 1);
  EXPECT_EQ(client::ExitCodeForState(v1::CANCELLED), 3);

  client::EventPrinter p;
  v1::Event e;
  e.set_kind(v1::Event::METRIC);
  e.set_text(
      R"({"event":"start","step":0,"total_steps":10,"parameters":1234,"device":"cpu","precision":"fp32"})");
  EXPECT_EQ(p.Format(e), "start: 1234 parameters, 10 steps on cpu (fp32)");
  client::EventPrinter resumed;
  v1::Event r = e;
  r.set_text(R"({"event":"start","step":4,"total_steps":10,"parameters":1234,"device":"cpu",)"
             R"("precision":"fp32","resumed_from":"/run/checkpoint-000004"})");
  EXPECT_EQ(resumed.Format(r),
            "start: 1234 parameters, 10 steps on cpu (fp32), resuming at step 4 from /run/checkpoint-000004");
  r.set_text(R"({"event":"start","step":0,"total_steps":10,"parameters":1,"device":"cpu","precision":"fp32",)"
             R"("resumed_from":""})");
  EXPECT_EQ(resumed.Format(r), "start: 1 parameters, 10 steps on cpu (fp32)");
  e.set_text(R"({"event":"step","step":3,"loss":2.5,"lr":0.001,"grad_norm":0.5,"tokens_per_s":1000})");
  EXPECT_EQ(p.Format(e), "step 3/10: loss 2.5000, lr 1.00e-03, grad norm 0.500, 1000 tok/s");
  e.set_rank(1);
  e.set_kind(v1::Event::STDERR);
  e.set_text("oops");
  EXPECT_EQ(p.Format(e), "[rank 1] oops");
  e.set_kind(v1::Event::STATE);
  e.set_state(v1::FAILED);
  e.set_text("rank 1 exited with code 3");
  EXPECT_EQ(p.Format(e), "== FAILED: rank 1 exited with code 3");
  EXPECT_EQ(client::EventToJson(e)["state"], "FAILED");
}

}  // namespace
}  // namespace sftctl::remotetest
