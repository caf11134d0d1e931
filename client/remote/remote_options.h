// Options and conventions shared by the remote commands (submit, logs, pull, status, list, cancel,
// plot): the host options that map onto ConnectOptions, --json, exit codes and error reporting.
//
// Exit codes (docs/remote.md):
//   0  success (logs -f / submit --follow: the job SUCCEEDED)
//   1  the job FAILED (logs -f / submit --follow)
//   2  fix your input: bad option or spec, missing file, unknown or ambiguous job, a differing file
//      in the pull folder without --force
//   3  the job was CANCELLED (logs -f / submit --follow)
//   4  cannot reach the host or agent, or the connection was lost and could not be resumed
//   5  the agent refused or failed the request (e.g. more GPUs than the host has, a job that already
//      finished, no complete checkpoint), or a transfer did not verify (sha256 mismatch)
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "client/remote/agent_connection.h"
#include "common/status.h"

namespace sftctl::client {

enum RemoteExitCode {
  kExitOk = 0,
  kExitJobFailed = 1,
  kExitInput = 2,
  kExitJobCancelled = 3,
  kExitUnreachable = 4,
  kExitAgent = 5,
};

struct RemoteOptions {
  std::vector<std::string> hosts;  // --host (repeatable only where a command allows several)
  std::string identity_file;       // -i
  bool accept_new_host_key = false;
  std::string transport = "auto";  // auto | forward | bridge
  std::string sftd;                // sftd path on the host
  std::string agent_data_dir;      // sftd --data-dir on the host
  bool json = false;
};

// Adds --host, -i, --accept-new-host-key, --transport, --sftd, --agent-data-dir and --json to `cmd`.
// `host_help` describes --host for this command; `multi_host` lets it repeat.
void AddRemoteOptions(CLI::App* cmd, RemoteOptions* o, const std::string& host_help, bool multi_host = false);

StatusOr<Transport> ParseTransport(const std::string& name);
const char* TransportName(Transport t);

// The ConnectOptions to reach `host` with the command's options; `host` may name a live rented host
// (client/remote/rented_hosts.h), which becomes its SSH target. Errors: INVALID_ARGUMENT (transport).
StatusOr<ConnectOptions> MakeConnectOptions(const RemoteOptions& o, const std::string& host);

// The exit code for an error: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, OUT_OF_RANGE -> 2;
// UNAVAILABLE, DEADLINE_EXCEEDED, UNAUTHENTICATED, PERMISSION_DENIED -> 4; anything else -> 5.
int ExitCodeFor(const Status& s);

// Prints "error: <message>" on stderr (and {"error": {...}} on stdout when `json`) and returns
// ExitCodeFor(s).
int ReportError(const Status& s, bool json);

// True when stderr is a terminal (progress bars and live lines go there only then).
bool StderrIsTty();

// A random lowercase hex string of 2 * bytes digits (client_request_id, group ids).
std::string RandomHex(size_t bytes);

// Milliseconds since the epoch, and a local "YYYY-MM-DD HH:MM:SS" for humans ("-" for 0).
int64_t NowUnixMs();
std::string FormatTime(int64_t unix_ms);

}  // namespace sftctl::client
