// Daemon: the `sftd` subcommands. `start` runs (or finds) the agent for a data dir and prints one
// machine-readable line; `status`, `stop` and `bridge` talk to the agent a data dir's files point at.
//
// Files in the data dir: sftd.lock (flock held by the running agent: the source of truth for "is it
// running"), sftd.pid, sftd.host + sftd.port (the address to dial), sftd.version (written after the
// port is bound), token (0600), agent.db (SQLite WAL), sftd.log (stdout/stderr of a detached agent),
// blobs/, jobs/<id>/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "agent/state/gc.h"
#include "agent/stopping/stop_policy.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent {

struct DaemonOptions {
  std::string data_dir;              // empty: DefaultDataDir()
  std::string listen = "127.0.0.1";  // a non-loopback address requires tls_cert and tls_key
  int port = 0;                      // 0: any free port (written to sftd.port)
  std::optional<std::string> gpus;   // override, e.g. "0,1" or "none"; unset: nvidia-smi
  std::string trainer;               // empty: sftctl-trainer next to the sftd binary
  std::string tls_cert, tls_key;
  bool detach = false;
  int kill_grace_ms = 10000;
  int poll_ms = 100;
  int heartbeat_s = 1800;
  int cpu_slots = 0;  // 0: number of CPUs
  // master_addr reported for node 0 of multi-node jobs; empty: see RendezvousAddr.
  std::string rendezvous_addr;
  // Slurm jobs (docs/slurm.md): the folder on the cluster's shared filesystem for their job folders
  // ("" refuses them), and how often Slurm is asked for their state.
  std::string shared_dir;
  int slurm_poll_ms = 2000;
  std::string version_override;  // tests only: pretend to be another version
  // Garbage collection (agent/state/gc.h): the policy `sftd gc` and automatic collection use; automatic
  // collection checks every gc_check_s whether the store is over gc.max_store_bytes or the disk has
  // less than gc_min_free_pct percent free (0: never automatically).
  GcPolicy gc;
  int gc_check_s = 600;
  int gc_min_free_pct = 10;
  // Stopping the host (agent/stopping/auto_stop.h): the flags given change the policy persisted in agent.db;
  // the policy is evaluated every stop_check_ms.
  StopPolicyFlags stop;
  int stop_check_ms = 5000;
};

// The address a local client dials for an agent listening on `listen`: "127.0.0.1" for 0.0.0.0,
// localhost or no address; "[::1]" for "::"; an IPv6 literal in brackets ("::1" -> "[::1]"); else
// `listen` itself. Written to the data dir's sftd.host and reported in SFTD_READY and `status`.
std::string DialHost(const std::string& listen);

// The master_addr node 0 of a multi-node job reports: `rendezvous_addr` when set; else "127.0.0.1" when
// listening on loopback (the client, which reached the agent through SSH, overrides it with the host
// name it used); else this host's name when listening on a wildcard address (0.0.0.0, ::); else the
// listen address itself.
std::string RendezvousAddr(const DaemonOptions& opts);

// $SFTD_DATA_DIR, else the first line of ~/.config/sftd/data_dir ($XDG_CONFIG_HOME/sftd/data_dir;
// written by `sftctl bootstrap` for storage that survives the instance; an unusable one is named on
// stderr and skipped), else $XDG_DATA_HOME/sftd, else $HOME/.local/share/sftd (HOME unset: the
// user's home from the password database); "" when there is none (never a shared folder).
std::string DefaultDataDir();

// The data dir holds the token and the jobs: it must be a real folder of this user that no other
// user can write. OK (after chmod 0700), or PERMISSION_DENIED (another owner; world-writable),
// FAILED_PRECONDITION (not a folder), naming the folder.
Status CheckDataDirTrust(const std::string& dir);

// ~/.config/sftd/env ($XDG_CONFIG_HOME/sftd/env): the KEY=VALUE secrets (LAMBDA_API_KEY, ...) that the
// bootstrap script and the systemd unit load into sftd's environment; "" when there is no home.
std::string EnvFilePath();
// `sftd start` refuses an env file that another user could read or change: OK when `path` is missing
// or a regular file of this user with no group/other read or write bit; else PERMISSION_DENIED (or
// FAILED_PRECONDITION: not a regular file) naming the file and `chmod 600`.
Status CheckEnvFileTrust(const std::string& path);
std::string AgentVersion();

// Each returns the process exit code.
int RunStart(DaemonOptions opts);
// `with_token` (with `json`): the object also carries the data dir's token, so that a client reads
// the agent's address and token with one remote command.
int RunStatus(const std::string& data_dir, bool json, bool with_token = false);
// `quiet`: report on stderr (stdout stays reserved for the SFTD_READY line of `start`).
int RunStop(const std::string& data_dir, int timeout_s, bool quiet = false);
int RunBridge(const std::string& data_dir);
// `sftd gc`: asks the running agent to collect (CollectGarbage), or, when none runs, takes the data
// dir's lock and collects itself with the default policy and `req`'s overrides. Prints what was
// removed (or would be: req.dry_run()), one line per entry, or one JSON object with `json`. Exit 0,
// or 1 with the error on stderr.
int RunGc(const std::string& data_dir, const ::sftctl::v1::CollectGarbageRequest& req, bool json);

}  // namespace sftctl::agent
