// AgentService: the sftctl.v1.Agent gRPC service on the callback API.
//
// One reactor per RPC. Reactions never block: anything that touches SQLite, files or hashing runs on a
// small worker pool, and job state changes go through the Supervisor's event thread. Streaming reactors
// keep their mutable state in a shared object guarded by a mutex, so late worker tasks or journal
// notifications after the RPC ended find it marked finished instead of touching a deleted reactor.
//
// Thread safety: the service object is shared by all gRPC threads; it holds no mutable state itself.
#pragma once

#include <grpcpp/grpcpp.h>

#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "agent/jobs/supervisor.h"
#include "agent/serving/auth.h"
#include "agent/state/artifacts.h"
#include "agent/state/blob_store.h"
#include "agent/state/gc.h"
#include "agent/state/state_store.h"
#include "agent/stopping/auto_stop.h"
#include "common/mutex.h"
#include "common/status.h"
#include "proto/grpc_compat.h"
#include "sftctl/v1/agent.grpc.pb.h"

namespace sftctl::agent {

grpc::Status ToGrpc(const Status& s);
// Fills `out` from a record; with `history`, includes the state history and spec.
void JobToProto(const JobRecord& rec, const std::vector<HistoryRecord>* history, ::sftctl::v1::Job* out);

struct ServiceDeps {
  Supervisor* supervisor = nullptr;
  StateStore* store = nullptr;
  BlobStore* blobs = nullptr;
  Artifacts* artifacts = nullptr;
  GarbageCollector* gc = nullptr;
  GcPolicy gc_policy;  // CollectGarbage's defaults
  const Authenticator* auth = nullptr;
  // The stop policy: Health reports it; SubmitJob refuses stop_when_done without a stop action.
  // Optional (nullptr: no policy, stop_when_done refused).
  const AutoStop* auto_stop = nullptr;
  std::string version;
  // Short work (job lookups, event and artifact reads) runs on `worker_threads`; work that hashes or
  // fsyncs whole files (ListArtifacts, UploadBlob) on `bulk_threads` of its own, so that hashing a
  // large checkpoint never holds up `logs -f` or `status`.
  size_t worker_threads = 2;
  size_t bulk_threads = 2;
  size_t pull_chunk_bytes = 1 << 20;
};

class AgentService final : public rpc::CallbackService<::sftctl::v1::Agent> {
 public:
  explicit AgentService(ServiceDeps deps);
  // Waits for queued worker tasks. Call after the grpc::Server has shut down.
  ~AgentService() override;

  rpc::ServerUnaryReactor* SubmitJob(rpc::CallbackServerContext* ctx,
                                     const ::sftctl::v1::SubmitJobRequest* req,
                                     ::sftctl::v1::Job* resp) override;
  rpc::ServerUnaryReactor* GetJob(rpc::CallbackServerContext* ctx, const ::sftctl::v1::GetJobRequest* req,
                                  ::sftctl::v1::Job* resp) override;
  rpc::ServerUnaryReactor* ListJobs(rpc::CallbackServerContext* ctx, const ::sftctl::v1::ListJobsRequest* req,
                                    ::sftctl::v1::ListJobsResponse* resp) override;
  rpc::ServerUnaryReactor* CancelJob(rpc::CallbackServerContext* ctx,
                                     const ::sftctl::v1::CancelJobRequest* req,
                                     ::sftctl::v1::Job* resp) override;
  rpc::ServerWriteReactor<::sftctl::v1::StreamEventsResponse>* StreamEvents(
      rpc::CallbackServerContext* ctx, const ::sftctl::v1::StreamEventsRequest* req) override;
  rpc::ServerUnaryReactor* ListArtifacts(rpc::CallbackServerContext* ctx,
                                         const ::sftctl::v1::ListArtifactsRequest* req,
                                         ::sftctl::v1::ListArtifactsResponse* resp) override;
  rpc::ServerWriteReactor<::sftctl::v1::ArtifactChunk>* PullArtifact(
      rpc::CallbackServerContext* ctx, const ::sftctl::v1::PullArtifactRequest* req) override;
  rpc::ServerUnaryReactor* StatBlob(rpc::CallbackServerContext* ctx, const ::sftctl::v1::StatBlobRequest* req,
                                    ::sftctl::v1::BlobStatus* resp) override;
  rpc::ServerReadReactor<::sftctl::v1::UploadBlobRequest>* UploadBlob(
      rpc::CallbackServerContext* ctx, ::sftctl::v1::BlobStatus* resp) override;
  rpc::ServerUnaryReactor* CollectGarbage(rpc::CallbackServerContext* ctx,
                                          const ::sftctl::v1::CollectGarbageRequest* req,
                                          ::sftctl::v1::CollectGarbageResponse* resp) override;
  rpc::ServerUnaryReactor* Health(rpc::CallbackServerContext* ctx, const ::sftctl::v1::HealthRequest* req,
                                  ::sftctl::v1::HealthResponse* resp) override;
  rpc::ServerUnaryReactor* Version(rpc::CallbackServerContext* ctx, const ::sftctl::v1::VersionRequest* req,
                                   ::sftctl::v1::VersionResponse* resp) override;
  // Unauthenticated: the proof that this agent knows the token (proto Identify).
  rpc::ServerUnaryReactor* Identify(rpc::CallbackServerContext* ctx, const ::sftctl::v1::IdentifyRequest* req,
                                    ::sftctl::v1::IdentifyResponse* resp) override;

  // The address clients dial ("127.0.0.1:41234"), once the server listens; Identify answers
  // UNAVAILABLE before. Thread-safe.
  void SetListenAddr(const std::string& addr) EXCLUDES(addr_mu_);

 private:
  void AddHubProgress(::sftctl::v1::Job* job) const;

  ServiceDeps deps_;
  boost::asio::thread_pool pool_;
  boost::asio::thread_pool bulk_pool_;
  std::chrono::steady_clock::time_point started_;
  mutable Mutex addr_mu_;
  std::string listen_addr_ GUARDED_BY(addr_mu_);
};

}  // namespace sftctl::agent
