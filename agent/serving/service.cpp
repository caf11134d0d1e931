#include "agent/serving/service.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <functional>

#include "common/agent_identity.h"
#include "common/os/file_system.h"
#include "common/sha256.h"
#include "common/source_id.h"

namespace sftctl::agent {
namespace v1 = ::sftctl::v1;

namespace {

constexpr size_t kEventsPerMessage = 512;
// Event text per StreamEvents message: far below any client's receive limit (gRPC's default is
// 4 MiB) even when every line is as long as the supervisor allows (64 KiB). At least one event is
// always sent.
constexpr size_t kEventBytesPerMessage = 1 << 20;

// A write reactor that fails at once (e.g. UNAUTHENTICATED) and deletes itself.
template <typename T>
class FailedWriter : public rpc::ServerWriteReactor<T> {
 public:
  explicit FailedWriter(const Status& s) { this->Finish(ToGrpc(s)); }
  void OnDone() override { delete this; }
};

template <typename T>
class FailedReader : public rpc::ServerReadReactor<T> {
 public:
  explicit FailedReader(const Status& s) { this->Finish(ToGrpc(s)); }
  void OnDone() override { delete this; }
};

// Mutable state of a streaming RPC, outliving its reactor. `reactor` may only be used under `mu` while
// !finished; FinishLocked is the single place that ends the RPC.
template <typename Reactor>
struct Shared {
  Mutex mu;
  Reactor* reactor PT_GUARDED_BY(mu) = nullptr;
  bool finished GUARDED_BY(mu) = false;
  void FinishLocked(const grpc::Status& s) REQUIRES(mu) {
    if (finished) return;
    finished = true;
    reactor->Finish(s);
  }
};

// ---- StreamEvents ------------------------------------------------------------------------------------

class EventsReactor : public rpc::ServerWriteReactor<v1::StreamEventsResponse> {
 public:
  struct State : Shared<EventsReactor>, std::enable_shared_from_this<State> {
    boost::asio::thread_pool* pool = nullptr;
    Supervisor* supervisor = nullptr;
    std::string job_id;
    std::shared_ptr<Journal> journal;  // opened by the first Pump (reading it may touch the disk)
    uint64_t after = 0;
    bool follow = false;
    v1::StreamEventsResponse msg;

    void Schedule() {
      auto self = shared_from_this();
      boost::asio::post(*pool, [self] { self->Pump(); });
    }
    // Runs on the pool, never while a write is in flight.
    void Pump() {
      {
        MutexLock lock(&mu);
        if (finished) return;
      }
      if (!journal) {
        auto j = supervisor->JournalFor(job_id);
        if (!j.ok()) {
          MutexLock lock(&mu);
          return FinishLocked(ToGrpc(j.status()));
        }
        journal = *j;
      }
      auto events = journal->Read(after, kEventsPerMessage);
      MutexLock lock(&mu);
      if (finished) return;
      if (!events.ok()) return FinishLocked(ToGrpc(events.status()));
      if (!events->empty()) {
        msg.Clear();
        size_t bytes = 0;
        for (const JournalEvent& ev : *events) {
          if (msg.events_size() > 0 && bytes + ev.text.size() > kEventBytesPerMessage) break;
          bytes += ev.text.size();
          v1::Event* e = msg.add_events();
          e->set_seq(ev.seq);
          e->set_time_unix_ms(ev.time_ms);
          e->set_kind(ev.kind);
          e->set_rank(ev.rank);
          e->set_text(ev.text);
          e->set_state(ev.state);
        }
        after = msg.events(msg.events_size() - 1).seq();
        reactor->StartWrite(&msg);
        return;
      }
      if (follow && !journal->finished()) {
        auto self = shared_from_this();
        journal->NotifyWhenAfter(after, [self] { self->Schedule(); });
        return;
      }
      if (follow && journal->last_seq() > after) return Schedule();  // finished meanwhile: drain the rest
      FinishLocked(grpc::Status::OK);
    }
  };

  explicit EventsReactor(std::shared_ptr<State> st) : st_(std::move(st)) {
    st_->reactor = this;
    st_->Schedule();
  }
  void OnWriteDone(bool ok) override {
    if (ok) return st_->Schedule();
    MutexLock lock(&st_->mu);
    st_->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
  }
  void OnCancel() override {
    MutexLock lock(&st_->mu);
    st_->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<State> st_;
};

// ---- PullArtifact ------------------------------------------------------------------------------------

class PullReactor : public rpc::ServerWriteReactor<v1::ArtifactChunk> {
 public:
  struct State : Shared<PullReactor>, std::enable_shared_from_this<State> {
    boost::asio::thread_pool* pool = nullptr;
    int fd = -1;
    std::string path;
    uint64_t pos = 0;
    uint64_t size = 0;  // of the file
    uint64_t end = 0;   // of the range sent
    std::string sha256;
    size_t chunk = 1 << 20;
    bool first = true;
    // Double buffering: `cur` is being written while the pool reads the next chunk into `next`.
    v1::ArtifactChunk cur, next;
    bool in_flight = false, ready = false, reading = false, eof = false;
    std::function<Status()> prep;  // runs first, on the pool

    ~State() {
      if (fd >= 0) ::close(fd);
    }
    void StartRead() {
      reading = true;
      auto self = shared_from_this();
      boost::asio::post(*pool, [self] { self->Read(); });
    }
    void Read() {
      {
        MutexLock lock(&mu);
        if (finished) return;
      }
      if (prep) {
        Status s = prep();
        prep = nullptr;
        if (!s.ok()) {
          MutexLock lock(&mu);
          return FinishLocked(ToGrpc(s));
        }
      }
      next.Clear();
      next.set_offset(pos);
      if (first) {
        next.set_total_size(size);
        next.set_sha256(sha256);
      }
      size_t want = static_cast<size_t>(std::min<uint64_t>(chunk, end - pos));
      std::string* data = next.mutable_data();
      data->resize(want);
      Status read = PreadFully(fd, data->data(), want, pos, path);
      MutexLock lock(&mu);
      reading = false;
      if (finished) return;
      if (read.code() == StatusCode::kDataLoss) {
        return FinishLocked(ToGrpc(DataLossError("path: '" + path + "' shrank while being pulled")));
      }
      if (!read.ok()) return FinishLocked(ToGrpc(read));
      pos += want;
      eof = pos >= end;
      if (want > 0 || first) ready = true;
      first = false;
      ProceedLocked();
    }
    void ProceedLocked() REQUIRES(mu) {
      if (finished) return;
      if (!in_flight && ready) {
        cur.Swap(&next);
        ready = false;
        in_flight = true;
        reactor->StartWrite(&cur);
        if (!eof && !reading) StartRead();
      } else if (!in_flight && !ready && eof && !reading) {
        FinishLocked(grpc::Status::OK);
      }
    }
  };

  explicit PullReactor(std::shared_ptr<State> st) : st_(std::move(st)) {
    st_->reactor = this;
    MutexLock lock(&st_->mu);
    st_->StartRead();
  }
  void OnWriteDone(bool ok) override {
    MutexLock lock(&st_->mu);
    st_->in_flight = false;
    if (!ok) return st_->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
    st_->ProceedLocked();
  }
  void OnCancel() override {
    MutexLock lock(&st_->mu);
    st_->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<State> st_;
};

// ---- UploadBlob --------------------------------------------------------------------------------------

// Keeps what BeginUpload or BeginRange started; its error otherwise.
template <typename T>
Status Begin(StatusOr<std::unique_ptr<T>> begun, std::unique_ptr<T>* into) {
  if (!begun.ok()) return begun.status();
  *into = std::move(*begun);
  return OkStatus();
}

class UploadReactor : public rpc::ServerReadReactor<v1::UploadBlobRequest> {
 public:
  struct State : Shared<UploadReactor>, std::enable_shared_from_this<State> {
    boost::asio::thread_pool* pool = nullptr;
    BlobStore* blobs = nullptr;
    v1::BlobStatus* resp = nullptr;
    v1::UploadBlobRequest req;
    std::unique_ptr<BlobStore::Upload> upload;      // a sequential upload, or
    std::unique_ptr<BlobStore::RangeUpload> range;  // one block of a ranged one
    std::string sha;
    uint64_t size = 0;

    void Handle(bool ok) {
      {
        MutexLock lock(&mu);
        if (finished) return;
      }
      Status st;
      bool done = false;
      // The answer is built here and copied into `resp` only under the lock and only while the
      // RPC is not finished: a client cancel during a slow Finish (fsync, hashing) lets gRPC
      // free `resp`.
      v1::BlobStatus out;
      if (!ok && range) {  // the client half-closed a block of a ranged upload
        bool complete = false;
        st = range->Finish(&complete);
        if (st.ok()) {
          out.set_sha256(sha);
          out.set_complete(complete);
          out.set_size(complete ? size : range->written());
          if (complete) out.set_path(blobs->BlobPath(sha));
        }
        done = true;
      } else if (!ok) {  // the client half-closed: all bytes are here
        if (!upload) {
          st = InvalidArgumentError("sha256: no message received (the first must carry sha256 and size)");
        } else {
          st = upload->Finish();
          if (st.ok()) {
            out.set_sha256(sha);
            out.set_complete(true);
            out.set_size(upload->written());
            out.set_path(blobs->BlobPath(sha));
          }
        }
        done = true;
      } else if (!upload && !range) {
        sha = req.sha256();
        size = req.size();
        if (sha.empty()) st = InvalidArgumentError("sha256: the first message must carry sha256 and size");
        if (st.ok()) {
          Status begun =
              req.length() > 0
                  ? Begin(blobs->BeginRange(sha, size, req.block(), req.offset(), req.length()), &range)
                  : Begin(blobs->BeginUpload(sha, size, req.offset()), &upload);
          if (begun.code() == StatusCode::kAlreadyExists) {
            auto stat = blobs->StatBlob(sha);
            out.set_sha256(sha);
            out.set_complete(true);
            out.set_size(stat.ok() ? stat->size : 0);
            out.set_deduplicated(true);
            out.set_path(blobs->BlobPath(sha));
            done = true;
          } else {
            st = begun;  // OK when it started
          }
        }
      }
      if (st.ok() && !done && ok) {
        if (!req.sha256().empty() && req.sha256() != sha) {
          st = InvalidArgumentError("sha256: changed within one upload");
        } else {
          st = range ? range->Write(req.data()) : upload->Write(req.data());
        }
      }
      // Ending: close the upload first so a client that retries at once is not refused as a concurrent
      // upload (the reactor itself may be deleted only later).
      if (!st.ok() || done) {
        upload.reset();
        range.reset();
      }
      MutexLock lock(&mu);
      if (finished) return;
      if (!st.ok()) {
        // A digest mismatch already deleted the partial bytes; other errors keep them for a resume.
        return FinishLocked(ToGrpc(st));
      }
      if (done) {
        *resp = std::move(out);
        return FinishLocked(grpc::Status::OK);
      }
      reactor->StartRead(&req);
    }
  };

  explicit UploadReactor(std::shared_ptr<State> st) : st_(std::move(st)) {
    st_->reactor = this;
    StartRead(&st_->req);
  }
  void OnReadDone(bool ok) override {
    auto st = st_;
    boost::asio::post(*st->pool, [st, ok] { st->Handle(ok); });
  }
  void OnCancel() override {
    MutexLock lock(&st_->mu);
    st_->FinishLocked(
        grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client; bytes kept for resume"));
  }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<State> st_;
};

}  // namespace

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

void JobToProto(const JobRecord& rec, const std::vector<HistoryRecord>* history, v1::Job* out) {
  out->set_id(rec.id);
  out->set_name(rec.name);
  out->set_state(rec.state);
  out->set_reason(rec.reason);
  out->set_gpus(rec.gpus);
  // The job's world size: across all nodes for a multi-node job (this node runs ranks_size() of them).
  out->set_world_size(IsMultiNode(rec) ? rec.rendezvous.world_size() : rec.world_size);
  if (IsMultiNode(rec)) *out->mutable_rendezvous() = rec.rendezvous;
  out->set_first_failed_rank(rec.first_failed_rank);
  out->set_stop_when_done(rec.stop_when_done);
  out->set_slurm(rec.slurm);
  out->set_slurm_job_id(rec.slurm_job_id);
  out->set_slurm_state(rec.slurm_state);
  for (int g : rec.assigned_gpus) out->add_assigned_gpus(static_cast<uint32_t>(g));
  out->set_restarts(rec.restarts);
  out->set_max_restarts(rec.max_restarts);
  out->set_created_unix_ms(rec.created_ms);
  out->set_started_unix_ms(rec.started_ms);
  out->set_finished_unix_ms(rec.finished_ms);
  out->set_last_step(rec.last_step);
  out->set_last_loss(rec.last_loss);
  out->set_job_dir(rec.job_dir);
  for (const RankRecord& k : rec.ranks) {
    v1::RankStatus* r = out->add_ranks();
    r->set_rank(static_cast<uint32_t>(k.rank));
    r->set_pid(k.pid);
    r->set_running(k.running);
    r->set_exit_code(k.exit.exit_code);
    r->set_signal(k.exit.signal);
    r->set_exit_known(k.exit.known);
  }
  if (history) {
    out->set_spec_json(rec.spec_json);
    for (const HistoryRecord& h : *history) {
      v1::StateChange* c = out->add_history();
      c->set_state(h.state);
      c->set_reason(h.reason);
      c->set_time_unix_ms(h.time_ms);
    }
  }
}

AgentService::AgentService(ServiceDeps deps)
    : deps_(std::move(deps)),
      pool_(deps_.worker_threads),
      bulk_pool_(deps_.bulk_threads),
      started_(std::chrono::steady_clock::now()) {}

AgentService::~AgentService() {
  pool_.join();
  bulk_pool_.join();
}

#define SFT_AUTH_UNARY(ctx)                            \
  auto* reactor = (ctx)->DefaultReactor();             \
  if (Status a = deps_.auth->Check(*(ctx)); !a.ok()) { \
    reactor->Finish(ToGrpc(a));                        \
    return reactor;                                    \
  }

rpc::ServerUnaryReactor* AgentService::SubmitJob(rpc::CallbackServerContext* ctx,
                                                 const v1::SubmitJobRequest* req, v1::Job* resp) {
  SFT_AUTH_UNARY(ctx);
  if (req->stop_when_done() && (deps_.auto_stop == nullptr || !deps_.auto_stop->HasAction())) {
    reactor->Finish(ToGrpc(ActionCommand("", StopPolicy()).status().WithContext("stop_when_done")));
    return reactor;
  }
  // Refused once the host is stopping; else held until the job is counted as queued (when the
  // callback runs), so that the stop decision sees it.
  StatusOr<std::shared_ptr<AutoStop::Admission>> admitted = std::shared_ptr<AutoStop::Admission>();
  if (deps_.auto_stop != nullptr) admitted = deps_.auto_stop->AdmitSubmission();
  if (!admitted.ok()) {
    reactor->Finish(ToGrpc(admitted.status()));
    return reactor;
  }
  deps_.supervisor->Submit(*req, [reactor, resp, admitted = *admitted](StatusOr<JobRecord> r) {
    if (r.ok()) JobToProto(*r, nullptr, resp);
    reactor->Finish(ToGrpc(r.status()));
  });
  return reactor;
}

// A job waiting for its hf:// downloads: its reason says how far the download is.
void AgentService::AddHubProgress(v1::Job* job) const {
  if (job->state() != v1::QUEUED) return;
  const std::string p = deps_.supervisor->HubProgress(job->id());
  if (!p.empty()) job->set_reason(job->reason() + " (" + p + ")");
}

rpc::ServerUnaryReactor* AgentService::GetJob(rpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                              v1::Job* resp) {
  SFT_AUTH_UNARY(ctx);
  boost::asio::post(pool_, [this, reactor, req, resp] {
    auto rec = deps_.store->GetJob(req->job_id());
    if (!rec.ok()) return reactor->Finish(ToGrpc(rec.status()));
    auto hist = deps_.store->History(req->job_id());
    if (!hist.ok()) return reactor->Finish(ToGrpc(hist.status()));
    JobToProto(*rec, &*hist, resp);
    AddHubProgress(resp);
    auto journal = deps_.supervisor->JournalFor(req->job_id());
    if (journal.ok()) resp->set_last_seq((*journal)->last_seq());
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

rpc::ServerUnaryReactor* AgentService::ListJobs(rpc::CallbackServerContext* ctx,
                                                const v1::ListJobsRequest* req, v1::ListJobsResponse* resp) {
  SFT_AUTH_UNARY(ctx);
  boost::asio::post(pool_, [this, reactor, resp] {
    auto jobs = deps_.store->ListJobs();
    if (!jobs.ok()) return reactor->Finish(ToGrpc(jobs.status()));
    for (const JobRecord& rec : *jobs) {
      v1::Job* job = resp->add_jobs();
      JobToProto(rec, nullptr, job);
      AddHubProgress(job);
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

rpc::ServerUnaryReactor* AgentService::CancelJob(rpc::CallbackServerContext* ctx,
                                                 const v1::CancelJobRequest* req, v1::Job* resp) {
  SFT_AUTH_UNARY(ctx);
  deps_.supervisor->Cancel(req->job_id(), [reactor, resp](StatusOr<JobRecord> r) {
    if (r.ok()) JobToProto(*r, nullptr, resp);
    reactor->Finish(ToGrpc(r.status()));
  });
  return reactor;
}

rpc::ServerWriteReactor<v1::StreamEventsResponse>* AgentService::StreamEvents(
    rpc::CallbackServerContext* ctx, const v1::StreamEventsRequest* req) {
  if (Status a = deps_.auth->Check(*ctx); !a.ok()) return new FailedWriter<v1::StreamEventsResponse>(a);
  auto st = std::make_shared<EventsReactor::State>();
  st->pool = &pool_;
  st->supervisor = deps_.supervisor;
  st->job_id = req->job_id();
  st->after = req->after_seq();
  st->follow = req->follow();
  return new EventsReactor(st);
}

rpc::ServerUnaryReactor* AgentService::ListArtifacts(rpc::CallbackServerContext* ctx,
                                                     const v1::ListArtifactsRequest* req,
                                                     v1::ListArtifactsResponse* resp) {
  SFT_AUTH_UNARY(ctx);
  boost::asio::post(bulk_pool_, [this, reactor, req, resp] {
    auto rec = deps_.store->GetJob(req->job_id());
    if (!rec.ok()) return reactor->Finish(ToGrpc(rec.status()));
    auto list = deps_.artifacts->List(rec->id, rec->job_dir);
    if (!list.ok()) return reactor->Finish(ToGrpc(list.status()));
    for (const ArtifactInfo& a : *list) {
      v1::Artifact* p = resp->add_artifacts();
      p->set_path(a.path);
      p->set_size(a.size);
      p->set_sha256(a.sha256);
      p->set_mtime_unix_ms(a.mtime_ms);
      p->set_checkpoint_step(a.checkpoint_step);
      p->set_checkpoint_complete(a.checkpoint_complete);
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

rpc::ServerWriteReactor<v1::ArtifactChunk>* AgentService::PullArtifact(rpc::CallbackServerContext* ctx,
                                                                       const v1::PullArtifactRequest* req) {
  if (Status a = deps_.auth->Check(*ctx); !a.ok()) return new FailedWriter<v1::ArtifactChunk>(a);
  auto st = std::make_shared<PullReactor::State>();
  st->pool = &pool_;
  st->chunk = deps_.pull_chunk_bytes;
  // Resolving, opening and hashing block: they run on the pool as the stream's first task.
  st->prep = [this, st = st.get(), job_id = req->job_id(), rel = req->path(), offset = req->offset(),
              length = req->length()]() -> Status {
    SFT_ASSIGN_OR_RETURN(JobRecord rec, deps_.store->GetJob(job_id));
    SFT_ASSIGN_OR_RETURN(std::string abs, ResolveInside(rec.job_dir, rel));
    int fd = ::open(abs.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return ErrnoError("cannot open", rel, errno);
    st->fd = fd;
    struct stat sb;
    if (::fstat(fd, &sb) != 0) return ErrnoError("cannot stat", rel, errno);
    st->size = static_cast<uint64_t>(sb.st_size);
    st->path = rel;
    if (offset > st->size) {
      return OutOfRangeError("offset: " + std::to_string(offset) + " > size " + std::to_string(st->size) +
                             " of '" + rel + "'");
    }
    st->pos = offset;
    st->end = length == 0 ? st->size : offset + std::min(length, st->size - offset);
    SFT_ASSIGN_OR_RETURN(st->sha256, deps_.artifacts->Hash(job_id, rel, abs));
    struct stat now;
    if (::fstat(fd, &now) != 0 || now.st_size != sb.st_size || now.st_mtim.tv_sec != sb.st_mtim.tv_sec ||
        now.st_mtim.tv_nsec != sb.st_mtim.tv_nsec) {
      // It grew while it was hashed (metrics.jsonl of a running job): the sha256 of what is sent.
      SFT_ASSIGN_OR_RETURN(st->sha256, Sha256FilePrefix(fd, st->size, rel));
    }
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return OkStatus();
  };
  return new PullReactor(st);
}

rpc::ServerUnaryReactor* AgentService::StatBlob(rpc::CallbackServerContext* ctx,
                                                const v1::StatBlobRequest* req, v1::BlobStatus* resp) {
  SFT_AUTH_UNARY(ctx);
  boost::asio::post(pool_, [this, reactor, req, resp] {
    auto st = deps_.blobs->StatBlob(req->sha256());
    if (!st.ok()) return reactor->Finish(ToGrpc(st.status()));
    resp->set_sha256(req->sha256());
    resp->set_complete(st->complete);
    resp->set_size(st->size);
    resp->set_block(st->block);
    for (uint64_t b : st->blocks_held) resp->add_blocks_held(b);
    if (st->complete) resp->set_path(deps_.blobs->BlobPath(req->sha256()));
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

rpc::ServerReadReactor<v1::UploadBlobRequest>* AgentService::UploadBlob(rpc::CallbackServerContext* ctx,
                                                                        v1::BlobStatus* resp) {
  if (Status a = deps_.auth->Check(*ctx); !a.ok()) return new FailedReader<v1::UploadBlobRequest>(a);
  auto st = std::make_shared<UploadReactor::State>();
  st->pool = &bulk_pool_;
  st->blobs = deps_.blobs;
  st->resp = resp;
  return new UploadReactor(st);
}

rpc::ServerUnaryReactor* AgentService::CollectGarbage(rpc::CallbackServerContext* ctx,
                                                      const v1::CollectGarbageRequest* req,
                                                      v1::CollectGarbageResponse* resp) {
  SFT_AUTH_UNARY(ctx);
  if (deps_.gc == nullptr) {
    reactor->Finish(ToGrpc(UnimplementedError("this agent has no garbage collector")));
    return reactor;
  }
  // Scanning and removing folders blocks: the bulk pool, never the reaction.
  boost::asio::post(bulk_pool_, [this, reactor, req, resp] {
    auto policy = GcPolicyFromRequest(*req, deps_.gc_policy);
    if (!policy.ok()) return reactor->Finish(ToGrpc(policy.status()));
    auto result = deps_.gc->Run(*policy, req->dry_run());
    if (!result.ok()) return reactor->Finish(ToGrpc(result.status()));
    ToProto(*result, resp);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

rpc::ServerUnaryReactor* AgentService::Health(rpc::CallbackServerContext* ctx, const v1::HealthRequest* req,
                                              v1::HealthResponse* resp) {
  SFT_AUTH_UNARY(ctx);
  SupervisorStats s = deps_.supervisor->Stats();
  resp->set_ok(true);
  resp->set_uptime_s(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_).count());
  resp->set_jobs_running(s.running);
  resp->set_jobs_queued(s.queued);
  resp->set_gpus_total(s.gpus_total);
  resp->set_gpus_free(s.gpus_free);
  resp->set_pid(::getpid());
  if (deps_.auto_stop != nullptr) {
    const AutoStopView v = deps_.auto_stop->View();
    v1::AutoStopStatus* as = resp->mutable_auto_stop();
    as->set_policy(v.policy);
    as->set_state(v.state);
    as->set_remaining_s(v.remaining_s);
    as->set_detail(v.detail);
    as->set_stop_when_idle_s(v.idle_s);
    as->set_action(v.action);
    as->set_price_per_hour(v.price_per_hour);
    as->set_cost_estimate(v.price_per_hour * static_cast<double>(resp->uptime_s()) / 3600.0);
    as->set_last_action(v.last_action);
    as->set_max_cost(v.max_cost);
    as->set_spent(v.spent);
    as->set_billing_since_unix_s(v.billing_since_unix_s);
    as->set_cost_cap_remaining_s(v.cap_remaining_s);
    as->set_cost_cap_reached(v.cap_reached);
    as->set_cost_cap_reason(v.cap_reason);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

rpc::ServerUnaryReactor* AgentService::Version(rpc::CallbackServerContext* ctx, const v1::VersionRequest* req,
                                               v1::VersionResponse* resp) {
  SFT_AUTH_UNARY(ctx);
  resp->set_version(deps_.version);
  resp->set_protocol(1);
  resp->set_source_id(SourceId());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void AgentService::SetListenAddr(const std::string& addr) {
  MutexLock l(&addr_mu_);
  listen_addr_ = addr;
}

rpc::ServerUnaryReactor* AgentService::Identify(rpc::CallbackServerContext* ctx,
                                                const v1::IdentifyRequest* req, v1::IdentifyResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  const std::string& challenge = req->challenge();
  if (challenge.size() < kIdentifyChallengeMin || challenge.size() > kIdentifyChallengeMax) {
    reactor->Finish(
        ToGrpc(InvalidArgumentError("challenge: must be " + std::to_string(kIdentifyChallengeMin) + ".." +
                                    std::to_string(kIdentifyChallengeMax) + " bytes")));
    return reactor;
  }
  std::string addr;
  {
    MutexLock l(&addr_mu_);
    addr = listen_addr_;
  }
  if (addr.empty()) {
    reactor->Finish(ToGrpc(UnavailableError("the agent is not listening yet")));
    return reactor;
  }
  resp->set_addr(addr);
  resp->set_proof(deps_.auth->Prove(addr, challenge));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace sftctl::agent
