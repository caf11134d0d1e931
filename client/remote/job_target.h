// Finding the job a command names, and connecting to its nodes.
//
// JOB is looked up in the registry ("job-3", a name, or "HOST/job-3"). With --host H, JOB is the
// agent's id on H (the registry entry is used when it has one, for its other nodes and options); a
// "HOST/job-3" that the registry does not know is reached with the command's host options.
#pragma once

#include <memory>
#include <string>

#include "client/remote/agent_session.h"
#include "client/remote/job_registry.h"
#include "client/remote/remote_options.h"

namespace sftctl::client {

// Errors: as JobRegistry::Resolve; INVALID_ARGUMENT for a bad --transport, a HOST that CheckJobHost
// refuses (before any registry lookup or connection) and, with --host, a JOB that is not a job id.
StatusOr<JobRecord> ResolveJob(const std::string& ref, const RemoteOptions& o, const JobRegistry& registry);

// Connects to `node` once (an unreachable host fails at once) and returns a Reconnector that
// reconnects with the same options after a dropped connection. Errors read "cannot reach HOST: ..."
// and are UNAVAILABLE (INVALID_ARGUMENT for a malformed host or option). A node on a rented host that
// was given back (rented_hosts.h's FindGivenBack) is UNAVAILABLE at once, saying so, never dialled.
StatusOr<std::unique_ptr<Reconnector>> ConnectNode(const NodeRecord& node);
StatusOr<std::unique_ptr<Reconnector>> ConnectHost(const ConnectOptions& opts);

}  // namespace sftctl::client
