#include "agent/jobs/supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "agent/jobs/checkpoint_upload.h"
#include "agent/process/launcher.h"
#include "agent/slurm/slurm_job.h"
#include "agent/slurm/slurm_runner.h"
#include "agent/state/job_spec.h"
#include "common/os/file_system.h"
#include "common/os/net_addr.h"
#include "common/os/process_util.h"
#include "common/spec/spec.h"
#include "common/spec/spec_paths.h"

namespace sftctl::agent {

// The states of one run (one attempt of a job on this host) and the events that move it. A run's
// state is its RankGroupStop phase (common/rank_group.h); Run::stop says why it is stopping.
//
//   state        event (where it is noticed)                      next         action
//   running      a rank failed first (ReapRanks)                  terminating  SIGTERM the group; the
//                                                                              reason names the rank
//   running      no step event for heartbeat_s (Tick)             terminating  SIGTERM; "hang: ..."
//   running      Cancel (DoCancel), or CANCELLING at recovery     terminating  SIGTERM; job CANCELLING
//   running      the journal cannot take output (Drain, Launch)   terminating  SIGTERM; FAILED, no requeue
//   running      recovered with some ranks dead (Recover), or a   terminating  SIGTERM; FAILED, requeue
//                recovered rank ended after an error event (Reap)
//   terminating  Cancel                                           terminating  the cause becomes the cancel
//   terminating  kill_grace passed (Tick)                         killed       SIGKILL the group
//   any          every rank gone, group members left (Tick)       (same)       SIGKILL the group; poll
//   any          every rank gone, group empty (Tick)              (ended)      Finalize: the final state
//                                                                              (Outcome), or QUEUED again
//                                                                              within the restart budget
//
// Ranks that end after the stop began did not fail on their own: only a running run has a first
// failure. A run that ended with no stop succeeded when every rank exited 0, or (re-attached ranks,
// exit status unknowable) when the trainer reported "done" and no error; otherwise it failed and is
// requeued.

namespace {

using ::sftctl::v1::Event;

constexpr auto kProgressSaveEvery = std::chrono::seconds(1);

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string JoinGpus(const std::vector<int>& g) {
  std::string s;
  for (size_t i = 0; i < g.size(); ++i) s += (i ? "," : "") + std::to_string(g[i]);
  return s;
}

// How far each of `rank`'s three output files (stdout, stderr, events) has been journaled, from
// Journal::source_offsets(); 0 for a file never journaled. Tailing resumes there.
void JournaledUpTo(const std::map<std::pair<int, int>, uint64_t>& offsets, int rank, uint64_t (&off)[3]) {
  for (int src = 0; src < 3; ++src) {
    auto it = offsets.find({rank, src});
    off[src] = it == offsets.end() ? 0 : it->second;
  }
}

// This host's name when it resolves (for the other nodes of a multi-node job), else "".
std::string ResolvableHostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &res) != 0) return "";
  ::freeaddrinfo(res);
  return name;
}

// The fields that name one uploaded file (not a folder's entry).
std::vector<std::string> FileRefPointers(const std::vector<SpecBlobRef>& refs) {
  std::vector<std::string> out;
  for (const SpecBlobRef& r : refs)
    if (r.dir_entry.empty()) out.push_back(r.json_pointer);
  return out;
}

// Checks a multi-node rendezvous against this node's rank count. INVALID_ARGUMENT naming the field.
Status ValidateRendezvous(const ::sftctl::v1::Rendezvous& r, uint32_t local_ranks) {
  auto bad = [](const std::string& field, const std::string& why) {
    return InvalidArgumentError("rendezvous." + field + ": " + why);
  };
  if (r.group_id().empty()) return bad("group_id", "must not be empty (the same string on every node)");
  if (r.node_rank() >= r.num_nodes()) {
    return bad("node_rank", std::to_string(r.node_rank()) + " must be less than num_nodes (" +
                                std::to_string(r.num_nodes()) + ")");
  }
  if (r.world_size() < r.num_nodes()) {
    return bad("world_size", std::to_string(r.world_size()) + " must be at least num_nodes (" +
                                 std::to_string(r.num_nodes()) + ")");
  }
  if (r.node_rank() == 0 && r.rank_offset() != 0)
    return bad("rank_offset", "must be 0 on node 0 (it hosts rank 0)");
  if (r.node_rank() > 0 && r.rank_offset() == 0)
    return bad("rank_offset",
               "must be > 0 on node " + std::to_string(r.node_rank()) + " (node 0 holds rank 0)");
  if (static_cast<uint64_t>(r.rank_offset()) + local_ranks > r.world_size()) {
    return bad("rank_offset", "rank_offset " + std::to_string(r.rank_offset()) + " + " +
                                  std::to_string(local_ranks) + " rank(s) on this node exceeds world_size " +
                                  std::to_string(r.world_size()));
  }
  if (r.master_port() > 65535)
    return bad("master_port", std::to_string(r.master_port()) + " is not a TCP port");
  if (r.node_rank() > 0 && r.master_addr().empty())
    return bad("master_addr", "required on node_rank > 0 (node 0's Job.rendezvous.master_addr)");
  if (r.node_rank() > 0 && r.master_port() == 0)
    return bad("master_port", "required on node_rank > 0 (node 0's Job.rendezvous.master_port)");
  return OkStatus();
}

// The rendezvous of this node's part of a multi-node job (empty for a single-node job), checked.
// Node 0 hosts the TCPStore (its rank 0): a port free on every interface, and the address the other
// nodes should use (the client may override it with the host name it reached us by).
StatusOr<::sftctl::v1::Rendezvous> NodeRendezvous(const ::sftctl::v1::SubmitJobRequest& req,
                                                  uint32_t local_ranks, const std::string& default_addr) {
  ::sftctl::v1::Rendezvous rdzv;
  if (!req.has_rendezvous() || req.rendezvous().num_nodes() <= 1) return rdzv;
  rdzv = req.rendezvous();
  SFT_RETURN_IF_ERROR(ValidateRendezvous(rdzv, local_ranks));
  if (rdzv.node_rank() == 0) {
    if (rdzv.master_port() == 0) rdzv.set_master_port(static_cast<uint32_t>(FreeTcpPort(true)));
    if (rdzv.master_addr().empty()) rdzv.set_master_addr(default_addr);
  }
  return rdzv;
}

}  // namespace

Supervisor::Supervisor(SupervisorConfig config, StateStore* store, BlobStore* blobs,
                       CheckpointUploads* uploads)
    : config_(std::move(config)),
      store_(store),
      blobs_(blobs),
      uploads_(uploads),
      scheduler_(config_.gpus, config_.cpu_slots),
      hub_(config_.hub) {
  slurm::SlurmRunnerConfig sc;
  sc.shared_dir = config_.shared_dir;
  sc.trainer_path = config_.trainer_path;
  sc.env = slurm::SlurmCli::EnvFromProcess();
  slurm_commands_ = CommandRunner::NewPosix(ChildKind::kSlurmCommand);  // no cloud keys for sbatch/srun
  sc.runner = slurm_commands_.get();
  sc.poll = config_.slurm_poll;
  slurm_ = std::make_unique<slurm::SlurmRunner>(std::move(sc), [this](slurm::SlurmUpdate u) {
    boost::asio::post(io_, [this, u = std::move(u)] { ApplySlurmUpdate(u); });
  });
}

Supervisor::~Supervisor() { Stop(); }

std::string Supervisor::JobDir(const std::string& id) const { return config_.data_dir + "/jobs/" + id; }

Status Supervisor::Start() {
  SFT_RETURN_IF_ERROR(config_.fs->CreateDirs(config_.data_dir + "/jobs"));
  if (!config_.shared_dir.empty()) SFT_RETURN_IF_ERROR(PrepareSlurmJobsDir());
  SFT_RETURN_IF_ERROR(Recover());
  using Guard = boost::asio::executor_work_guard<boost::asio::io_context::executor_type>;
  work_ = std::make_unique<Guard>(io_.get_executor());
  blocking_work_ = std::make_unique<Guard>(blocking_io_.get_executor());
  boost::asio::post(io_, [this] {
    for (const std::string& id : recovered_hub_) {  // downloads a previous agent left unfinished
      auto rec = GetJob(id);
      if (rec.ok()) QueueJob(&*rec, "");
    }
    recovered_hub_.clear();
    Schedule();
  });
  auto loop = [](boost::asio::io_context* io, const char* name) {
    try {
      io->run();
    } catch (const std::exception& e) {
      spdlog::critical("supervisor {} thread died: {}", name, e.what());
      std::abort();
    }
  };
  thread_ = std::thread(loop, &io_, "event");
  blocking_thread_ = std::thread(loop, &blocking_io_, "blocking");
  return OkStatus();
}

void Supervisor::Stop() {
  slurm_->Stop();  // Slurm's jobs run on; a restarted agent follows them again
  if (!thread_.joinable()) return;
  hub_.Stop();
  uploads_->Stop();  // checkpoint.upload_to, resume downloads: their callbacks post to io_
  blocking_work_.reset();
  blocking_io_.stop();
  blocking_thread_.join();
  work_.reset();
  io_.stop();
  thread_.join();
  runs_.clear();
}

// MASTER_ADDR for the ranks of node 0 of a multi-node job. The trainer binds Gloo to loopback when
// MASTER_ADDR is a loopback address, which the other nodes could not reach; so a loopback `reported`
// address (an agent behind an SSH tunnel, whose client tells the other nodes its own name for this
// host) is replaced by this host's name when that resolves. Otherwise `reported` itself.
std::string Supervisor::NodeZeroMasterAddr(const std::string& reported) {
  return IsLoopbackHost(reported) && !HostName().empty() ? HostName() : reported;
}

const std::string& Supervisor::HostName() {
  std::call_once(host_name_once_, [this] { host_name_ = ResolvableHostName(); });
  return host_name_;
}

SupervisorStats Supervisor::Stats() const {
  MutexLock lock(&stats_mu_);
  return stats_;
}

std::shared_ptr<const JobSpec> Supervisor::SpecOf(const std::string& job_id) const {
  MutexLock lock(&specs_mu_);
  auto it = specs_.find(job_id);
  return it == specs_.end() ? nullptr : it->second;
}

StatusOr<JobRecord> Supervisor::GetJob(const std::string& job_id) {
  SFT_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  rec.spec = SpecOf(job_id);
  if (!rec.spec && !IsFinal(rec.state))
    return InternalError(job_id +
                         ": the agent holds no spec for it (it was neither submitted nor recovered)");
  return rec;
}

void Supervisor::SetSpec(JobRecord* rec, std::shared_ptr<const JobSpec> spec) {
  rec->spec_json = CanonicalSpecJson(*spec);
  rec->spec = spec;
  RememberSpec(rec->id, std::move(spec));
}

void Supervisor::RememberSpec(const std::string& job_id, std::shared_ptr<const JobSpec> spec) {
  MutexLock lock(&specs_mu_);
  specs_[job_id] = std::move(spec);
}

void Supervisor::ForgetSpec(const std::string& job_id) {
  MutexLock lock(&specs_mu_);
  specs_.erase(job_id);
}

void Supervisor::Submit(::sftctl::v1::SubmitJobRequest req, JobCallback done) {
  boost::asio::post(blocking_io_,
                    [this, req = std::move(req), done = std::move(done)] { PrepareSubmit(req, done); });
}

void Supervisor::Cancel(std::string job_id, JobCallback done) {
  boost::asio::post(io_, [this, id = std::move(job_id), done = std::move(done)] { DoCancel(id, done); });
}

StatusOr<std::shared_ptr<Journal>> Supervisor::JournalFor(const std::string& job_id) {
  MutexLock lock(&journals_mu_);
  auto it = journals_.find(job_id);
  if (it != journals_.end()) return it->second;
  if (journals_.size() >= 64) {
    // Bound open files: drop journals of finished jobs that nobody is reading.
    for (auto e = journals_.begin(); e != journals_.end();) {
      e = e->second.use_count() == 1 && e->second->finished() ? journals_.erase(e) : std::next(e);
    }
  }
  SFT_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  SFT_ASSIGN_OR_RETURN(std::shared_ptr<Journal> j, Journal::Open(rec.job_dir + "/journal.jsonl", config_.fs));
  j->SetFinished(IsFinal(rec.state));
  journals_[job_id] = j;
  return j;
}

Status Supervisor::Transition(JobRecord* rec, Journal* journal, JobState state, const std::string& reason,
                              bool* saved) {
  const bool final = IsFinal(state);
  JournalEvent ev;
  ev.kind = Event::STATE;
  ev.state = state;
  ev.text = reason;
  // The database, not the journal, says what runs: the job is saved even when its journal cannot
  // take the event (disk full), so that a restarted agent never launches a running job again.
  Status journaled = journal->Append({ev}).status();
  if (journaled.ok() && final) journaled = journal->Flush();  // durable before the final state
  const int64_t now = NowMs();
  const JobRecord before = *rec;
  // The history entry and the record's start/finish times are one reading of the clock, so that
  // every view of the job's run time (client/remote/job_usage.h) agrees.
  if (state == JobState::RUNNING && rec->state != JobState::RUNNING) rec->started_ms = now;
  rec->state = state;
  rec->reason = reason;
  if (final) rec->finished_ms = now;
  HistoryRecord h{state, reason, now};
  Status st = store_->SaveJob(*rec, &h);
  if (saved != nullptr) *saved = st.ok();
  if (!st.ok()) {
    *rec = before;  // memory keeps agreeing with the database
    return st.WithContext("saving the job as " + std::string(JobStateName(state)));
  }
  journal->SetFinished(final);
  if (final) ForgetSpec(rec->id);  // rec keeps its spec for what follows (the uploads' FinishJob)
  spdlog::info("{}: {} ({})", rec->id, JobStateName(state), reason);
  return journaled.WithContext("journaling the job's state " + std::string(JobStateName(state)));
}

// On the blocking thread: creates the job (or finds the one its client request id made), then hands
// it to the event thread, which queues it and answers.
void Supervisor::PrepareSubmit(const ::sftctl::v1::SubmitJobRequest& req, const JobCallback& done) {
  bool created = false;
  StatusOr<JobRecord> rec = CreateJob(req, &created);
  // S3 credentials (submit --forward-aws-credentials): memory only, like the HF token.
  if (rec.ok() && created && !req.aws_credentials().access_key_id().empty()) {
    const auto& c = req.aws_credentials();
    uploads_->SetCredentials(*rec->spec,
                             {c.access_key_id(), c.secret_access_key(), c.session_token(), "the client"});
  }
  if (rec.ok() && created) uploads_->SetHubToken(*rec->spec, req.hf_token());  // hf://
  if (rec.ok() && created) {  // s3://: the run keys that sign and check its manifests (agent.db too)
    uploads_->SetCheckpointKeys(*rec->spec,
                                CheckpointKeys(req.checkpoint_keys().begin(), req.checkpoint_keys().end()));
  }
  if (rec.ok() && created && rec->slurm) {  // its uploads watch the run folder in the shared dir
    auto journal = JournalFor(rec->id);
    StartUploads(*rec, journal.ok() ? journal->get() : nullptr);
  }
  boost::asio::post(io_, [this, rec = std::move(rec), created, done, token = req.hf_token()]() mutable {
    if (rec.ok() && created) {
      QueueJob(&*rec, token);
      auto it = runs_.find(rec->id);
      if (it != runs_.end()) rec = it->second->rec;  // launched at once
    }
    done(std::move(rec));
  });
}

// checkpoint.upload_to (agent/jobs/checkpoint_upload.h): why the uploader cannot start (no credentials or
// Hub token, ...) goes to the agent's log and, as a line of the job's output, to `sftctl logs`.
void Supervisor::StartUploads(const JobRecord& rec, Journal* journal) {
  Status up = uploads_->StartJob(rec.id, *rec.spec, config_.hub);
  if (up.ok()) return;
  spdlog::error("{}: {}", rec.id, up.message());
  if (journal == nullptr) return;
  JournalEvent ev;
  ev.kind = ::sftctl::v1::Event::STDERR;
  ev.text = "sftd: " + up.message();
  if (auto appended = journal->Append({ev}); !appended.ok())
    spdlog::error("{}: {}", rec.id, appended.status().ToString());
}

// On the event thread. A spec with hf:// paths goes to the HubFetcher first, one that resumes from
// s3:// then to the bucket download (the job stays QUEUED, its reason says what downloads); any other
// job is queued for launch.
void Supervisor::QueueJob(JobRecord* rec, const std::string& token) {
  if (rec->slurm) return;  // Slurm's queue holds it (SubmitSlurmJob)
  const std::vector<SpecHubPath> fields = HubPaths(*rec->spec);
  if (fields.empty()) {
    const std::string bucket = CheckpointUploads::ResumeBucket(*rec->spec);
    if (!bucket.empty()) return FetchResume(rec, bucket);
    scheduler_.Enqueue(rec->id, rec->gpus, rec->gpus > 0 ? 0 : rec->world_size);
    Schedule();
    return;
  }
  std::string what;
  for (const SpecHubPath& f : fields) what += (what.empty() ? "" : ", ") + f.value;
  auto journal = JournalFor(rec->id);
  Status st = journal.ok() ? Transition(rec, journal->get(), JobState::QUEUED,
                                        "downloading from the Hugging Face Hub: " + what)
                           : journal.status();
  if (!st.ok()) spdlog::error("{}: {}", rec->id, st.ToString());
  downloading_.insert(rec->id);
  hub_.Fetch({rec->id, rec->spec, token},
             [this](const std::string& id, StatusOr<std::shared_ptr<const JobSpec>> spec) {
               boost::asio::post(io_, [this, id, spec = std::move(spec)]() mutable {
                 FinishHubFetch(id, std::move(spec));
               });
             });
  Schedule();  // the stats count the download as queued
}

// On the event thread: `resume: s3://` downloads on a thread of uploads_, with the job's forwarded
// credentials (or the host's).
void Supervisor::FetchResume(JobRecord* rec, const std::string& bucket) {
  auto journal = JournalFor(rec->id);
  Status st = journal.ok() ? Transition(rec, journal->get(), JobState::QUEUED,
                                        "downloading the checkpoint to resume from: " + bucket)
                           : journal.status();
  if (!st.ok()) spdlog::error("{}: {}", rec->id, st.ToString());
  downloading_.insert(rec->id);
  uploads_->FetchResume(rec->id, rec->spec,
                        [this](const std::string& id, StatusOr<CheckpointUploads::Resumed> r) {
                          boost::asio::post(io_, [this, id, r = std::move(r)]() mutable {
                            if (!r.ok()) return FinishHubFetch(id, r.status());
                            FinishHubFetch(id, std::move(r->spec), r->what);
                          });
                        });
  Schedule();
}

// On the event thread: the download ended. A job cancelled meanwhile stays cancelled.
void Supervisor::FinishHubFetch(const std::string& job_id, StatusOr<std::shared_ptr<const JobSpec>> spec,
                                const std::string& what) {
  downloading_.erase(job_id);
  auto rec = GetJob(job_id);
  auto journal = JournalFor(job_id);
  Status st = !rec.ok() ? rec.status() : journal.status();
  if (st.ok() && rec->state == JobState::QUEUED) {
    if (!spec.ok()) {
      st = Transition(&*rec, journal->get(), JobState::FAILED, "download: " + spec.status().message());
    } else {
      SetSpec(&*rec, std::move(*spec));  // saved with the transition
      // The launch reads spec.json: the resolved spec replaces the submitted one there first.
      const Status saved = WriteFileAtomic(config_.fs, rec->job_dir + "/spec.json", rec->spec_json);
      st = saved.ok() ? Transition(&*rec, journal->get(), JobState::QUEUED, what)
                      : Transition(&*rec, journal->get(), JobState::FAILED,
                                   "download: cannot save the job's spec.json: " + saved.message());
      if (st.ok() && saved.ok())
        QueueJob(&*rec, "");  // next: the bucket's checkpoint to resume from, or the launch
    }
  }
  if (!st.ok()) spdlog::error("{}: {}", job_id, st.ToString());
  Schedule();
}

Status Supervisor::CreateJobFolder(JobRecord* rec) {
  const Status made = MakePrivateDir(rec->job_dir, rec->slurm);
  if (made.ok()) return made;
  // Never write into a folder this agent did not make: the failed job's record and journal move to a
  // folder of its own in the data dir; where none can be made either, the record alone says why.
  const std::string why = "cannot create the job folder: " + made.message();
  rec->job_dir = JobDir(rec->id);
  const Status fallback = MakePrivateDir(rec->job_dir, false);
  if (!fallback.ok()) spdlog::error("{}: {}", rec->id, fallback.ToString());
  FailNewJob(rec, why);
  return FailedPreconditionError(rec->id + ": " + why);
}

void Supervisor::FailNewJob(JobRecord* rec, const std::string& why) {
  Status st = store_->SaveJob(*rec, nullptr);  // (its folder as it is now: the journal's is read from it)
  StatusOr<std::shared_ptr<Journal>> journal = st.ok() ? JournalFor(rec->id) : st;
  if (journal.ok()) {
    st = Transition(rec, journal->get(), JobState::FAILED, why);
  } else {
    rec->state = JobState::FAILED;
    rec->reason = why;
    rec->finished_ms = NowMs();
    const HistoryRecord h{rec->state, rec->reason, rec->finished_ms};
    st = store_->SaveJob(*rec, &h).WithContext(journal.status().message());
  }
  if (!st.ok()) spdlog::error("{}: {}", rec->id, st.ToString());
}

StatusOr<std::shared_ptr<Journal>> Supervisor::FillJobFolder(JobRecord* rec,
                                                             const std::vector<SpecFolder>& folders,
                                                             const std::vector<SpecBlobRef>& refs, bool slurm,
                                                             JobSpec spec) {
  SFT_RETURN_IF_ERROR(config_.fs->CreateDirs(rec->job_dir + "/logs"));
  SFT_RETURN_IF_ERROR(config_.fs->CreateDirs(rec->job_dir + "/run"));
  SFT_RETURN_IF_ERROR(MaterializeFolders(rec->job_dir, folders, &spec));
  if (slurm) SFT_RETURN_IF_ERROR(slurm::MoveInputsIntoJobFolder(rec->job_dir, FileRefPointers(refs), &spec));
  spec.output_dir = rec->job_dir + "/run";
  SetSpec(rec, std::make_shared<const JobSpec>(std::move(spec)));
  SFT_RETURN_IF_ERROR(WritePrivateFile(rec->job_dir + "/spec.json", rec->spec_json));
  SFT_RETURN_IF_ERROR(store_->SaveJob(*rec, nullptr));
  SFT_ASSIGN_OR_RETURN(auto journal, JournalFor(rec->id));
  JournalEvent ev;
  ev.kind = Event::STATE;
  ev.state = JobState::QUEUED;
  ev.text = "submitted";
  SFT_RETURN_IF_ERROR(journal->Append({ev}).status());
  return journal;
}

// The job's record, folders, spec.json and journal (blocking thread; runs one at a time, so two
// submits with the same client request id cannot both create a job).
StatusOr<JobRecord> Supervisor::CreateJob(const ::sftctl::v1::SubmitJobRequest& req, bool* created) {
  if (!req.client_request_id().empty()) {
    SFT_ASSIGN_OR_RETURN(auto found, store_->FindByRequestId(req.client_request_id()));
    if (found) return GetJob(*found);
  }
  if (req.gpus() > 0 && req.cpu_ranks() > 0) {
    return InvalidArgumentError("cpu_ranks: must be 0 when gpus > 0 (one rank per GPU)");
  }
  std::vector<SpecBlobRef> refs;
  for (const auto& b : req.blobs()) refs.push_back({b.json_pointer(), b.sha256(), b.dir_entry()});
  auto blob_path = [this](const std::string& sha) -> StatusOr<std::string> {
    SFT_ASSIGN_OR_RETURN(BlobStore::Stat st, blobs_->StatBlob(sha));
    if (!st.complete) {
      return FailedPreconditionError("blob " + sha + " is not uploaded (agent holds " +
                                     std::to_string(st.size) + " bytes); UploadBlob it first");
    }
    return blobs_->BlobPath(sha);
  };
  std::vector<SpecFolder> folders;
  SFT_ASSIGN_OR_RETURN(JobSpec spec, ValidateSpec(req.spec_json(), refs, blob_path, &folders,
                                                  config_.spec_parsed));  // the parse
  SFT_ASSIGN_OR_RETURN(std::optional<slurm::SlurmOptions> sl, SlurmPreflight(spec));
  // `world`: the ranks on this host (all of them unless the job spans several nodes; Slurm's: all).
  uint32_t world = req.gpus() > 0 ? req.gpus() : std::max<uint32_t>(1, req.cpu_ranks());
  if (sl) world = sl->world_size();
  SFT_ASSIGN_OR_RETURN(::sftctl::v1::Rendezvous rdzv, NodeRendezvous(req, world, config_.rendezvous_addr));
  if (rdzv.num_nodes() > 1 && rdzv.node_rank() == 0) HostName();  // DNS here, not at launch
  if (!sl) SFT_RETURN_IF_ERROR(scheduler_.CheckFits(req.gpus(), req.gpus() > 0 ? 0 : world));
  JobRecord rec;
  rec.name = req.name();
  rec.stop_when_done = req.stop_when_done();
  rec.client_request_id = req.client_request_id();
  rec.state = JobState::QUEUED;
  rec.reason = "submitted";
  rec.gpus = sl ? sl->nodes * sl->gpus_per_node : req.gpus();
  rec.world_size = world;
  // A multi-node job never restarts: its other nodes would not restart with it (Slurm requeues its own).
  rec.max_restarts = rdzv.num_nodes() > 1 || sl ? 0 : req.max_restarts();
  rec.heartbeat_s = req.heartbeat_timeout_s();
  rec.rendezvous = rdzv;
  rec.created_ms = NowMs();
  rec.job_dir = (sl ? slurm_jobs_dir_ : config_.data_dir + "/jobs") + "/";  // InsertJob appends the id
  rec.slurm = sl.has_value();
  // The run keys are saved with the job, before it is acknowledged: a restarted agent still signs its
  // uploads and resumes only from its own checkpoints (Recover).
  SFT_ASSIGN_OR_RETURN(rec, store_->InsertJob(std::move(rec), CheckpointKeys(req.checkpoint_keys().begin(),
                                                                             req.checkpoint_keys().end())));
  SFT_RETURN_IF_ERROR(CreateJobFolder(&rec));
  StatusOr<std::shared_ptr<Journal>> filled =
      FillJobFolder(&rec, folders, refs, sl.has_value(), std::move(spec));
  if (!filled.ok()) {
    const std::string why = "cannot set up the job: " + filled.status().message();
    FailNewJob(&rec, why);
    return Status(filled.status().code(), rec.id + ": " + why);
  }
  const std::shared_ptr<Journal>& journal = *filled;
  if (IsMultiNode(rec)) {
    spdlog::info("{}: submitted node {}/{} of group '{}' ({} GPUs, ranks {}..{} of {}, master {}:{})", rec.id,
                 rdzv.node_rank(), rdzv.num_nodes(), rdzv.group_id(), rec.gpus, rdzv.rank_offset(),
                 rdzv.rank_offset() + world - 1, rdzv.world_size(), rdzv.master_addr(), rdzv.master_port());
  } else {
    spdlog::info("{}: submitted ({} GPUs, world size {})", rec.id, rec.gpus, world);
  }
  if (sl) SFT_RETURN_IF_ERROR(SubmitSlurmJob(&rec, *sl, journal));
  *created = true;
  return rec;
}

// The store is read on the blocking thread; the cancels run on the event thread. A job whose stop
// began already is not cancelled again (no second CANCELLING line, no second scancel).
void Supervisor::CancelAll(std::string reason, std::function<void(size_t)> done) {
  boost::asio::post(blocking_io_, [this, reason = std::move(reason), done = std::move(done)]() mutable {
    std::set<std::string> ids;
    auto jobs = store_->ListJobs();
    if (!jobs.ok()) spdlog::error("cancelling every job: {}", jobs.status().ToString());
    for (const JobRecord& rec : jobs.ok() ? *jobs : std::vector<JobRecord>{}) {
      // A CANCELLING job is being stopped already (its run, if local, is added below: a no-op there).
      if (!IsFinal(rec.state) && rec.state != JobState::CANCELLING) ids.insert(rec.id);
    }
    boost::asio::post(
        io_, [this, ids = std::move(ids), reason = std::move(reason), done = std::move(done)]() mutable {
          for (const auto& [id, run] : runs_) {
            if (!run->stop || run->stop->state != JobState::CANCELLED) ids.insert(id);
          }
          size_t cancelled = 0;
          for (const std::string& id : ids) {
            auto count = [&cancelled, &id](StatusOr<JobRecord> r) {
              if (r.ok()) {
                ++cancelled;
              } else if (r.status().code() != StatusCode::kFailedPrecondition) {  // not "already finished"
                spdlog::warn("{}: cancel: {}", id, r.status().ToString());
              }
            };
            DoCancel(id, count, reason);
          }
          done(cancelled);
        });
  });
}

void Supervisor::DoCancel(const std::string& job_id, const JobCallback& done, const std::string& reason) {
  auto result = [&]() -> StatusOr<JobRecord> {
    auto it = runs_.find(job_id);
    if (it != runs_.end()) {
      BeginStop(it->second.get(), {JobState::CANCELLED, reason, false});
      return it->second->rec;
    }
    SFT_ASSIGN_OR_RETURN(JobRecord rec, GetJob(job_id));
    if (IsFinal(rec.state)) {
      return FailedPreconditionError("job " + job_id + " already finished: " + JobStateName(rec.state));
    }
    if (rec.slurm) {  // scancel; Slurm reports the end (ApplySlurmUpdate)
      SFT_ASSIGN_OR_RETURN(auto journal, JournalFor(job_id));
      SFT_RETURN_IF_ERROR(Transition(&rec, journal.get(), JobState::CANCELLING, reason + " (scancel)"));
      slurm_->Cancel(job_id);
      return rec;
    }
    scheduler_.Dequeue(job_id);
    hub_.Cancel(job_id);
    uploads_->CancelResume(job_id);
    uploads_->FinishJob(*rec.spec);  // forgets forwarded credentials
    downloading_.erase(job_id);
    SFT_ASSIGN_OR_RETURN(auto journal, JournalFor(job_id));
    SFT_RETURN_IF_ERROR(Transition(&rec, journal.get(), JobState::CANCELLED, reason));
    Schedule();
    return rec;
  }();
  done(std::move(result));
}

void Supervisor::Schedule() {
  for (;;) {
    std::vector<Allocation> allocs = scheduler_.Admit();
    if (allocs.empty()) break;
    for (const Allocation& a : allocs) Launch(a);
  }
  MutexLock lock(&stats_mu_);
  size_t slurm_running = 0;  // Slurm jobs count as the agent's own (an idle stop waits for them)
  for (const auto& [id, state] : slurm_jobs_) slurm_running += state == JobState::QUEUED ? 0 : 1;
  stats_.running = static_cast<uint32_t>(runs_.size() + slurm_running);
  stats_.queued =
      static_cast<uint32_t>(scheduler_.queued() + downloading_.size() + slurm_jobs_.size() - slurm_running);
  stats_.gpus_total = scheduler_.gpus_total();
  stats_.gpus_free = scheduler_.gpus_free();
}

void Supervisor::Launch(const Allocation& alloc) {
  auto rec_or = GetJob(alloc.job_id);
  auto journal_or = JournalFor(alloc.job_id);  // opened at submit or recovery: no replay here
  Status st = !rec_or.ok() ? rec_or.status() : journal_or.status();
  if (st.ok() && rec_or->state != JobState::QUEUED)  // e.g. cancelled before the submit was queued
    st = FailedPreconditionError("job is " + std::string(JobStateName(rec_or->state)));
  if (!st.ok()) {
    spdlog::error("{}: cannot launch: {}", alloc.job_id, st.ToString());
    scheduler_.Release(alloc.job_id);
    return;
  }
  auto run = std::make_unique<Run>(config_.kill_grace);
  run->rec = std::move(*rec_or);
  run->journal = *journal_or;
  JobRecord& rec = run->rec;
  rec.assigned_gpus = alloc.gpus;
  st = config_.fs->CreateDirs(rec.job_dir + "/logs");
  if (st.ok()) st = config_.fs->CreateDirs(rec.job_dir + "/run");
  if (st.ok() && !config_.fs->Exists(rec.job_dir + "/spec.json"))
    st = WriteFileAtomic(config_.fs, rec.job_dir + "/spec.json", rec.spec_json);
  const std::vector<RankEnv> envs = RankEnvs(rec, alloc);
  StatusOr<std::vector<SpawnedRank>> spawned = st.ok()
                                                   ? StartJobRanks(config_.trainer_path, rec.job_dir, envs)
                                                   : StatusOr<std::vector<SpawnedRank>>(st);
  if (!spawned.ok()) return FailLaunch(&rec, run->journal.get(), {}, spawned.status());
  auto offsets = run->journal->source_offsets();
  rec.ranks.clear();
  for (const SpawnedRank& s : *spawned) {
    RankRun live;
    JournaledUpTo(offsets, s.rank, live.off);
    run->AddRank({s.rank, s.pid, s.start_time, /*running=*/true, RankExit()}, std::move(live));
  }
  rec.pgid = spawned->front().pid;
  rec.first_failed_rank = -1;
  std::string why = "launched " + std::to_string(rec.world_size) + " rank(s)" +
                    (alloc.gpus.empty() ? " on CPU" : " on GPUs " + JoinGpus(alloc.gpus)) + ", attempt " +
                    std::to_string(rec.restarts + 1);
  if (IsMultiNode(rec)) {
    const RankEnv& first = envs.front();
    why += "; node " + std::to_string(rec.rendezvous.node_rank()) + "/" +
           std::to_string(rec.rendezvous.num_nodes()) + ", ranks " + std::to_string(first.rank) + ".." +
           std::to_string(first.rank + static_cast<int>(rec.world_size) - 1) + " of " +
           std::to_string(rec.rendezvous.world_size()) + ", master " + first.master_addr + ":" +
           std::to_string(first.master_port);
  }
  bool saved = false;
  st = Transition(&rec, run->journal.get(), JobState::RUNNING, why, &saved);
  // Ranks the database does not know about would run untracked and be launched again after a
  // restart: stop them, and fail the job (as far as the database can still be written).
  if (!saved) return FailLaunch(&rec, run->journal.get(), *spawned, st);
  run->last_progress = run->last_save = config_.clock->Now();
  StartUploads(rec, run->journal.get());
  Run* raw = run.get();
  runs_[rec.id] = std::move(run);
  WatchExits(raw);
  ArmTimer(raw);
  if (!st.ok()) {
    // Saved, but its journal cannot take events: the ranks are tracked; stop them cleanly.
    spdlog::error("{}: {}", rec.id, st.ToString());
    BeginStop(raw, {JobState::FAILED, "disk full? cannot journal the job: " + st.message(), false});
  }
}

// The environment of each rank of this host: ranks rank_offset.. of a multi-node job, or 0..
std::vector<RankEnv> Supervisor::RankEnvs(const JobRecord& rec, const Allocation& alloc) {
  RankEnv env;
  env.world_size =
      IsMultiNode(rec) ? static_cast<int>(rec.rendezvous.world_size()) : static_cast<int>(rec.world_size);
  env.local_world_size = static_cast<int>(rec.world_size);
  if (!IsMultiNode(rec)) {
    env.master_port = FreeTcpPort();
  } else {
    env.master_port = static_cast<int>(rec.rendezvous.master_port());
    env.master_addr = rec.rendezvous.node_rank() > 0 ? rec.rendezvous.master_addr()
                                                     : NodeZeroMasterAddr(rec.rendezvous.master_addr());
  }
  env.cuda_visible_devices = JoinGpus(alloc.gpus);  // "" on CPU: no GPU
  std::vector<RankEnv> envs;
  for (uint32_t r = 0; r < rec.world_size; ++r) {
    env.rank = static_cast<int>(rec.rendezvous.rank_offset() + r);
    env.local_rank = static_cast<int>(r);
    envs.push_back(env);
  }
  return envs;
}

void Supervisor::FailLaunch(JobRecord* rec, Journal* journal, const std::vector<SpawnedRank>& ranks,
                            const Status& why) {
  spdlog::error("{}: cannot launch: {}", rec->id, why.ToString());
  if (!ranks.empty()) ::killpg(ranks.front().pid, SIGKILL);  // our unreaped children: not reused
  for (const SpawnedRank& r : ranks) ::waitpid(r.pid, nullptr, 0);
  scheduler_.Release(rec->id);
  rec->assigned_gpus.clear();
  rec->pgid = 0;
  rec->ranks.clear();
  Status t = Transition(rec, journal, JobState::FAILED, "launch: " + why.message());
  if (!t.ok()) spdlog::error("{}: {}", rec->id, t.ToString());
}

void Supervisor::WatchExits(Run* run) {
  for (size_t i = 0; i < run->ranks.size(); ++i) {
    RankRun& rr = run->ranks[i];
    if (!run->rec.ranks[i].running || rr.exit_fd) continue;
    int fd = OpenPidFd(static_cast<pid_t>(run->rec.ranks[i].pid));
    if (fd < 0) continue;  // no pidfd: the poll timer notices the exit
    rr.exit_fd = std::make_shared<boost::asio::posix::stream_descriptor>(io_, fd);
    std::string id = run->rec.id;
    rr.exit_fd->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                           [this, id](const boost::system::error_code& ec) {
                             if (ec) return;  // cancelled: the run is gone
                             auto it = runs_.find(id);
                             if (it != runs_.end()) Tick(it->second.get());
                           });
  }
}

void Supervisor::ArmTimer(Run* run) {
  if (!run->timer) run->timer = std::make_unique<boost::asio::steady_timer>(io_);
  run->timer->expires_after(config_.poll);
  std::string id = run->rec.id;
  run->timer->async_wait([this, id](const boost::system::error_code& ec) {
    if (ec) return;
    auto it = runs_.find(id);
    if (it != runs_.end()) Tick(it->second.get());
  });
}

bool Supervisor::Drain(Run* run, bool final_drain) {
  std::vector<JournalEvent> events;
  std::vector<std::pair<uint64_t*, uint64_t>> advanced;  // rank-file offsets, applied once journaled
  bool more = false;
  for (size_t i = 0; i < run->ranks.size(); ++i) {
    RankRun& rr = run->ranks[i];
    const int rank = run->rec.ranks[i].rank;
    for (int src = 0; src < 3; ++src) {
      bool at_eof = true, beyond = false;
      const std::string buf =
          ReadRankOutput(RankFile(run->rec.job_dir, rank, src), rr.off[src], &at_eof, &beyond);
      if (buf.empty()) continue;
      more |= beyond;
      const size_t used = SplitLines(run, rank, &rr, src, buf, final_drain && at_eof, &events);
      advanced.push_back({&rr.off[src], rr.off[src] + used});
    }
  }
  if (events.empty()) return more;
  auto appended = run->journal->Append(std::move(events));
  if (!appended.ok()) {
    // Nothing of this batch was journaled: the rank files keep their offsets (the output is read
    // again later), and the job stops rather than run on with output nobody can see.
    spdlog::error("{}: journal: {}", run->rec.id, appended.status().ToString());
    BeginStop(run, {JobState::FAILED,
                    "disk full? cannot journal the job's output: " + appended.status().message(), false});
    return false;
  }
  for (const auto& [off, to] : advanced) *off = to;
  return more;
}

size_t Supervisor::SplitLines(Run* run, int rank, RankRun* rr, int src, const std::string& buf,
                              bool last_piece, std::vector<JournalEvent>* events) {
  const size_t first = events->size();
  const size_t used = SplitRankOutput(rank, src, rr->off[src], buf, last_piece, events);
  if (src == 2) {
    for (size_t k = first; k < events->size(); ++k) NoteTrainerEvent(run, rr, rank, (*events)[k].text);
  }
  return used;
}

// Progress (step, loss) and the trainer's outcome events ("done", "error") from one line of its event
// stream, read by ParseTrainerEvent (common/event_line.h): the live path (SplitLines) and the journal
// replay of a recovered job (RecoverRun) both come here. A line that is not a trainer event, or has a
// field of the wrong type, is none of these (the journal keeps it as it was).
void Supervisor::NoteTrainerEvent(Run* run, RankRun* rr, int rank, const std::string& line) {
  StatusOr<EventLine> ev = ParseTrainerEvent(line, rank);
  if (!ev.ok()) return;
  switch (ev->type) {
    case EventKind::kStep:
      if (ev->step) run->rec.last_step = *ev->step;
      if (ev->loss) run->rec.last_loss = *ev->loss;
      run->last_progress = config_.clock->Now();
      run->progress_dirty = true;
      break;
    case EventKind::kDone:
      run->trainer.done = true;
      break;
    case EventKind::kError:
      run->trainer.error = true;
      if (!ev->message.empty() && run->trainer.first_error.empty()) run->trainer.first_error = ev->message;
      if (!ev->message.empty() && rr != nullptr && rr->trainer_error.empty()) rr->trainer_error = ev->message;
      break;
    default:
      break;
  }
}

// The job's process group is the group of its first rank (pgid == that rank's pid). A pid cannot
// be reused while it still names a live group, so a live process whose pid is the pgid but which
// is not that rank (another start time) means the whole group died while the agent was down and
// the number now belongs to someone else's group: it is never signalled.
bool Supervisor::GroupIsOurs(const Run& run) const {
  const pid_t pgid = static_cast<pid_t>(run.rec.pgid);
  if (pgid <= 0) return false;
  for (size_t i = 0; i < run.ranks.size(); ++i) {
    if (run.rec.ranks[i].pid == pgid && run.ranks[i].own_child) return true;  // not reused before we reap it
  }
  const bool pid_in_use = ::kill(pgid, 0) == 0 || errno == EPERM;
  if (!pid_in_use) return true;  // the leader is gone; any member left keeps the number ours
  for (const RankRecord& k : run.rec.ranks) {
    if (k.pid == pgid) return SameProcessAlive(pgid, k.start_time);
  }
  return false;
}

void Supervisor::SignalGroup(Run* run, int sig) {
  if (GroupIsOurs(*run)) {
    ::killpg(static_cast<pid_t>(run->rec.pgid), sig);
  } else if (run->rec.pgid > 0) {
    spdlog::warn("{}: process group {} now belongs to another process; not signalling it", run->rec.id,
                 run->rec.pgid);
  }
}

// running -> terminating (SIGTERM), or a cancel replacing the cause of a stop already under way.
void Supervisor::BeginStop(Run* run, StopCause cause) {
  const bool cancel = cause.state == JobState::CANCELLED;
  if (cancel) cause.requeue = false;
  if (!run->stop) {
    run->stop = cause;
    run->group.Begin(config_.clock->Now());
    if (run->AnyAlive()) SignalGroup(run, SIGTERM);
    spdlog::info("{}: stopping ({}); SIGTERM sent", run->rec.id, cause.reason);
  } else if (cancel && run->stop->state != JobState::CANCELLED) {
    run->stop = cause;
  } else {
    return;
  }
  if (cancel && run->rec.state == JobState::RUNNING) {
    Status st = Transition(&run->rec, run->journal.get(), JobState::CANCELLING, cause.reason);
    if (!st.ok()) spdlog::error("{}: {}", run->rec.id, st.ToString());
  }
}

bool Supervisor::ReapRanks(Run* run) {
  std::vector<EndedRank> reaped;
  for (size_t i = 0; i < run->ranks.size(); ++i) {
    RankRecord& k = run->rec.ranks[i];
    RankRun& rr = run->ranks[i];
    if (!k.running) continue;
    const auto pid = static_cast<pid_t>(k.pid);
    if (rr.own_child) {
      int wstatus = 0;
      pid_t r = ::waitpid(pid, &wstatus, WNOHANG);
      if (r == pid) k.exit = RankExit::FromWaitStatus(wstatus);
      k.running = r == 0 || (r < 0 && errno != ECHILD);
    } else {
      k.running = SameProcessAlive(pid, k.start_time);
    }
    if (k.running) continue;
    rr.exit_fd.reset();
    reaped.push_back({k.rank, k.exit});
    if (!k.exit.known && run->trainer.error && !run->stop) {
      BeginStop(run,
                {JobState::FAILED,
                 "agent-restart: rank " + std::to_string(k.rank) + " ended after a trainer error", true});
    }
  }
  if (std::optional<EndedRank> first = run->group.FirstFailure(reaped)) {
    run->rec.first_failed_rank = first->rank;
    BeginStop(run,
              {JobState::FAILED, FirstFailureReason(*first, run->Live(first->rank)->trainer_error), true});
  }
  return !reaped.empty();
}

void Supervisor::Tick(Run* run) {
  Drain(run, false);
  const bool ranks_changed = ReapRanks(run);
  const bool any_alive = run->AnyAlive();
  const Clock::TimePoint now = config_.clock->Now();
  const uint32_t hb = run->rec.heartbeat_s > 0 ? run->rec.heartbeat_s : config_.default_heartbeat_s;
  if (any_alive && !run->stop && now - run->last_progress > std::chrono::seconds(hb))
    BeginStop(run, {JobState::FAILED, "hang: no step event for " + std::to_string(hb) + " s", true});
  if (run->group.KillDue(now) && run->rec.pgid > 0) {
    SignalGroup(run, SIGKILL);
    spdlog::info("{}: grace period over; SIGKILL sent", run->rec.id);
  }
  if (!any_alive) {
    // Every rank is gone; anything left in the process group (a rank's children) is killed before the
    // job may end, so nothing of it keeps holding a GPU.
    std::vector<pid_t> left =
        GroupIsOurs(*run) ? ProcessGroupMembers(static_cast<pid_t>(run->rec.pgid)) : std::vector<pid_t>();
    if (!left.empty()) {
      SignalGroup(run, SIGKILL);
      ArmTimer(run);
      return;
    }
    return Finalize(run);  // erases run
  }
  SaveRankRecords(run, ranks_changed, now);
  ArmTimer(run);
}

// Saves how the ranks ended as soon as one did (a restarted agent needs it), and the progress at
// most every kProgressSaveEvery, on the blocking thread.
void Supervisor::SaveRankRecords(Run* run, bool ranks_changed, Clock::TimePoint now) {
  if (ranks_changed) {
    Status st = store_->SaveJob(run->rec, nullptr);
    if (!st.ok()) spdlog::error("{}: {}", run->rec.id, st.ToString());
  } else if (run->progress_dirty && now - run->last_save >= kProgressSaveEvery) {
    boost::asio::post(blocking_io_,
                      [this, id = run->rec.id, step = run->rec.last_step, loss = run->rec.last_loss] {
                        Status st = store_->SaveProgress(id, step, loss);
                        if (!st.ok()) spdlog::error("{}: {}", id, st.ToString());
                      });
  } else {
    return;
  }
  run->progress_dirty = false;
  run->last_save = now;
}

// How a run whose ranks are all gone ends (see the table at the top).
Supervisor::StopCause Supervisor::Outcome(const Run& run) const {
  StopCause out;
  if (run.stop) {
    out = *run.stop;
    out.requeue = out.requeue && out.state == JobState::FAILED;
  } else {
    bool all_zero = true;
    for (const RankRecord& k : run.rec.ranks) all_zero &= k.exit.known && !k.exit.failed();
    if (all_zero) {
      out = {JobState::SUCCEEDED, "all " + std::to_string(run.ranks.size()) + " rank(s) exited 0", false};
    } else if (run.trainer.done && !run.trainer.error) {
      out = {JobState::SUCCEEDED, "trainer reported done (ranks ended while the agent was down)", false};
    } else {
      out = {JobState::FAILED, "agent-restart: ranks ended while the agent was down", true};
    }
  }
  if (out.state == JobState::FAILED && !run.group.first_failure() && !run.trainer.first_error.empty())
    out.reason += " (trainer error: " + run.trainer.first_error + ")";
  return out;
}

void Supervisor::Finalize(Run* run) {
  while (Drain(run, true)) {
  }  // everything the ranks wrote, however much arrived since the last tick
  JobRecord& rec = run->rec;
  const StopCause end = Outcome(*run);
  for (RankRecord& k : rec.ranks) k.running = false;
  scheduler_.Release(rec.id);
  rec.assigned_gpus.clear();
  Status st;
  if (end.requeue && rec.restarts < rec.max_restarts) {
    rec.restarts++;
    st = Transition(&rec, run->journal.get(), JobState::QUEUED,
                    "restart " + std::to_string(rec.restarts) + "/" + std::to_string(rec.max_restarts) +
                        " after: " + end.reason);
    scheduler_.Enqueue(rec.id, rec.gpus, rec.gpus > 0 ? 0 : rec.world_size);
  } else {
    st = Transition(&rec, run->journal.get(), end.state, end.reason);
    uploads_->FinishJob(*rec.spec);  // the last checkpoint still goes up
  }
  if (!st.ok()) spdlog::error("{}: {}", rec.id, st.ToString());
  runs_.erase(rec.id);
  Schedule();
}

// Recovery reads what a previous agent left on disk (the database, journals, rank files): one job
// whose record cannot be recovered is failed with the reason, and the agent still starts and serves
// the others (a damaged record must not stop it on every start).
Status Supervisor::Recover() {
  SFT_ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, store_->ListJobs());
  for (JobRecord& rec : jobs) {
    if (IsFinal(rec.state)) continue;
    Status st = rec.corrupt.empty() ? OkStatus() : DataLossError("its record is damaged: " + rec.corrupt);
    if (st.ok()) {
      try {
        StatusOr<std::shared_ptr<const JobSpec>> spec =
            ParseStoredSpec(rec.spec_json, rec.id + " spec", config_.spec_parsed);
        if (spec.ok()) {  // the job's one parse in this agent
          rec.spec = std::move(*spec);
          RememberSpec(rec.id, rec.spec);
        } else {
          st = DataLossError("its spec does not read back: " + spec.status().message());
        }
        if (st.ok()) st = RestoreCheckpointKeys(rec);
        if (st.ok()) st = RecoverJob(&rec);
      } catch (const std::exception& e) {  // the edge: nothing read from disk may stop the agent
        st = InternalError(e.what());
      }
    }
    if (!st.ok()) FailUnrecoverable(&rec, st);
  }
  return OkStatus();
}

// The run keys the job was submitted with (agent.db), back in uploads_ before its resume download or
// its uploader starts again. A job whose keys cannot be read is failed (Recover), never resumed from, or
// uploading, unsigned checkpoints.
Status Supervisor::RestoreCheckpointKeys(const JobRecord& rec) {
  StatusOr<CheckpointKeys> keys = store_->GetCheckpointKeys(rec.id);
  if (!keys.ok()) return DataLossError("its checkpoint keys do not read back: " + keys.status().message());
  uploads_->SetCheckpointKeys(*rec.spec, std::move(*keys));
  return OkStatus();
}

Status Supervisor::RecoverJob(JobRecord* rec_ptr) {
  JobRecord& rec = *rec_ptr;
  if (rec.slurm) {
    FollowSlurmJob(&rec);
    return OkStatus();
  }
  if (rec.state == JobState::QUEUED) {
    SFT_RETURN_IF_ERROR(JournalFor(rec.id).status());  // opened (replayed) now, not at launch
    if (IsMultiNode(rec) && rec.rendezvous.node_rank() == 0) HostName();  // DNS too
    const bool fetch = !HubPaths(*rec.spec).empty() || !CheckpointUploads::ResumeBucket(*rec.spec).empty();
    if (fetch) {
      recovered_hub_.push_back(rec.id);  // its download (hf://, s3:// resume) starts with the event thread
    } else {
      scheduler_.Enqueue(rec.id, rec.gpus, rec.gpus > 0 ? 0 : rec.world_size);
    }
    return OkStatus();
  }
  if (rec.state != JobState::RUNNING && rec.state != JobState::CANCELLING) return OkStatus();
  size_t alive = 0;
  std::string dead_rank;
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<Run> run, RecoverRun(rec, &alive, &dead_rank));
  scheduler_.Adopt(rec.id, rec.assigned_gpus, rec.gpus > 0 ? 0 : rec.world_size);
  Run* raw = run.get();
  runs_[rec.id] = std::move(run);
  if (rec.state == JobState::CANCELLING) {
    BeginStop(raw, {JobState::CANCELLED, rec.reason, false});
  } else if (alive > 0 && alive < raw->ranks.size()) {
    BeginStop(
        raw, {JobState::FAILED, "agent-restart: rank " + dead_rank + " died while the agent was down", true});
  }
  spdlog::info("{}: recovered after agent restart: {}/{} rank(s) alive", rec.id, alive, raw->ranks.size());
  // With the host's credentials (the client's are forgotten) and the job's run keys (RestoreCheckpointKeys).
  StartUploads(rec, raw->journal.get());
  WatchExits(raw);
  ArmTimer(raw);
  return OkStatus();
}

// A job Recover could not take back: its ranks that are still ours (same pid and start time) are
// killed, and it is FAILED with `why`; journaled when its journal opens, saved in the database anyway.
void Supervisor::FailUnrecoverable(JobRecord* rec, const Status& why) {
  for (const RankRecord& k : rec->ranks) {
    if (!k.running || !SameProcessAlive(static_cast<pid_t>(k.pid), k.start_time)) continue;
    ::kill(static_cast<pid_t>(k.pid == rec->pgid ? -k.pid : k.pid), SIGKILL);
  }
  for (RankRecord& k : rec->ranks) k.running = false;
  runs_.erase(rec->id);  // whatever a recovery that threw half-way left
  ForgetSpec(rec->id);
  scheduler_.Release(rec->id);
  (void)scheduler_.Dequeue(rec->id);
  rec->assigned_gpus.clear();
  const std::string reason = "agent-restart: cannot recover the job: " + why.message();
  spdlog::error("{}: {}", rec->id, reason);
  auto journal = JournalFor(rec->id);
  Status st;
  if (journal.ok()) {
    st = Transition(rec, journal->get(), JobState::FAILED, reason);
  } else {
    const int64_t now = NowMs();
    rec->state = JobState::FAILED;
    rec->reason = reason;
    rec->finished_ms = now;
    HistoryRecord h{JobState::FAILED, reason, now};
    st = store_->SaveJob(*rec, &h);
  }
  if (!st.ok()) spdlog::error("{}: {}", rec->id, st.ToString());
}

// A run re-attached to the ranks a previous agent started (not our children), with the trainer's
// outcome events journaled before that agent died (since the last launch).
StatusOr<std::unique_ptr<Supervisor::Run>> Supervisor::RecoverRun(const JobRecord& rec, size_t* alive,
                                                                  std::string* dead_rank) {
  SFT_ASSIGN_OR_RETURN(auto journal, JournalFor(rec.id));
  auto run = std::make_unique<Run>(config_.kill_grace);
  run->rec = rec;
  run->journal = journal;
  auto offsets = journal->source_offsets();
  for (RankRecord& k : run->rec.ranks) {
    RankRun rr;
    rr.own_child = false;
    k.running = k.running && SameProcessAlive(static_cast<pid_t>(k.pid), k.start_time);
    JournaledUpTo(offsets, k.rank, rr.off);
    if (k.running) ++*alive;
    if (!k.running && dead_rank->empty()) *dead_rank = std::to_string(k.rank);
    run->ranks.push_back(std::move(rr));
  }
  uint64_t last = journal->last_seq();
  auto tail = journal->Read(last > Journal::kRingSize ? last - Journal::kRingSize : 0, Journal::kRingSize);
  // The newest attempt's trainer events, read as the live path read them.
  for (const JournalEvent& ev : tail.ok() ? *tail : std::vector<JournalEvent>()) {
    if (ev.kind == Event::STATE && ev.state == JobState::RUNNING) {
      run->trainer = TrainerReport();
      for (RankRun& rr : run->ranks) rr.trainer_error.clear();
    }
    if (ev.kind != Event::METRIC) continue;
    NoteTrainerEvent(run.get(), run->Live(ev.rank), ev.rank, ev.text);
  }
  run->last_progress = run->last_save = config_.clock->Now();
  return run;
}

}  // namespace sftctl::agent
