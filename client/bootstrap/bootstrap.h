// `sftctl bootstrap --host H`: turn a fresh GPU host into one that runs this sftctl's agent.
//
// Over one SSH session (re-opened after a drop) it uploads deploy/host/sftctl-host.sh, probes the
// host and shows the probe as a table; when the host does not already run sftd of this client's
// source id, it uploads the source archive that was built and installed with this client
// (share/sftctl/sftctl-src.tar.gz, only when the host lacks it), starts the host-side worker detached
// (packages, two CMake builds, install under ~/.local, start sftd) and follows its log until it ends;
// then runs a 20-step smoke job through the agent. A worker already running is followed, not started
// twice; a dropped connection is resumed where the log was. See docs/remote.md ("A fresh host").
//
// Thread safety: none (one bootstrap at a time per process). The host is not trusted: its output is
// parsed with bounds and printed through EscapeForTerminal.
#pragma once

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "client/bootstrap/host_probe.h"
#include "client/remote/agent_connection.h"
#include "client/remote/ssh/ssh_session.h"
#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::client {

// Runs shell commands on the host. The seam between the bootstrap's policy and SSH.
class HostShell {
 public:
  virtual ~HostShell() = default;
  // Runs `command` with `input` on its stdin. UNAVAILABLE / DEADLINE_EXCEEDED when the connection
  // failed (the caller may retry); the command's own failure is in exit_code.
  virtual StatusOr<ssh::ExecResult> Run(const std::string& command, const std::string& input,
                                        int timeout_s) = 0;
  virtual std::string Display() const = 0;
};

// A HostShell over SSH that reconnects (with opts) after a transport failure, up to `attempts` times
// per command with a growing pause.
std::unique_ptr<HostShell> NewSshHostShell(const ConnectOptions& opts, int attempts = 6,
                                           const Clock* clock = Clock::Real());

// How many `poll` answers in a row may claim log bytes they do not send (or a log shorter than what
// was read) before the bootstrap gives up; each is followed by a pause.
constexpr int kMaxBadPolls = 10;

struct BootstrapOptions {
  bool install_deps = true;   // apt-get install what the host lacks (root or password-less sudo)
  bool smoke = true;          // run the smoke job after installing
  bool smoke_always = false;  // --smoke: also when the host was already up to date
  bool force = false;         // run the host worker even when the host is up to date
  bool systemd = true;        // a systemd unit when PID 1 is systemd
  // Build and install sftd only (no LibTorch needed on the host): a login node, or a host whose
  // trainer is installed another way. No smoke job runs; the host counts as up to date when its
  // installed sftd is of this source (a full bootstrap later adds the trainer).
  bool agent_only = false;
  // A host with no usable LibTorch (no PyTorch new enough, with CUDA on a GPU host): install PyTorch
  // from download.pytorch.org into a venv of sftctl's own there (a CUDA wheel matching the GPU
  // driver). Without it, such a host stops the bootstrap before anything is uploaded, with a message
  // saying what was found, what is needed and how to fix it.
  bool install_torch = false;
  int jobs = 0;  // build jobs on the host; 0: its core count
  int smoke_steps = 20;
  // Flags for `sftd start` on the host (e.g. --stop-when-idle 2h): letters, digits and ._:=/-@+,
  // only (they cross a shell). INVALID_ARGUMENT otherwise.
  std::vector<std::string> agent_args;
  std::string share_dir;  // empty: $SFTCTL_SHARE_DIR, else <dir of sftctl>/../share/sftctl
  bool verbose = false;   // print every line of the host's log, not only the phases
  double poll_s = 2.0;    // how often the worker's log is read
  // What the pauses between polls that brought no new log bytes, and between SSH reconnects, are slept
  // on (tests pass an OffsetClock and count the pauses in the time it moved). Not owned.
  const Clock* clock = Clock::Real();
  std::ostream* out = &std::cout;  // the probe table and the final line (`submit --bootstrap`: stderr)
};

// Where sftctl-src.tar.gz and sftctl-host.sh are: options.share_dir, $SFTCTL_SHARE_DIR, else
// <dir of the running sftctl>/../share/sftctl. NOT_FOUND naming the folder when a file is missing.
StatusOr<std::string> FindShareDir(const std::string& share_dir);

// What Bootstrap did, for `submit --bootstrap` and tests.
struct BootstrapResult {
  bool up_to_date = false;  // nothing was built or installed
  std::string source_id;    // the agent's, after the bootstrap
  std::string smoke_job;    // "job-3"; empty when no smoke job ran
};

// The whole bootstrap of opts.host; progress on stderr, the probe table and the final line on
// stdout. Errors name the host and the phase ("H: build-agent failed: ...") and carry the host log's
// path; INTERNAL when the host's `poll` answers break the protocol (a log size that goes backwards, or
// one past what it sends) for kMaxBadPolls polls in a row. REQUIRES: opts.host is not a local host name.
StatusOr<BootstrapResult> Bootstrap(const ConnectOptions& opts, const BootstrapOptions& bo);

// The same with the parts injected (tests): `shell` runs the commands; `smoke` runs the smoke job
// (may be empty: no smoke job).
using SmokeRunner = std::function<StatusOr<std::string>(const ConnectOptions&, int steps)>;
StatusOr<BootstrapResult> BootstrapWith(HostShell* shell, const ConnectOptions& opts,
                                        const BootstrapOptions& bo, const SmokeRunner& smoke);

}  // namespace sftctl::client
