#include "client/bootstrap/bootstrap.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "client/bootstrap/smoke_job.h"
#include "client/remote/remote_options.h"
#include "client/remote/ssh/remote_agent.h"
#include "common/json_parse.h"
#include "common/os/file_system.h"
#include "common/os/self_exe.h"
#include "common/sha256.h"
#include "common/source_id.h"
#include "common/terminal_text.h"
#include "common/version.h"

namespace sftctl::client {
namespace {

// Where the host keeps the script, the archive, the worker's log and status (sftctl-host.sh).
constexpr const char* kHostBoot = "\"$HOME\"/.local/share/sftctl/bootstrap";
constexpr const char* kHostLog = "~/.local/share/sftctl/bootstrap/log";
constexpr size_t kKeptLogLines = 30;
constexpr size_t kMaxShownLine = 400;

std::string Script() { return std::string(kHostBoot) + "/sftctl-host.sh"; }

bool IsTransportFailure(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

class SshHostShell : public HostShell {
 public:
  SshHostShell(ConnectOptions opts, int attempts, const Clock* clock)
      : opts_(std::move(opts)), attempts_(attempts), clock_(clock) {}

  StatusOr<ssh::ExecResult> Run(const std::string& command, const std::string& input,
                                int timeout_s) override {
    Status last = OkStatus();
    for (int attempt = 0; attempt < attempts_; ++attempt) {
      if (attempt > 0) {
        std::cerr << "bootstrap: connection lost (" << EscapeForTerminal(last.message())
                  << "); reconnecting\n";
        clock_->SleepFor(std::chrono::seconds(std::min(1 << attempt, 20)));
      }
      if (session_ == nullptr) {
        auto s = OpenSshSession(opts_);
        if (!s.ok()) {
          last = s.status();
          if (!IsTransportFailure(last)) return last;
          continue;
        }
        session_ = std::move(*s);
      }
      auto r = session_->Exec(command, input, timeout_s);
      if (r.ok() || !IsTransportFailure(r.status())) return r;
      last = r.status();
      session_.reset();
    }
    return last;
  }
  std::string Display() const override { return opts_.host; }

 private:
  ConnectOptions opts_;
  int attempts_;
  const Clock* clock_;
  std::unique_ptr<ssh::SshSession> session_;
};

StatusOr<std::string> ReadShareFile(const std::string& dir, const char* name) {
  return FileSystem::Default()->ReadFile(JoinPath(dir, name));
}

// Runs a command that must succeed; its failure is an error naming `what`.
StatusOr<std::string> RunOk(HostShell* shell, const std::string& what, const std::string& command,
                            const std::string& input = "", int timeout_s = 120) {
  SFT_ASSIGN_OR_RETURN(ssh::ExecResult r, shell->Run(command, input, timeout_s));
  if (r.exit_code != 0) {
    return UnavailableError(shell->Display() + ": " + what + " failed (exit " + std::to_string(r.exit_code) +
                            "): " + EscapeForTerminal((r.err + r.out).substr(0, 1000)));
  }
  return r.out;
}

// Writes `data` to `path` on the host through a temporary file, so a dropped upload leaves no
// half-written file under the final name.
Status UploadBytes(HostShell* shell, const std::string& what, const std::string& path,
                   const std::string& data) {
  const std::string cmd =
      "mkdir -p " + std::string(kHostBoot) + " && cat > " + path + ".part && mv -f " + path + ".part " + path;
  return RunOk(shell, "uploading " + what, cmd, data, 600).status();
}

// True when the agent that `sftd status --json` describes runs and was built from `source_id`.
bool AgentRuns(const std::string& status_json, const std::string& source_id) {
  StatusOr<nlohmann::json> parsed = ParseJson(status_json, "`sftd status --json`");  // the host's
  if (!parsed.ok() || !parsed->is_object()) return false;
  const nlohmann::json& j = *parsed;
  auto running = j.find("running");
  auto id = j.find("source_id");
  return running != j.end() && running->is_boolean() && running->get<bool>() && id != j.end() &&
         id->is_string() && id->get<std::string>() == source_id;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A folder on the host for its shell, the way the agent's own commands name it
// (client/remote/ssh/remote_agent.cpp's RemotePath): "~/x" is "$HOME"/'x' and "~" is "$HOME"; anything else
// is quoted as is.
std::string HostPath(const std::string& p) {
  if (p == "~") return "\"$HOME\"";
  if (p.rfind("~/", 0) == 0) return "\"$HOME\"/" + ShellQuote(p.substr(2));
  return ShellQuote(p);
}

std::string WorkerArgs(const BootstrapOptions& bo, const ConnectOptions& opts, const std::string& sha,
                       const std::string& id) {
  std::string a = " --sha256 " + sha + " --source-id " + id;
  if (bo.jobs > 0) a += " --jobs " + std::to_string(bo.jobs);
  if (!bo.install_deps) a += " --no-install-deps";
  if (!bo.systemd) a += " --no-systemd";
  if (bo.agent_only) a += " --agent-only";
  if (bo.install_torch) a += " --install-torch";
  for (const auto& arg : bo.agent_args) a += " --agent-arg " + arg;  // checked by CheckAgentArgs
  if (!opts.agent_data_dir.empty()) a += " --data-dir " + HostPath(opts.agent_data_dir);
  return a;
}

// Shows the worker's log: its phase lines always, every line with --verbose, and the newest line as
// a live status line on a terminal. Keeps the last lines for an error message.
class LogView {
 public:
  LogView(bool verbose, bool tty) : verbose_(verbose), tty_(tty) {}
  ~LogView() { ClearLive(); }

  void Feed(const std::string& bytes) {
    partial_ += bytes;
    size_t nl;
    while ((nl = partial_.find('\n')) != std::string::npos) {
      Line(partial_.substr(0, nl));
      partial_.erase(0, nl + 1);
    }
    if (partial_.size() > 65536) partial_.clear();  // a line that never ends is not shown whole
  }
  std::string Tail() const {
    std::string t;
    for (const auto& l : kept_) t += "  | " + l + "\n";
    return t;
  }

 private:
  void Line(std::string line) {
    if (line.size() > kMaxShownLine) line = line.substr(0, kMaxShownLine) + "...";
    line = EscapeForTerminal(line);
    while (!line.empty() && line.back() == '\r') line.pop_back();
    for (char& c : line) {
      if (c == '\r') c = ' ';
    }
    kept_.push_back(line);
    if (kept_.size() > kKeptLogLines) kept_.pop_front();
    const bool phase = line.rfind("== ", 0) == 0;
    if (phase || verbose_) {
      ClearLive();
      std::cerr << (phase ? "bootstrap: [" + line.substr(3, line.find(':') - 3) + "]" +
                                line.substr(line.find(':') + 1)
                          : "  | " + line)
                << "\n";
    } else if (tty_) {
      std::string shown = line.substr(0, 100);
      std::cerr << "\r\033[K  " << shown << std::flush;
      live_ = true;
    }
  }
  void ClearLive() {
    if (live_) std::cerr << "\r\033[K" << std::flush;
    live_ = false;
  }

  bool verbose_, tty_;
  bool live_ = false;
  std::string partial_;
  std::deque<std::string> kept_;
};

struct PollReply {
  std::string status;
  bool alive = false;
  uint64_t size = 0;
  std::string log;
};

PollReply ParsePoll(const std::string& out) {
  PollReply p;
  size_t pos = 0;
  for (int i = 0; i < 3 && pos < out.size(); ++i) {
    size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) nl = out.size();
    std::string line = out.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.rfind("STATUS ", 0) == 0) p.status = line.substr(7, 2000);
    if (line.rfind("ALIVE ", 0) == 0) p.alive = line == "ALIVE 1";
    if (line.rfind("SIZE ", 0) == 0) p.size = std::strtoull(line.c_str() + 5, nullptr, 10);
  }
  if (pos < out.size()) p.log = out.substr(pos);
  return p;
}

void Pause(const BootstrapOptions& bo) {
  const auto ms = std::chrono::milliseconds(static_cast<int64_t>(bo.poll_s * 1000));
  bo.clock->SleepFor(ms);
}

// Whether a poll answer keeps the protocol, given the `offset` of log bytes read before it: the log
// only grows, and a poll sends the log from the offset (up to 64 KiB) whenever it says there is more.
// Empty when it does; else what is wrong.
std::string PollProblem(const PollReply& p, uint64_t offset) {
  if (p.size < offset) {
    return "the log went back to " + std::to_string(p.size) + " bytes after " + std::to_string(offset) +
           " were read";
  }
  if (p.log.empty() && offset < p.size) {
    return "it says the log has " + std::to_string(p.size) + " bytes but sends none past " +
           std::to_string(offset);
  }
  return "";
}

// The worker's state once the log is read to its end: OK when "done", an error when "failed" or when
// it died; nullopt while it runs.
std::optional<Status> WorkerOutcome(HostShell* shell, const PollReply& p, const LogView& view) {
  if (p.status.rfind("done ", 0) == 0) return OkStatus();
  std::string host_log = "\nhost log: " + std::string(kHostLog) + "\n" + view.Tail();
  if (p.status.rfind("failed ", 0) == 0) {
    return FailedPreconditionError(shell->Display() + ": " + EscapeForTerminal(p.status.substr(7)) +
                                   host_log);
  }
  if (!p.alive) {
    return UnavailableError(shell->Display() + ": the bootstrap worker stopped without finishing (status: " +
                            EscapeForTerminal(p.status) + "); run `sftctl bootstrap` again to resume" +
                            host_log);
  }
  return std::nullopt;
}

// Follows the worker until its status is "done" (OK) or "failed" / it died (an error with the log's
// tail). Polls again at once only while new log bytes arrive; otherwise pauses first. Answers that
// break the protocol (PollProblem) are tolerated kMaxBadPolls times in a row.
Status FollowWorker(HostShell* shell, const BootstrapOptions& bo) {
  LogView view(bo.verbose, StderrIsTty());
  uint64_t offset = 0;
  int bad = 0;
  for (;;) {
    SFT_ASSIGN_OR_RETURN(std::string out,
                         RunOk(shell, "reading the bootstrap log",
                               "bash " + Script() + " poll " + std::to_string(offset), "", 60));
    PollReply p = ParsePoll(out);
    const std::string problem = PollProblem(p, offset);
    view.Feed(p.log);
    offset += p.log.size();
    if (!problem.empty()) {
      if (++bad >= kMaxBadPolls) {
        return InternalError(shell->Display() +
                             ": the host's bootstrap poll breaks the protocol: " + problem + " (" +
                             std::to_string(bad) + " answers in a row); host log: " + kHostLog);
      }
      Pause(bo);
      continue;
    }
    bad = 0;
    if (offset < p.size) continue;  // more log to read before judging the status
    if (auto outcome = WorkerOutcome(shell, p, view)) return *outcome;
    Pause(bo);
  }
}

// The probe decides the trainer's LibTorch for the flags the worker will get (sftctl-host.sh probe).
StatusOr<HostProbe> Probe(HostShell* shell, const BootstrapOptions& bo) {
  std::string cmd = "bash " + Script() + " probe";
  if (bo.agent_only) cmd += " --agent-only";
  if (bo.install_torch) cmd += " --install-torch";
  SFT_ASSIGN_OR_RETURN(std::string out, RunOk(shell, "probing the host", cmd, "", 120));
  auto p = ParseHostProbe(out);
  if (!p.ok()) return p.status().WithContext(shell->Display());
  return p;
}

// Uploads the archive when the host lacks it, then starts the worker (or follows the running one).
Status StartWorker(HostShell* shell, const ConnectOptions& opts, const BootstrapOptions& bo,
                   const HostProbe& probe, const std::string& share, const std::string& sha) {
  if (!probe.worker.empty()) {
    std::cerr << "bootstrap: a bootstrap is already running on the host (pid "
              << EscapeForTerminal(probe.worker) << "); following it\n";
    return OkStatus();
  }
  if (std::string why = BootstrapBlocker(probe, bo.install_deps); !why.empty()) {
    return FailedPreconditionError(shell->Display() + ": " + EscapeForTerminal(why));
  }
  if (probe.archive_sha256 != sha) {
    SFT_ASSIGN_OR_RETURN(std::string archive, ReadShareFile(share, "sftctl-src.tar.gz"));
    std::cerr << "bootstrap: [upload] the source (" << archive.size() / 1024 << " KiB)\n";
    SFT_RETURN_IF_ERROR(
        UploadBytes(shell, "the source archive", std::string(kHostBoot) + "/sftctl-src.tar.gz", archive));
  }
  SFT_ASSIGN_OR_RETURN(std::string out,
                       RunOk(shell, "starting the bootstrap worker",
                             "bash " + Script() + " start-worker" + WorkerArgs(bo, opts, sha, SourceId())));
  if (out.rfind("WORKER ", 0) != 0) {
    return InternalError(shell->Display() + ": unexpected answer from the bootstrap worker: " +
                         EscapeForTerminal(out.substr(0, 300)));
  }
  return OkStatus();
}

std::string Short(const std::string& id) { return id.substr(0, 12); }

// The host's installed binaries are of source `id`: both of them, or sftd alone when that is all
// that was asked for (the host script writes "<id> agent-only" after an --agent-only install).
bool InstalledFrom(const HostProbe& probe, const std::string& id, bool agent_only) {
  return probe.installed == id || (agent_only && probe.installed == id + " agent-only");
}

Status CheckAgentArgs(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a.empty() ||
        a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:=/-@+,") !=
            std::string::npos) {
      return InvalidArgumentError("agent flag '" + EscapeForTerminal(a) +
                                  "': only letters, digits and ._:=/-@+, may be passed to sftd on the host");
    }
  }
  return OkStatus();
}

}  // namespace

std::unique_ptr<HostShell> NewSshHostShell(const ConnectOptions& opts, int attempts, const Clock* clock) {
  return std::make_unique<SshHostShell>(opts, attempts, clock);
}

StatusOr<std::string> FindShareDir(const std::string& share_dir) {
  std::string dir = share_dir;
  if (dir.empty()) {
    if (const char* env = std::getenv("SFTCTL_SHARE_DIR"); env != nullptr && *env) dir = env;
  }
  if (dir.empty()) {
    SFT_ASSIGN_OR_RETURN(std::string self, SelfExePath());
    std::string bin = self.substr(0, self.rfind('/'));
    dir = bin.substr(0, bin.rfind('/')) + "/share/sftctl";
  }
  for (const char* f : {"sftctl-src.tar.gz", "sftctl-host.sh"}) {
    if (!FileSystem::Default()->Exists(JoinPath(dir, f))) {
      return NotFoundError(
          JoinPath(dir, f) +
          " is missing: `sftctl bootstrap` uploads the source this sftctl was built from, made "
          "with it at build/install time (set SFTCTL_SHARE_DIR when it lives elsewhere)");
    }
  }
  return dir;
}

StatusOr<BootstrapResult> BootstrapWith(HostShell* shell, const ConnectOptions& opts,
                                        const BootstrapOptions& bo, const SmokeRunner& smoke) {
  SFT_RETURN_IF_ERROR(CheckAgentArgs(bo.agent_args));
  SFT_ASSIGN_OR_RETURN(std::string share, FindShareDir(bo.share_dir));
  SFT_ASSIGN_OR_RETURN(std::string script, ReadShareFile(share, "sftctl-host.sh"));
  SFT_ASSIGN_OR_RETURN(std::string sha, Sha256File(JoinPath(share, "sftctl-src.tar.gz")));
  const std::string id = SourceId();
  SFT_RETURN_IF_ERROR(UploadBytes(shell, "the host script", Script(), script));
  SFT_ASSIGN_OR_RETURN(HostProbe probe, Probe(shell, bo));
  *bo.out << "bootstrap: " << EscapeForTerminal(shell->Display()) << "\n"
          << FormatHostProbe(probe) << std::flush;

  BootstrapResult result;
  result.source_id = id;
  result.up_to_date = InstalledFrom(probe, id, bo.agent_only) && AgentRuns(probe.agent_json, id) &&
                      probe.worker.empty() && !bo.force;
  if (!result.up_to_date) {
    SFT_RETURN_IF_ERROR(StartWorker(shell, opts, bo, probe, share, sha));
    SFT_RETURN_IF_ERROR(FollowWorker(shell, bo));
    SFT_ASSIGN_OR_RETURN(probe, Probe(shell, bo));
    if (!InstalledFrom(probe, id, bo.agent_only)) {
      // A worker of another client's version was followed: start ours now.
      SFT_RETURN_IF_ERROR(StartWorker(shell, opts, bo, probe, share, sha));
      SFT_RETURN_IF_ERROR(FollowWorker(shell, bo));
    }
  }
  const std::string agent = "sftd " + std::string(kVersion) + " (source " + Short(id) + ") on " +
                            EscapeForTerminal(shell->Display());
  std::string smoke_line;
  if (smoke && bo.smoke && !bo.agent_only && (!result.up_to_date || bo.smoke_always)) {
    std::cerr << "bootstrap: [smoke] a " << bo.smoke_steps << "-step job through the agent\n";
    SFT_ASSIGN_OR_RETURN(smoke_line, smoke(opts, bo.smoke_steps));
    result.smoke_job = smoke_line.substr(0, smoke_line.find(':'));
  }
  if (result.up_to_date) {
    *bo.out << "bootstrap: up to date: " << agent << (smoke_line.empty() ? "" : "; smoke job " + smoke_line)
            << "\n";
  } else {
    *bo.out << "bootstrap: ready: " << agent << (smoke_line.empty() ? "" : "; smoke job " + smoke_line)
            << "\n";
  }
  return result;
}

StatusOr<BootstrapResult> Bootstrap(const ConnectOptions& opts, const BootstrapOptions& bo) {
  auto shell = NewSshHostShell(opts, 6, bo.clock);
  return BootstrapWith(shell.get(), opts, bo, [](const ConnectOptions& o, int steps) {
    SmokeJobOptions so;
    so.steps = steps;
    return RunSmokeJob(o, so);
  });
}

}  // namespace sftctl::client
