// Fuzz target: agent RPC requests from a token holder, through the real AgentService (gRPC callback
// API, in-process channel) over a real Supervisor, StateStore, BlobStore and GarbageCollector in a
// scratch data dir. The trainer does not exist, so an accepted job fails at launch; one finished job
// (job-1) and one blob exist from the start so that lookups by id and path reach past "not found".
//
// Input: one letter naming the RPC, then the request message in protobuf text format (seeds are
// readable) or, when that does not parse, in binary:
//   s SubmitJob  g GetJob  l ListJobs  c CancelJob  e StreamEvents (follow off)  a ListArtifacts
//   p PullArtifact  b StatBlob  u UploadBlob (one message)  x CollectGarbage (always a dry run)
//   h Health  v Version
// Any other first byte picks one by its value. A first byte with the high bit set sends a wrong token.
//
// Properties checked: every call ends (5 s deadline) with OK or an error that has a message; a wrong
// token gets UNAUTHENTICATED; a pulled artifact's bytes are what its chunks say; the agent still
// answers Version after every input.
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>

#include "agent/jobs/supervisor.h"
#include "agent/serving/auth.h"
#include "agent/serving/service.h"
#include "agent/state/artifacts.h"
#include "agent/state/blob_store.h"
#include "agent/state/gc.h"
#include "agent/state/state_store.h"
#include "common/sha256.h"
#include "common/tokenizer/unicode_normalize.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;
using namespace sftctl::agent;
namespace v1 = ::sftctl::v1;

namespace {

constexpr char kToken[] = "fuzz-token-0123456789abcdef0123456789abcdef";

// The agent, built once and never destroyed (its threads run until the process exits).
struct World {
  std::unique_ptr<StateStore> store;
  std::unique_ptr<BlobStore> blobs;
  std::unique_ptr<CheckpointUploads> uploads;  // outlives the supervisor
  std::unique_ptr<Supervisor> supervisor;
  std::unique_ptr<Artifacts> artifacts;
  std::unique_ptr<Authenticator> auth;
  std::unique_ptr<GarbageCollector> gc;
  std::unique_ptr<AgentService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Agent::Stub> stub;
};

void Must(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "agent_rpc_fuzz setup: %s: %s\n", what, s.ToString().c_str());
    std::abort();
  }
}

std::unique_ptr<grpc::ClientContext> Ctx(bool good_token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", std::string("Bearer ") + (good_token ? kToken : "not-the-token"));
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return ctx;
}

World* MakeWorld() {
  auto* w = new World;
  spdlog::set_level(spdlog::level::warn);  // one line per job would drown libFuzzer's status
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  const std::string dir = fuzz::ScratchDir() + "/agent";
  std::filesystem::create_directories(dir);
  auto store = StateStore::Open(dir + "/agent.db");
  Must(store.status(), "StateStore::Open");
  w->store = std::move(*store);
  w->blobs = std::make_unique<BlobStore>(dir + "/blobs", w->store.get());
  Must(w->blobs->Init(), "BlobStore::Init");
  SupervisorConfig cfg;
  cfg.data_dir = dir;
  cfg.trainer_path = dir + "/no-such-trainer";
  cfg.cpu_slots = 2;
  cfg.kill_grace = std::chrono::milliseconds(50);
  cfg.poll = std::chrono::milliseconds(20);
  w->uploads = std::make_unique<CheckpointUploads>();
  w->supervisor = std::make_unique<Supervisor>(cfg, w->store.get(), w->blobs.get(), w->uploads.get());
  Must(w->supervisor->Start(), "Supervisor::Start");
  w->artifacts = std::make_unique<Artifacts>(w->store.get());
  w->auth = std::make_unique<Authenticator>(kToken);
  w->gc = std::make_unique<GarbageCollector>(dir, w->store.get(), w->blobs.get());
  ServiceDeps deps;
  deps.supervisor = w->supervisor.get();
  deps.store = w->store.get();
  deps.blobs = w->blobs.get();
  deps.artifacts = w->artifacts.get();
  deps.auth = w->auth.get();
  deps.gc = w->gc.get();
  deps.version = "fuzz";
  w->service = std::make_unique<AgentService>(deps);
  grpc::ServerBuilder builder;
  builder.RegisterService(w->service.get());
  w->server = builder.BuildAndStart();
  w->stub = v1::Agent::NewStub(w->server->InProcessChannel(grpc::ChannelArguments()));
  // job-1 (fails at launch: no trainer) with a file in its run folder, and one complete blob.
  v1::SubmitJobRequest submit;
  submit.set_spec_json(R"({"output_dir": "x", "model": {"config": {}}, "data": {"train": ["t.jsonl"]}})");
  v1::Job job;
  if (!w->stub->SubmitJob(Ctx(true).get(), submit, &job).ok()) std::abort();
  fuzz::WriteFile(job.job_dir() + "/run/metrics.jsonl", "{\"step\": 1}\n");
  const std::string blob = "a blob";
  auto up = w->blobs->BeginUpload(Sha256Hex(blob), blob.size(), 0);
  Must(up.status(), "BeginUpload");
  Must((*up)->Write(blob), "Upload::Write");
  Must((*up)->Finish(), "Upload::Finish");
  return w;
}

// proto3 `string` fields must be UTF-8: the client library refuses to send others (and a server
// would refuse to parse them), so such requests never reach the service.
bool StringsAreUtf8(const google::protobuf::Message& m) {
  const auto* refl = m.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  refl->ListFields(m, &fields);
  for (const auto* f : fields) {
    using FD = google::protobuf::FieldDescriptor;
    const int n = f->is_repeated() ? refl->FieldSize(m, f) : 1;
    for (int i = 0; i < n; ++i) {
      if (f->type() == FD::TYPE_STRING) {
        std::string v = f->is_repeated() ? refl->GetRepeatedString(m, f, i) : refl->GetString(m, f);
        if (!IsValidUtf8(v)) return false;
      } else if (f->cpp_type() == FD::CPPTYPE_MESSAGE) {
        const auto& sub = f->is_repeated() ? refl->GetRepeatedMessage(m, f, i) : refl->GetMessage(m, f);
        if (!StringsAreUtf8(sub)) return false;
      }
    }
  }
  return true;
}

template <typename Msg>
bool Parse(std::string_view body, Msg* msg) {
  bool ok = google::protobuf::TextFormat::ParseFromString(std::string(body), msg);
  if (!ok) {
    msg->Clear();
    ok = msg->ParseFromArray(body.data(), static_cast<int>(body.size()));
  }
  return ok && StringsAreUtf8(*msg);
}

void CheckStatus(const grpc::Status& s, bool good_token, const char* rpc) {
  if (!good_token) {
    FUZZ_CHECK(s.error_code() == grpc::StatusCode::UNAUTHENTICATED,
               std::string(rpc) + " with a wrong token: " + std::to_string(s.error_code()));
    return;
  }
  FUZZ_CHECK(s.ok() || !s.error_message().empty(), std::string(rpc) + ": an error without a message");
  if (fuzz::Debug())
    std::fprintf(stderr, "[fuzz] %s: %d %s\n", rpc, s.error_code(), s.error_message().c_str());
}

template <typename Req, typename Resp, typename Call>
void Unary(std::string_view body, bool good, const char* rpc, Call call) {
  Req req;
  if (!Parse(body, &req)) return;
  Resp resp;
  CheckStatus(call(Ctx(good).get(), req, &resp), good, rpc);
}

void Pull(World* w, std::string_view body, bool good) {
  v1::PullArtifactRequest req;
  if (!Parse(body, &req)) return;
  auto ctx = Ctx(good);
  auto reader = w->stub->PullArtifact(ctx.get(), req);
  v1::ArtifactChunk chunk;
  uint64_t pos = req.offset();
  while (reader->Read(&chunk)) {
    FUZZ_CHECK(chunk.offset() == pos, "a chunk out of order");
    pos += chunk.data().size();
  }
  CheckStatus(reader->Finish(), good, "PullArtifact");
}

void Events(World* w, std::string_view body, bool good) {
  v1::StreamEventsRequest req;
  if (!Parse(body, &req)) return;
  req.set_follow(false);
  auto ctx = Ctx(good);
  auto reader = w->stub->StreamEvents(ctx.get(), req);
  v1::StreamEventsResponse resp;
  uint64_t last = req.after_seq();
  while (reader->Read(&resp)) {
    for (const auto& e : resp.events()) {
      FUZZ_CHECK(e.seq() > last, "events out of order");
      last = e.seq();
    }
  }
  CheckStatus(reader->Finish(), good, "StreamEvents");
}

void Upload(World* w, std::string_view body, bool good) {
  v1::UploadBlobRequest req;
  if (!Parse(body, &req)) return;
  auto ctx = Ctx(good);
  v1::BlobStatus resp;
  auto writer = w->stub->UploadBlob(ctx.get(), &resp);
  writer->Write(req);
  writer->WritesDone();
  CheckStatus(writer->Finish(), good, "UploadBlob");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* w = MakeWorld();
  if (size == 0) return 0;
  const bool good = (data[0] & 0x80) == 0;
  const std::string_view body = fuzz::AsView(data + 1, size - 1);
  static const std::string kLetters = "sglceapbuxhv";
  char rpc = static_cast<char>(data[0] & 0x7f);
  if (kLetters.find(rpc) == std::string::npos) rpc = kLetters[rpc % kLetters.size()];
  v1::Agent::Stub* s = w->stub.get();
  switch (rpc) {
    case 's':
      Unary<v1::SubmitJobRequest, v1::Job>(body, good, "SubmitJob",
                                           [&](auto* c, auto& q, auto* r) { return s->SubmitJob(c, q, r); });
      break;
    case 'g':
      Unary<v1::GetJobRequest, v1::Job>(body, good, "GetJob",
                                        [&](auto* c, auto& q, auto* r) { return s->GetJob(c, q, r); });
      break;
    case 'l':
      Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
          body, good, "ListJobs", [&](auto* c, auto& q, auto* r) { return s->ListJobs(c, q, r); });
      break;
    case 'c':
      Unary<v1::CancelJobRequest, v1::Job>(body, good, "CancelJob",
                                           [&](auto* c, auto& q, auto* r) { return s->CancelJob(c, q, r); });
      break;
    case 'e':
      Events(w, body, good);
      break;
    case 'a':
      Unary<v1::ListArtifactsRequest, v1::ListArtifactsResponse>(
          body, good, "ListArtifacts", [&](auto* c, auto& q, auto* r) { return s->ListArtifacts(c, q, r); });
      break;
    case 'p':
      Pull(w, body, good);
      break;
    case 'b':
      Unary<v1::StatBlobRequest, v1::BlobStatus>(
          body, good, "StatBlob", [&](auto* c, auto& q, auto* r) { return s->StatBlob(c, q, r); });
      break;
    case 'u':
      Upload(w, body, good);
      break;
    case 'x':
      Unary<v1::CollectGarbageRequest, v1::CollectGarbageResponse>(body, good, "CollectGarbage",
                                                                   [&](auto* c, auto q, auto* r) {
                                                                     q.set_dry_run(true);
                                                                     return s->CollectGarbage(c, q, r);
                                                                   });
      break;
    case 'h':
      Unary<v1::HealthRequest, v1::HealthResponse>(
          body, good, "Health", [&](auto* c, auto& q, auto* r) { return s->Health(c, q, r); });
      break;
    default:
      break;
  }
  v1::VersionResponse version;
  FUZZ_CHECK(s->Version(Ctx(true).get(), v1::VersionRequest(), &version).ok(), "the agent stopped answering");
  return 0;
}
