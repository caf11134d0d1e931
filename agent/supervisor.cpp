#include "agent/supervisor.h"

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
#include <future>
#include <nlohmann/json.hpp>

#include "agent/job_spec.h"
#include "agent/launcher.h"
#include "common/file_system.h"
#include "common/net_addr.h"
#include "common/process_util.h"

namespace sftctl::agent {
namespace {

using Clock = std::chrono::steady_clock;
using ::sftctl::v1::Event;

constexpr size_t kMaxLine = 64 * 1024;       // longer output lines are split
constexpr size_t kMaxReadPerTick = 4 << 20;  // per file and tick: bounds memory
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

// MASTER_ADDR for the ranks of node 0 of a multi-node job. The trainer binds Gloo to loopback when
// MASTER_ADDR is a loopback address, which the other nodes could not reach; so a loopback `reported`
// address (an agent behind an SSH tunnel, whose client tells the other nodes its own name for this
// host) is replaced by this host's name when that resolves. Otherwise `reported` itself.
std::string NodeZeroMasterAddr(const std::string& reported) {
  if (!IsLoopbackHost(reported)) return reported;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return reported;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &res) != 0) return reported;
  ::freeaddrinfo(res);
  return name;
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

}  // namespace

Supervisor::Supervisor(SupervisorConfig config, StateStore* store, BlobStore* blobs)
    : config_(std::move(config)), store_(store), blobs_(blobs), scheduler_(config_.gpus, config_.cpu_slots) {}

Supervisor::~Supervisor() { Stop(); }

std::string Supervisor::JobDir(const std::string& id) const { return config_.data_dir + "/jobs/" + id; }

Status Supervisor::Start() {
  SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(config_.data_dir + "/jobs"));
  SFT_RETURN_IF_ERROR(Recover());
  work_ = std::make_unique<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>(
      io_.get_executor());
  boost::asio::post(io_, [this] { Schedule(); });
  thread_ = std::thread([this] {
    try {
      io_.run();
    } catch (const std::exception& e) {
      spdlog::critical("supervisor event loop died: {}", e.what());
      std::abort();
    }
  });
  return OkStatus();
}

void Supervisor::Stop() {
  if (!thread_.joinable()) return;
  work_.reset();
  io_.stop();
  thread_.join();
  runs_.clear();
}

void Supervisor::RunSync(std::function<void()> fn) {
  std::promise<void> p;
  boost::asio::post(io_, [&] {
    fn();
    p.set_value();
  });
  p.get_future().wait();
}

SupervisorStats Supervisor::Stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void Supervisor::Submit(::sftctl::v1::SubmitJobRequest req, JobCallback done) {
  boost::asio::post(io_, [this, req = std::move(req), done = std::move(done)] { DoSubmit(req, done); });
}

void Supervisor::Cancel(std::string job_id, JobCallback done) {
  boost::asio::post(io_, [this, id = std::move(job_id), done = std::move(done)] { DoCancel(id, done); });
}

StatusOr<std::shared_ptr<Journal>> Supervisor::JournalFor(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(journals_mu_);
  auto it = journals_.find(job_id);
  if (it != journals_.end()) return it->second;
  if (journals_.size() >= 64) {
    // Bound open files: drop journals of finished jobs that nobody is reading.
    for (auto e = journals_.begin(); e != journals_.end();) {
      e = e->second.use_count() == 1 && e->second->finished() ? journals_.erase(e) : std::next(e);
    }
  }
  SFT_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
  SFT_ASSIGN_OR_RETURN(std::shared_ptr<Journal> j, Journal::Open(rec.job_dir + "/journal.jsonl"));
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
  spdlog::info("{}: {} ({})", rec->id, JobStateName(state), reason);
  return journaled.WithContext("journaling the job's state " + std::string(JobStateName(state)));
}

void Supervisor::DoSubmit(const ::sftctl::v1::SubmitJobRequest& req, const JobCallback& done) {
  auto result = [&]() -> StatusOr<JobRecord> {
    if (!req.client_request_id().empty()) {
      SFT_ASSIGN_OR_RETURN(auto found, store_->FindByRequestId(req.client_request_id()));
      if (found) return store_->GetJob(*found);
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
    SFT_ASSIGN_OR_RETURN(nlohmann::json spec, ValidateSpec(req.spec_json(), refs, blob_path, &folders));
    // `world`: the ranks on this host (all of them unless the job spans several nodes).
    uint32_t world = req.gpus() > 0 ? req.gpus() : std::max<uint32_t>(1, req.cpu_ranks());
    ::sftctl::v1::Rendezvous rdzv;
    if (req.has_rendezvous() && req.rendezvous().num_nodes() > 1) {
      rdzv = req.rendezvous();
      SFT_RETURN_IF_ERROR(ValidateRendezvous(rdzv, world));
      if (rdzv.node_rank() == 0) {
        // Node 0 hosts the TCPStore (its rank 0): a port free on every interface, and the address the
        // other nodes should use (the client may override it with the host name it reached us by).
        if (rdzv.master_port() == 0) rdzv.set_master_port(static_cast<uint32_t>(FreeTcpPort(true)));
        if (rdzv.master_addr().empty()) rdzv.set_master_addr(config_.rendezvous_addr);
      }
    }
    SFT_RETURN_IF_ERROR(scheduler_.CheckFits(req.gpus(), req.gpus() > 0 ? 0 : world));
    JobRecord rec;
    rec.name = req.name();
    rec.client_request_id = req.client_request_id();
    rec.state = JobState::QUEUED;
    rec.reason = "submitted";
    rec.gpus = req.gpus();
    rec.world_size = world;
    // A multi-node job never restarts: its other nodes would not restart with it.
    rec.max_restarts = rdzv.num_nodes() > 1 ? 0 : req.max_restarts();
    rec.heartbeat_s = req.heartbeat_timeout_s();
    rec.rendezvous = rdzv;
    rec.created_ms = NowMs();
    rec.job_dir = config_.data_dir + "/jobs/";  // InsertJob appends the id
    SFT_ASSIGN_OR_RETURN(rec, store_->InsertJob(std::move(rec)));
    SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(rec.job_dir + "/logs"));
    SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(rec.job_dir + "/run"));
    SFT_RETURN_IF_ERROR(MaterializeFolders(rec.job_dir, folders, &spec));
    SetOutputDir(&spec, rec.job_dir + "/run");
    rec.spec_json = spec.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    SFT_RETURN_IF_ERROR(WriteFileAtomic(FileSystem::Default(), rec.job_dir + "/spec.json", rec.spec_json));
    SFT_RETURN_IF_ERROR(store_->SaveJob(rec, nullptr));
    SFT_ASSIGN_OR_RETURN(auto journal, JournalFor(rec.id));
    JournalEvent ev;
    ev.kind = Event::STATE;
    ev.state = JobState::QUEUED;
    ev.text = "submitted";
    SFT_RETURN_IF_ERROR(journal->Append({ev}).status());
    scheduler_.Enqueue(rec.id, rec.gpus, rec.gpus > 0 ? 0 : world);
    if (IsMultiNode(rec)) {
      spdlog::info("{}: submitted node {}/{} of group '{}' ({} GPUs, ranks {}..{} of {}, master {}:{})",
                   rec.id, rdzv.node_rank(), rdzv.num_nodes(), rdzv.group_id(), rec.gpus, rdzv.rank_offset(),
                   rdzv.rank_offset() + world - 1, rdzv.world_size(), rdzv.master_addr(), rdzv.master_port());
    } else {
      spdlog::info("{}: submitted ({} GPUs, world size {})", rec.id, rec.gpus, world);
    }
    Schedule();
    return store_->GetJob(rec.id);
  }();
  done(std::move(result));
}

void Supervisor::DoCancel(const std::string& job_id, const JobCallback& done) {
  auto result = [&]() -> StatusOr<JobRecord> {
    auto it = runs_.find(job_id);
    if (it != runs_.end()) {
      BeginStop(it->second.get(), JobState::CANCELLED, "cancelled by user", false);
      return it->second->rec;
    }
    SFT_ASSIGN_OR_RETURN(JobRecord rec, store_->GetJob(job_id));
    if (IsFinal(rec.state)) {
      return FailedPreconditionError("job " + job_id + " already finished: " + JobStateName(rec.state));
    }
    scheduler_.Dequeue(job_id);
    SFT_ASSIGN_OR_RETURN(auto journal, JournalFor(job_id));
    SFT_RETURN_IF_ERROR(Transition(&rec, journal.get(), JobState::CANCELLED, "cancelled by user"));
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
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.running = static_cast<uint32_t>(runs_.size());
  stats_.queued = static_cast<uint32_t>(scheduler_.queued());
  stats_.gpus_total = scheduler_.gpus_total();
  stats_.gpus_free = scheduler_.gpus_free();
}

void Supervisor::Launch(const Allocation& alloc) {
  auto rec_or = store_->GetJob(alloc.job_id);
  auto journal_or = JournalFor(alloc.job_id);
  if (!rec_or.ok() || !journal_or.ok()) {
    spdlog::error("{}: cannot launch: {}", alloc.job_id,
                  (!rec_or.ok() ? rec_or.status() : journal_or.status()).ToString());
    scheduler_.Release(alloc.job_id);
    return;
  }
  auto run = std::make_unique<Run>();
  run->rec = std::move(*rec_or);
  run->journal = *journal_or;
  JobRecord& rec = run->rec;
  rec.assigned_gpus = alloc.gpus;
  Status st = FileSystem::Default()->CreateDirs(rec.job_dir + "/logs");
  if (st.ok()) st = FileSystem::Default()->CreateDirs(rec.job_dir + "/run");
  if (st.ok()) st = WriteFileAtomic(FileSystem::Default(), rec.job_dir + "/spec.json", rec.spec_json);
  RankEnv env;
  const int offset = static_cast<int>(rec.rendezvous.rank_offset());
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
  env.cuda_visible_devices = JoinGpus(alloc.gpus);
  pid_t pgid = 0;
  std::vector<RankRun> ranks;
  for (uint32_t r = 0; st.ok() && r < rec.world_size; ++r) {
    env.rank = offset + static_cast<int>(r);
    env.local_rank = static_cast<int>(r);
    auto spawned = SpawnRank(config_.trainer_path, rec.job_dir, env, pgid);
    if (!spawned.ok()) {
      st = spawned.status().WithContext("launch rank " + std::to_string(env.rank));
      break;
    }
    if (pgid == 0) pgid = spawned->pid;
    RankRun rr;
    rr.rank = env.rank;
    rr.pid = spawned->pid;
    rr.start_time = spawned->start_time;
    ranks.push_back(rr);
  }
  if (!st.ok()) {
    if (pgid > 0) ::killpg(pgid, SIGKILL);
    for (const RankRun& rr : ranks) ::waitpid(rr.pid, nullptr, 0);
    scheduler_.Release(rec.id);
    rec.assigned_gpus.clear();
    Status t = Transition(&rec, run->journal.get(), JobState::FAILED, "launch: " + st.message());
    if (!t.ok()) spdlog::error("{}: {}", rec.id, t.ToString());
    return;
  }
  auto offsets = run->journal->source_offsets();
  for (RankRun& rr : ranks) {
    for (int src = 0; src < 3; ++src) {
      auto it = offsets.find({rr.rank, src});
      rr.off[src] = it == offsets.end() ? 0 : it->second;
    }
  }
  run->ranks = std::move(ranks);
  rec.pgid = pgid;
  rec.started_ms = NowMs();
  rec.first_failed_rank = -1;
  rec.ranks.clear();
  for (const RankRun& rr : run->ranks) {
    rec.ranks.push_back({rr.rank, rr.pid, rr.start_time, true, false, 0, 0});
  }
  std::string why = "launched " + std::to_string(rec.world_size) + " rank(s)" +
                    (alloc.gpus.empty() ? " on CPU" : " on GPUs " + JoinGpus(alloc.gpus)) + ", attempt " +
                    std::to_string(rec.restarts + 1);
  if (IsMultiNode(rec)) {
    why += "; node " + std::to_string(rec.rendezvous.node_rank()) + "/" +
           std::to_string(rec.rendezvous.num_nodes()) + ", ranks " + std::to_string(offset) + ".." +
           std::to_string(offset + static_cast<int>(rec.world_size) - 1) + " of " +
           std::to_string(rec.rendezvous.world_size()) + ", master " + env.master_addr + ":" +
           std::to_string(env.master_port);
  }
  bool saved = false;
  st = Transition(&rec, run->journal.get(), JobState::RUNNING, why, &saved);
  if (!saved) {
    // Ranks the database does not know about would run untracked and be launched again after a
    // restart: stop them, and fail the job (as far as the database can still be written).
    spdlog::error("{}: {}; stopping its ranks", rec.id, st.ToString());
    ::killpg(pgid, SIGKILL);  // our unreaped children: the group cannot have been reused
    for (const RankRun& rr : run->ranks) ::waitpid(rr.pid, nullptr, 0);
    scheduler_.Release(rec.id);
    rec.assigned_gpus.clear();
    rec.pgid = 0;
    rec.ranks.clear();
    Status t = Transition(&rec, run->journal.get(), JobState::FAILED, "launch: " + st.message());
    if (!t.ok()) spdlog::error("{}: {}", rec.id, t.ToString());
    return;
  }
  run->last_progress = Clock::now();
  run->last_save = Clock::now();
  Run* raw = run.get();
  runs_[rec.id] = std::move(run);
  WatchExits(raw);
  ArmTimer(raw);
  if (!st.ok()) {
    // Saved, but its journal cannot take events: the ranks are tracked; stop them cleanly.
    spdlog::error("{}: {}", rec.id, st.ToString());
    BeginStop(raw, JobState::FAILED, "disk full? cannot journal the job: " + st.message(), false);
  }
}

void Supervisor::WatchExits(Run* run) {
  for (RankRun& rr : run->ranks) {
    if (!rr.alive || rr.exit_fd) continue;
    int fd = OpenPidFd(rr.pid);
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
  for (RankRun& rr : run->ranks) {
    for (int src = 0; src < 3; ++src) {
      std::string path = RankFile(run->rec.job_dir, rr.rank, src);
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      struct stat st;
      if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) <= rr.off[src]) {
        ::close(fd);
        continue;
      }
      size_t want = static_cast<size_t>(std::min<uint64_t>(st.st_size - rr.off[src], kMaxReadPerTick));
      more |= st.st_size - rr.off[src] > kMaxReadPerTick;
      std::string buf(want, '\0');
      ssize_t n = ::pread(fd, buf.data(), want, static_cast<off_t>(rr.off[src]));
      ::close(fd);
      if (n <= 0) continue;
      buf.resize(static_cast<size_t>(n));
      bool at_eof = rr.off[src] + static_cast<uint64_t>(n) == static_cast<uint64_t>(st.st_size);
      size_t start = 0;
      for (;;) {
        size_t nl = buf.find('\n', start);
        size_t end;
        size_t next;
        if (nl != std::string::npos && nl - start <= kMaxLine) {
          end = nl;
          next = nl + 1;
        } else if (buf.size() - start >= kMaxLine) {
          end = start + kMaxLine;  // an over-long line: emit in pieces
          next = end;
        } else if (final_drain && at_eof && start < buf.size()) {
          end = buf.size();  // the unterminated last line of a dead rank
          next = end;
        } else {
          break;
        }
        JournalEvent ev;
        ev.rank = rr.rank;
        ev.text = buf.substr(start, end - start);
        if (!ev.text.empty() && ev.text.back() == '\r') ev.text.pop_back();
        ev.src = src;
        ev.src_end = rr.off[src] + next;
        ev.kind = src == 0 ? Event::STDOUT : src == 1 ? Event::STDERR : Event::METRIC;
        if (src == 2) {
          nlohmann::json j = nlohmann::json::parse(ev.text, nullptr, false);
          if (j.is_object() && j.contains("event") && j["event"].is_string()) {
            const std::string& kind = j["event"].get_ref<const std::string&>();
            if (kind == "step") {
              if (j.contains("step") && j["step"].is_number_integer())
                run->rec.last_step = j["step"].get<int64_t>();
              if (j.contains("loss") && j["loss"].is_number()) run->rec.last_loss = j["loss"].get<double>();
              run->last_progress = Clock::now();
              run->progress_dirty = true;
            } else if (kind == "done") {
              run->saw_done = true;
            } else if (kind == "error") {
              run->saw_error = true;
              if (j.contains("message") && j["message"].is_string()) {
                if (run->trainer_error.empty()) run->trainer_error = j["message"];
                if (rr.trainer_error.empty()) rr.trainer_error = j["message"];
              }
            }
          }
        }
        events.push_back(std::move(ev));
        start = next;
      }
      advanced.push_back({&rr.off[src], rr.off[src] + start});
    }
  }
  if (events.empty()) return more;
  auto appended = run->journal->Append(std::move(events));
  if (!appended.ok()) {
    // Nothing of this batch was journaled: the rank files keep their offsets (the output is read
    // again later), and the job stops rather than run on with output nobody can see.
    spdlog::error("{}: journal: {}", run->rec.id, appended.status().ToString());
    BeginStop(run, JobState::FAILED,
              "disk full? cannot journal the job's output: " + appended.status().message(), false);
    return false;
  }
  for (const auto& [off, to] : advanced) *off = to;
  return more;
}

// The job's process group is the group of its first rank (pgid == that rank's pid). A pid cannot
// be reused while it still names a live group, so a live process whose pid is the pgid but which
// is not that rank (another start time) means the whole group died while the agent was down and
// the number now belongs to someone else's group: it is never signalled.
bool Supervisor::GroupIsOurs(const Run& run) const {
  const pid_t pgid = static_cast<pid_t>(run.rec.pgid);
  if (pgid <= 0) return false;
  for (const RankRun& rr : run.ranks) {
    if (rr.pid == pgid && rr.own_child) return true;  // not reused before we reap it
  }
  const bool pid_in_use = ::kill(pgid, 0) == 0 || errno == EPERM;
  if (!pid_in_use) return true;  // the leader is gone; any member left keeps the number ours
  for (const RankRun& rr : run.ranks) {
    if (rr.pid == pgid) return SameProcessAlive(pgid, rr.start_time);
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

void Supervisor::BeginStop(Run* run, JobState state, const std::string& reason, bool requeue_allowed) {
  if (run->stopping) {
    if (state == JobState::CANCELLED && run->stop_state != JobState::CANCELLED) {
      run->stop_state = state;
      run->stop_reason = reason;
      run->requeue_allowed = false;
    } else {
      return;
    }
  } else {
    run->stopping = true;
    run->stop_state = state;
    run->stop_reason = reason;
    run->requeue_allowed = requeue_allowed;
    run->kill_at = Clock::now() + config_.kill_grace;
    bool any_alive = false;
    for (const RankRun& rr : run->ranks) any_alive |= rr.alive;
    if (any_alive) SignalGroup(run, SIGTERM);
    spdlog::info("{}: stopping ({}); SIGTERM sent", run->rec.id, reason);
  }
  if (state == JobState::CANCELLED && run->rec.state == JobState::RUNNING) {
    Status st = Transition(&run->rec, run->journal.get(), JobState::CANCELLING, reason);
    if (!st.ok()) spdlog::error("{}: {}", run->rec.id, st.ToString());
  }
}

void Supervisor::Tick(Run* run) {
  Drain(run, false);
  bool changed = false;
  const RankRun* first_failed = nullptr;  // of the ranks reaped in this tick
  for (RankRun& rr : run->ranks) {
    if (!rr.alive) continue;
    if (rr.own_child) {
      int wstatus = 0;
      pid_t r = ::waitpid(rr.pid, &wstatus, WNOHANG);
      if (r == rr.pid) {
        rr.alive = false;
        rr.exit_known = true;
        if (WIFEXITED(wstatus)) rr.exit_code = WEXITSTATUS(wstatus);
        if (WIFSIGNALED(wstatus)) rr.signal = WTERMSIG(wstatus);
      } else if (r < 0 && errno == ECHILD) {
        rr.alive = false;
      }
    } else if (!SameProcessAlive(rr.pid, rr.start_time)) {
      rr.alive = false;
    }
    if (rr.alive) continue;
    changed = true;
    rr.exit_fd.reset();
    bool failed = rr.exit_known && (rr.signal != 0 || rr.exit_code != 0);
    if (failed && !run->stopping) {
      // Reaped together: a rank killed by a signal beats one that exited with an error code.
      if (first_failed == nullptr || (rr.signal != 0 && first_failed->signal == 0)) first_failed = &rr;
    } else if (!rr.exit_known && run->saw_error && !run->stopping) {
      BeginStop(run, JobState::FAILED,
                "agent-restart: rank " + std::to_string(rr.rank) + " ended after a trainer error", true);
    }
  }
  if (first_failed != nullptr && !run->stopping) {
    const RankRun& rr = *first_failed;
    run->rec.first_failed_rank = rr.rank;
    std::string why =
        "rank " + std::to_string(rr.rank) + " failed first: " + DescribeExit(rr.exit_code, rr.signal);
    if (!rr.trainer_error.empty()) why += " (trainer error: " + rr.trainer_error + ")";
    BeginStop(run, JobState::FAILED, why, true);
    run->rank_failed = true;
  }
  bool any_alive = false;
  for (const RankRun& rr : run->ranks) any_alive |= rr.alive;
  auto now = Clock::now();
  uint32_t hb = run->rec.heartbeat_s > 0 ? run->rec.heartbeat_s : config_.default_heartbeat_s;
  if (any_alive && !run->stopping && now - run->last_progress > std::chrono::seconds(hb)) {
    BeginStop(run, JobState::FAILED, "hang: no step event for " + std::to_string(hb) + " s", true);
  }
  if (run->stopping && !run->sigkilled && now >= run->kill_at && run->rec.pgid > 0) {
    SignalGroup(run, SIGKILL);
    run->sigkilled = true;
    spdlog::info("{}: grace period over; SIGKILL sent", run->rec.id);
  }
  if (changed) {
    for (RankRecord& k : run->rec.ranks) {
      for (const RankRun& rr : run->ranks) {
        if (rr.rank != k.rank) continue;
        k.running = rr.alive;
        k.exit_known = rr.exit_known;
        k.exit_code = rr.exit_code;
        k.signal = rr.signal;
      }
    }
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
    Finalize(run);  // erases run
    return;
  }
  if (changed || (run->progress_dirty && now - run->last_save >= kProgressSaveEvery)) {
    Status st = store_->SaveJob(run->rec, nullptr);
    if (!st.ok()) spdlog::error("{}: {}", run->rec.id, st.ToString());
    run->progress_dirty = false;
    run->last_save = now;
  }
  ArmTimer(run);
}

void Supervisor::Finalize(Run* run) {
  while (Drain(run, true)) {
  }  // everything the ranks wrote, however much arrived since the last tick
  JobRecord& rec = run->rec;
  JobState final = JobState::FAILED;
  std::string reason;
  bool requeue = false;
  bool all_known = true;
  bool all_zero = true;
  for (const RankRun& rr : run->ranks) {
    all_known &= rr.exit_known;
    all_zero &= rr.exit_known && rr.signal == 0 && rr.exit_code == 0;
  }
  if (run->stopping) {
    final = run->stop_state;
    reason = run->stop_reason;
    requeue = final == JobState::FAILED && run->requeue_allowed;
  } else if (all_known && all_zero) {
    final = JobState::SUCCEEDED;
    reason = "all " + std::to_string(run->ranks.size()) + " rank(s) exited 0";
  } else if (run->saw_done && !run->saw_error) {
    final = JobState::SUCCEEDED;
    reason = "trainer reported done (ranks ended while the agent was down)";
  } else {
    final = JobState::FAILED;
    reason = "agent-restart: ranks ended while the agent was down";
    requeue = true;
  }
  if (final == JobState::FAILED && !run->rank_failed && !run->trainer_error.empty())
    reason += " (trainer error: " + run->trainer_error + ")";
  for (RankRecord& k : rec.ranks) k.running = false;
  scheduler_.Release(rec.id);
  rec.assigned_gpus.clear();
  Status st;
  if (requeue && rec.restarts < rec.max_restarts) {
    rec.restarts++;
    st = Transition(&rec, run->journal.get(), JobState::QUEUED,
                    "restart " + std::to_string(rec.restarts) + "/" + std::to_string(rec.max_restarts) +
                        " after: " + reason);
    scheduler_.Enqueue(rec.id, rec.gpus, rec.gpus > 0 ? 0 : rec.world_size);
  } else {
    st = Transition(&rec, run->journal.get(), final, reason);
  }
  if (!st.ok()) spdlog::error("{}: {}", rec.id, st.ToString());
  runs_.erase(rec.id);
  Schedule();
}

Status Supervisor::Recover() {
  SFT_ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, store_->ListJobs());
  for (JobRecord& rec : jobs) {
    if (rec.state == JobState::QUEUED) {
      scheduler_.Enqueue(rec.id, rec.gpus, rec.gpus > 0 ? 0 : rec.world_size);
      continue;
    }
    if (rec.state != JobState::RUNNING && rec.state != JobState::CANCELLING) continue;
    SFT_ASSIGN_OR_RETURN(auto journal, JournalFor(rec.id));
    auto run = std::make_unique<Run>();
    run->journal = journal;
    auto offsets = journal->source_offsets();
    size_t alive = 0;
    std::string dead_rank;
    for (const RankRecord& k : rec.ranks) {
      RankRun rr;
      rr.rank = k.rank;
      rr.pid = static_cast<pid_t>(k.pid);
      rr.start_time = k.start_time;
      rr.own_child = false;
      rr.alive = k.running && SameProcessAlive(rr.pid, rr.start_time);
      rr.exit_known = k.exit_known;
      rr.exit_code = k.exit_code;
      rr.signal = k.signal;
      for (int src = 0; src < 3; ++src) {
        auto it = offsets.find({rr.rank, src});
        rr.off[src] = it == offsets.end() ? 0 : it->second;
      }
      if (rr.alive) {
        ++alive;
      } else if (dead_rank.empty()) {
        dead_rank = std::to_string(rr.rank);
      }
      run->ranks.push_back(rr);
    }
    // Trainer outcome events journaled before the agent died (since the last launch).
    uint64_t last = journal->last_seq();
    auto tail = journal->Read(last > Journal::kRingSize ? last - Journal::kRingSize : 0, Journal::kRingSize);
    if (tail.ok()) {
      for (const JournalEvent& ev : *tail) {
        if (ev.kind == Event::STATE && ev.state == JobState::RUNNING) run->saw_done = run->saw_error = false;
        if (ev.kind != Event::METRIC) continue;
        nlohmann::json j = nlohmann::json::parse(ev.text, nullptr, false);
        if (!j.is_object()) continue;
        std::string kind = j.value("event", "");
        if (kind == "done") run->saw_done = true;
        if (kind == "error") run->saw_error = true;
      }
    }
    run->rec = rec;
    run->last_progress = Clock::now();
    run->last_save = Clock::now();
    scheduler_.Adopt(rec.id, rec.assigned_gpus, rec.gpus > 0 ? 0 : rec.world_size);
    Run* raw = run.get();
    runs_[rec.id] = std::move(run);
    if (rec.state == JobState::CANCELLING) {
      BeginStop(raw, JobState::CANCELLED, rec.reason, false);
    } else if (alive > 0 && alive < raw->ranks.size()) {
      BeginStop(raw, JobState::FAILED, "agent-restart: rank " + dead_rank + " died while the agent was down",
                true);
    } else if (alive == 0) {
      raw->recovered_dead = true;
    }
    spdlog::info("{}: recovered after agent restart: {}/{} rank(s) alive", rec.id, alive, raw->ranks.size());
    WatchExits(raw);
    ArmTimer(raw);
  }
  return OkStatus();
}

}  // namespace sftctl::agent
