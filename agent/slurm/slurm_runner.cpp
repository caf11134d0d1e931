#include "agent/slurm/slurm_runner.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "agent/process/launcher.h"
#include "agent/slurm/slurm_job.h"
#include "agent/state/job_spec.h"
#include "common/os/file_system.h"
#include "common/os/process_util.h"

namespace sftctl::agent::slurm {
namespace {

using ::sftctl::v1::Event;
using ::sftctl::v1::JobState;
using Steady = std::chrono::steady_clock;

constexpr int kNotFoundPolls = 30;  // Slurm forgot the job this many polls in a row: failed

StatusOr<uint32_t> Count(int64_t value, const char* field) {
  if (value < 0 || value > std::numeric_limits<int32_t>::max())
    return FieldError("slurm", field, "must be a small positive count, got " + std::to_string(value));
  return static_cast<uint32_t>(value);
}

std::string RandomNonce() {
  std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) s += kHex[rd() % 16];
  return s;
}

// Links `from` at `to`, or copies it where a hard link is impossible (another filesystem); either
// way the file is then 0600. A hard link shares the blob's inode, so the blob in the agent's (0700)
// data dir becomes 0600 too: the agent reads it as its owner, and no other user reads it by any name.
Status LinkOrCopy(const std::string& from, const std::string& to) {
  std::error_code ec;
  std::filesystem::remove(to, ec);
  std::filesystem::create_hard_link(from, to, ec);
  if (ec) {
    ec.clear();
    std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return InternalError("cannot copy " + from + " to " + to + ": " + ec.message());
  }
  if (::chmod(to.c_str(), 0600) != 0) return ErrnoError("cannot make private", to, errno);
  return OkStatus();
}

// The trainer's progress from one line of its event stream; a line that is not a trainer event (or
// has a field of the wrong type) is no progress.
void NoteProgress(int rank, const std::string& line, SlurmUpdate* update) {
  auto ev = ParseTrainerEvent(line, rank);
  if (!ev.ok() || ev->kind != "step") return;
  if (ev->step) update->last_step = *ev->step;
  if (ev->loss) update->last_loss = *ev->loss;
}

// Splits what was read from one rank file at `off` into journal events (the journal's one rule,
// agent/state/journal.h) and notes the trainer's progress; returns the bytes consumed.
size_t SplitLines(int rank, int src, uint64_t off, const std::string& buf, bool last_piece,
                  std::vector<JournalEvent>* events, SlurmUpdate* update) {
  const size_t first = events->size();
  const size_t used = SplitRankOutput(rank, src, off, buf, last_piece, events);
  if (src == 2) {
    for (size_t k = first; k < events->size(); ++k) NoteProgress(rank, (*events)[k].text, update);
  }
  return used;
}

}  // namespace

StatusOr<SlurmOptions> SlurmOptionsFromSpec(const SlurmSpec& spec) {
  SlurmOptions o;
  SFT_ASSIGN_OR_RETURN(o.nodes, Count(spec.nodes, "nodes"));
  SFT_ASSIGN_OR_RETURN(o.gpus_per_node, Count(spec.gpus_per_node, "gpus_per_node"));
  SFT_ASSIGN_OR_RETURN(o.cpu_ranks_per_node, Count(spec.cpu_ranks_per_node, "cpu_ranks_per_node"));
  o.partition = spec.partition;
  o.account = spec.account;
  o.qos = spec.qos;
  o.time = spec.time;
  o.constraint = spec.constraint;
  o.extra_args = spec.extra_args;
  o.requeue = spec.requeue;
  SFT_RETURN_IF_ERROR(ValidateSlurmOptions(o));
  return o;
}

StatusOr<std::optional<SlurmOptions>> SlurmOptionsFromSpecJson(const nlohmann::json& spec) {
  if (!spec.is_object() || !spec.contains("slurm") || spec["slurm"].is_null())
    return std::optional<SlurmOptions>();
  SFT_ASSIGN_OR_RETURN(JobSpec parsed, ParseSpec(spec));
  if (!parsed.slurm.has_value()) return std::optional<SlurmOptions>();
  SFT_ASSIGN_OR_RETURN(SlurmOptions o, SlurmOptionsFromSpec(*parsed.slurm));
  return std::optional<SlurmOptions>(std::move(o));
}

Status MoveInputsIntoJobFolder(const std::string& job_dir, const std::vector<std::string>& file_pointers,
                               JobSpec* spec) {
  namespace fs = std::filesystem;
  const std::string files = job_dir + "/inputs/files";
  std::error_code ec;
  fs::create_directories(files, ec);
  if (ec) return InternalError("cannot create " + files + ": " + ec.message());
  int n = 0;
  for (const std::string& pointer : file_pointers) {
    std::string* field = SpecStringAt(spec, pointer);
    if (field == nullptr) continue;
    const std::string from = *field;
    const std::string to = files + "/" + std::to_string(n++) + "-" + fs::path(from).filename().string();
    SFT_RETURN_IF_ERROR(LinkOrCopy(from, to));
    *field = to;
  }
  // A folder's entries are hard links to blobs, or symlinks where that was impossible: the symlinks
  // point into the agent's data dir, which the compute nodes need not see.
  for (auto it = fs::recursive_directory_iterator(job_dir + "/inputs", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_symlink(ec)) continue;
    const std::string link = it->path().string();
    const fs::path target = fs::read_symlink(link, ec);
    if (ec) return InternalError("cannot read the link " + link + ": " + ec.message());
    SFT_RETURN_IF_ERROR(LinkOrCopy(target.string(), link));
  }
  if (ec) return InternalError("cannot list " + job_dir + "/inputs: " + ec.message());
  return OkStatus();
}

StatusOr<std::string> PrepareSharedDir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/')
    return InvalidArgumentError("--shared-dir: must be an absolute path: " + dir);
  std::error_code ec;
  if (std::filesystem::create_directories(dir, ec) && ::chmod(dir.c_str(), 0700) != 0)
    return ErrnoError("--shared-dir: cannot make private", dir, errno);
  if (ec) return InvalidArgumentError("--shared-dir: cannot create " + dir + ": " + ec.message());
  const std::string canonical = std::filesystem::canonical(dir, ec).string();
  if (ec) return InvalidArgumentError("--shared-dir: " + dir + ": " + ec.message());
  for (char c : canonical) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::string("_./+@:,=-").find(c) == std::string::npos)
      return InvalidArgumentError("--shared-dir: " + canonical + " holds '" + std::string(1, c) +
                                  "'; Slurm job folders need a path of [A-Za-z0-9_./+@:,=-]");
  }
  SFT_RETURN_IF_ERROR(CheckTrustedDir(canonical, "--shared-dir"));
  SFT_RETURN_IF_ERROR(MakePrivateDir(canonical + "/jobs", false).WithContext("--shared-dir"));
  return canonical;
}

std::string NewAgentId() { return RandomNonce().substr(0, 12); }

StatusOr<std::string> AgentJobsDir(const std::string& shared_dir, const std::string& agent_id) {
  if (agent_id.size() != 12 || agent_id.find_first_not_of("0123456789abcdef") != std::string::npos)
    return InvalidArgumentError("slurm: the agent id '" + agent_id + "' is not 12 hex digits");
  const std::string dir = shared_dir + "/jobs/" + agent_id;
  SFT_RETURN_IF_ERROR(MakePrivateDir(dir, false));
  return dir;
}

SlurmRunner::SlurmRunner(SlurmRunnerConfig config, UpdateCallback on_update)
    : config_(std::move(config)),
      cli_(config_.runner, config_.env, config_.command_timeout),
      on_update_(std::move(on_update)) {
  thread_ = std::thread([this] { Loop(); });
}

SlurmRunner::~SlurmRunner() { Stop(); }

void SlurmRunner::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

Status SlurmRunner::Preflight(const SlurmOptions& options) {
  if (config_.shared_dir.empty())
    return FailedPreconditionError(
        "slurm: this agent has no shared dir for Slurm jobs: start sftd with --shared-dir DIR (a folder "
        "the compute nodes see; `sftctl bootstrap --shared-dir DIR` passes it)");
  SFT_RETURN_IF_ERROR(cli_.CheckReady(options));
  {
    MutexLock lock(&mu_);
    if (probed_) return OkStatus();
  }
  const std::string nonce = RandomNonce();
  const std::string probe = config_.shared_dir + "/.sftctl-probe-" + nonce;
  if (Status st = WritePrivateFile(probe, nonce + "\n"); !st.ok())
    return FailedPreconditionError("slurm: cannot write the probe file in --shared-dir: " + st.message());
  Status seen = cli_.CheckVisible(options, probe, nonce);
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  if (seen.code() == StatusCode::kResourceExhausted) {
    spdlog::warn("slurm: could not check that the compute nodes see --shared-dir {}: {}", config_.shared_dir,
                 seen.message());
    return OkStatus();  // a full cluster: the job's own output will show a folder it cannot see
  }
  if (!seen.ok())
    return FailedPreconditionError("slurm: --shared-dir " + config_.shared_dir +
                                   " is not visible from the compute nodes: " + seen.message());
  MutexLock lock(&mu_);
  probed_ = true;
  return OkStatus();
}

StatusOr<std::string> SlurmRunner::Submit(const SlurmOptions& options, const std::string& job_name,
                                          const std::string& job_dir) const {
  return SubmitJobFolder(
      cli_, options, SbatchJob{job_name, job_dir, config_.trainer_path, ChildEnvironment(ChildKind::kRank)});
}

void SlurmRunner::Follow(const std::string& job_id, const std::string& slurm_job_id,
                         const std::string& job_dir, uint32_t world_size, bool requeue,
                         std::shared_ptr<Journal> journal) {
  Followed f;
  f.slurm_job_id = slurm_job_id;
  f.job_dir = job_dir;
  f.world_size = world_size;
  f.requeue = requeue;
  f.offsets = journal->source_offsets();
  f.journal = std::move(journal);
  f.last.job_id = job_id;
  {
    MutexLock lock(&mu_);
    pending_[job_id] = std::move(f);
  }
  cv_.NotifyAll();
}

void SlurmRunner::Cancel(const std::string& job_id) {
  {
    MutexLock lock(&mu_);
    cancels_.push_back(job_id);
  }
  cv_.NotifyAll();
}

void SlurmRunner::Loop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      auto woken = [&]() REQUIRES(mu_) { return stopping_ || !pending_.empty() || !cancels_.empty(); };
      if (jobs_.empty()) {
        cv_.Wait(&mu_, woken);
      } else {
        cv_.WaitFor(&mu_, config_.tail, woken);
      }
      if (stopping_) return;
      for (auto& [id, f] : pending_) jobs_.insert_or_assign(id, std::move(f));
      pending_.clear();
      for (const std::string& id : cancels_) {
        auto it = jobs_.find(id);
        if (it != jobs_.end()) it->second.cancel = true;
      }
      cancels_.clear();
    }
    const Steady::time_point now = Steady::now();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Visit(it->first, &it->second, now);
      it = it->second.last.final ? jobs_.erase(it) : std::next(it);
    }
  }
}

void SlurmRunner::Visit(const std::string& job_id, Followed* f, Steady::time_point now) {
  if (f->cancel) {
    f->cancel = false;
    if (Status st = cli_.Cancel(f->slurm_job_id); !st.ok()) spdlog::error("{}: {}", job_id, st.ToString());
    f->next_query = now;  // show the end soon
  }
  if (now < f->next_query) {
    SlurmUpdate progress = f->last;
    Tail(job_id, f, false, &progress);
    f->last.last_step = progress.last_step;
    f->last.last_loss = progress.last_loss;
    return;
  }
  f->next_query = now + config_.poll;
  SlurmUpdate update = StateOf(job_id, f, now);
  update.last_step = f->last.last_step;
  update.last_loss = f->last.last_loss;
  Tail(job_id, f, update.final, &update);
  const bool changed =
      !f->reported || update.state != f->last.state || update.slurm_state != f->last.slurm_state;
  const bool progressed = update.last_step.has_value();
  if (changed || progressed || update.final) on_update_(update);
  f->reported = true;
  f->last = update;
  f->last.last_step.reset();
  f->last.last_loss.reset();
}

SlurmUpdate SlurmRunner::StateOf(const std::string& job_id, Followed* f, Steady::time_point now) {
  SlurmUpdate u;
  u.job_id = job_id;
  u.state = f->reported ? f->last.state : JobState::QUEUED;
  StatusOr<SlurmJobInfo> info = cli_.Query(f->slurm_job_id, f->job_dir);
  if (!info.ok()) {
    const bool gone = info.status().code() == StatusCode::kNotFound && ++f->not_found >= kNotFoundPolls;
    u.slurm_state = "unknown (" + info.status().message() + ")";
    if (gone) {
      u.state = JobState::FAILED;
      u.final = true;
    }
    return u;
  }
  f->not_found = 0;
  u.slurm_state = info->Describe();
  const SlurmPhase phase = PhaseOf(info->state);
  const bool requeued_soon =
      f->requeue && (info->state == SlurmState::kNodeFail || info->state == SlurmState::kPreempted);
  if (phase != SlurmPhase::kFailed || !requeued_soon) f->failed_since.reset();
  switch (phase) {
    case SlurmPhase::kWaiting:
      u.state = JobState::QUEUED;
      break;
    case SlurmPhase::kRunning:
      u.state = JobState::RUNNING;
      break;
    case SlurmPhase::kSucceeded:
      u.state = JobState::SUCCEEDED;
      break;
    case SlurmPhase::kCancelled:
      u.state = JobState::CANCELLED;
      break;
    case SlurmPhase::kFailed:
      if (requeued_soon) {
        if (!f->failed_since) f->failed_since = now;
        if (now - *f->failed_since < config_.requeue_grace) {
          u.state = JobState::QUEUED;
          u.slurm_state += "; Slurm requeues it";
          break;
        }
      }
      u.state = JobState::FAILED;
      break;
  }
  u.final = u.state == JobState::SUCCEEDED || u.state == JobState::FAILED || u.state == JobState::CANCELLED;
  return u;
}

void SlurmRunner::Tail(const std::string& job_id, Followed* f, bool final, SlurmUpdate* update) {
  for (bool more = true; more;) {
    more = false;
    std::vector<JournalEvent> events;
    std::vector<std::pair<std::pair<int, int>, uint64_t>> advanced;
    for (int rank = 0; rank < static_cast<int>(f->world_size); ++rank) {
      for (int src = 0; src < 3; ++src) {
        const uint64_t off = f->offsets[{rank, src}];
        bool at_eof = true;
        const std::string buf = ReadRankOutput(RankFile(f->job_dir, rank, src), off, &at_eof);
        if (buf.empty()) continue;
        more |= !at_eof;
        const size_t used = SplitLines(rank, src, off, buf, final && at_eof, &events, update);
        advanced.push_back({{rank, src}, off + used});
      }
    }
    if (events.empty()) return;
    if (auto appended = f->journal->Append(std::move(events)); !appended.ok()) {
      spdlog::error("{}: journal: {}", job_id, appended.status().ToString());  // read again next time
      return;
    }
    for (const auto& [key, to] : advanced) f->offsets[key] = to;
    more &= final;  // the final pass reads everything; others go on at the next pass
  }
}

}  // namespace sftctl::agent::slurm
