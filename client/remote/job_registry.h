// JobRegistry: the jobs this user submitted, so `logs JOB`, `pull JOB`, ... need no --host.
//
// One JSON file, $XDG_CONFIG_HOME/sftctl/jobs.json (default ~/.config/sftctl/jobs.json):
//   {"version": 1, "jobs": [{"host": "gpu-box", "id": "job-3", "name": "tiny",
//     "submitted_unix_ms": 1700000000000, "upload_to": "s3://b/p", "endpoint_url": "", "region": "",
//     "nodes": [{"host": "gpu-box", "id": "job-3", "identity_file": "", "sftd": "",
//                "agent_data_dir": "", "transport": "auto"}, ...]}]}
// A job is (host, agent job id); a multi-node job is one entry (node 0's host and id) listing every
// node, node 0 first. Updates take an exclusive flock on jobs.json.lock, read, modify, and replace the
// file atomically (temporary file, fsync, rename), so concurrent sftctl processes never lose entries.
//
// Job references: "job-3" when exactly one entry has that id (or, failing that, that name);
// "HOST/job-3" always (HOST may itself contain '/', as in "local:/tmp/agent": the last '/' splits).
// A job id is "job-" and digits, the only ids sftd hands out; the HOST of a reference must pass
// CheckJobHost before anything uses it (an SSH host name reaches a ProxyCommand's shell). Registry
// entries whose ids are not job ids (hand edits, an old sftctl and a hostile agent) are ignored.
//
// Thread safety: a JobRegistry is a path; concurrent use from threads and processes is safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/remote/agent_connection.h"
#include "common/status.h"

namespace sftctl::client {

struct NodeRecord {
  std::string host;  // ConnectOptions::host
  std::string id;    // the agent's job id on that host
  std::string identity_file, sftd, agent_data_dir;
  std::string transport = "auto";
  // --accept-new-host-key is deliberately not recorded: it recorded the host's key at submit, and
  // every later reconnect (logs, pull, status) must check against that key strictly.

  ConnectOptions ToConnectOptions() const;
  static NodeRecord From(const ConnectOptions& opts, const std::string& job_id);
};

struct JobRecord {
  std::string host;  // node 0's host
  std::string id;    // node 0's job id
  std::string name;
  int64_t submitted_unix_ms = 0;
  std::vector<NodeRecord> nodes;  // node 0 first; never empty for a valid record
  // checkpoint.upload_to / endpoint_url / region of its spec ("" when it uploads nowhere): where
  // `status` looks for its newest checkpoint when the host no longer answers (no secret is stored).
  std::string upload_to, endpoint_url, region;
  // What `sftctl resubmit` needs to submit the job again on another host: the spec file (absolute),
  // its sha256 then, and the submit's --set, --name, --gpus, --cpu-ranks, --max-restarts. Empty
  // spec_path: recorded by an older sftctl.
  struct Resubmit {
    std::string spec_path, spec_sha256, name;
    std::vector<std::string> sets;
    int gpus = -1, cpu_ranks = -1;
    unsigned max_restarts = 0;
  } resubmit;

  // "HOST/ID", the reference that is never ambiguous.
  std::string Ref() const { return host + "/" + id; }
};

// Whether `id` is a job id: "job-" and 1-20 digits (agent/state/state_store.cpp makes them so).
bool IsJobId(const std::string& id);

// OK when `id` (as an agent reported it) is a job id. The id becomes a folder name (`pull`'s default
// destination), part of printed references and of the registry, so anything else is refused
// (INVALID_ARGUMENT "the agent reported an unusable job id ...", the id escaped for the terminal).
Status CheckJobId(const std::string& id);

// OK when `host`, as a job reference or --host names it, may be used: a local agent ("local",
// "localhost", "local:DIR" without control characters) or an SSH host "[user@]host[:port]" that
// ssh::ParseHostSpec accepts (OpenSSH's host and user name rules). INVALID_ARGUMENT naming the host.
Status CheckJobHost(const std::string& host);

// Splits "HOST/job-3" at the last '/'. Returns nullopt for a reference without '/'. Checks nothing.
std::optional<std::pair<std::string, std::string>> SplitJobRef(const std::string& ref);

class JobRegistry {
 public:
  // $XDG_CONFIG_HOME/sftctl/jobs.json, else $HOME/.config/sftctl/jobs.json.
  static std::string DefaultPath();

  explicit JobRegistry(std::string path = DefaultPath()) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }

  // Every entry, oldest first. A missing file is an empty registry. Errors: DATA_LOSS (not valid
  // JSON, naming the file), INTERNAL (I/O).
  StatusOr<std::vector<JobRecord>> Load() const;
  // Adds `r`, replacing an entry with the same host and id. INVALID_ARGUMENT when an id in `r` is not
  // a job id (CheckJobId).
  Status Add(const JobRecord& r) const;
  // Finds the entry for a reference (see above). Errors: NOT_FOUND naming the registry file (also for
  // "HOST/ID" whose ID is not a job id); INVALID_ARGUMENT for an ambiguous reference, listing the
  // candidates as HOST/ID, and for a HOST that CheckJobHost refuses.
  StatusOr<JobRecord> Resolve(const std::string& ref) const;

 private:
  std::string path_;
};

}  // namespace sftctl::client
