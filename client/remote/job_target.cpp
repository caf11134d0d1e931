#include "client/remote/job_target.h"

#include "client/remote/rented_hosts.h"
#include "common/terminal_text.h"

namespace sftctl::client {

StatusOr<JobRecord> ResolveJob(const std::string& ref, const RemoteOptions& o, const JobRegistry& registry) {
  if (ref.empty()) return InvalidArgumentError("give a job: JOB, HOST/JOB or --host HOST JOB");
  std::string host, id;
  if (!o.hosts.empty()) {
    host = o.hosts.front();
    id = ref;
    if (auto split = SplitJobRef(ref)) {
      if (split->first != host) {
        return InvalidArgumentError("job '" + EscapeForTerminal(ref) + "' names host '" +
                                    EscapeForTerminal(split->first) + "' but --host is '" +
                                    EscapeForTerminal(host) + "'");
      }
      id = split->second;
    }
  } else if (auto split = SplitJobRef(ref)) {
    host = split->first;
    id = split->second;
  } else {
    return registry.Resolve(ref);
  }
  // Checked before the registry or a connection sees them: the host reaches ssh (a ProxyCommand's
  // shell through %h), the id is printed and names folders.
  if (!IsJobId(id)) {
    if (o.hosts.empty()) return registry.Resolve(ref);  // NOT_FOUND: "... is not a job id"
    return InvalidArgumentError("job '" + EscapeForTerminal(ref) +
                                "': with --host, JOB is the agent's job id (job-N)");
  }
  if (Status s = CheckJobHost(host); !s.ok()) {
    return Status(s.code(), "job '" + EscapeForTerminal(ref) + "': " + s.message());
  }
  // A host and an id: the registry entry when there is one, else the command's options.
  auto known = registry.Resolve(host + "/" + id);
  if (known.ok()) return known;
  if (known.status().code() != StatusCode::kNotFound) return known.status();
  SFT_ASSIGN_OR_RETURN(ConnectOptions opts, MakeConnectOptions(o, host));
  JobRecord r;
  r.host = host;
  r.id = id;
  r.nodes.push_back(NodeRecord::From(opts, id));
  return r;
}

StatusOr<std::unique_ptr<Reconnector>> ConnectHost(const ConnectOptions& opts) {
  SessionFactory factory = MakeSessionFactory(opts);
  auto first = factory();
  if (!first.ok()) {
    // Connection errors already name the host ("gpu-box: host key ..."); say what failed once.
    const Status& s = first.status();
    const bool named = s.message().rfind(opts.host, 0) == 0;
    // Every failure to connect is "cannot reach" (exit 4), except a malformed host or option (exit 2).
    const StatusCode code = s.code() == StatusCode::kInvalidArgument ? s.code() : StatusCode::kUnavailable;
    return Status(code, "cannot reach " + (named ? s.message() : opts.host + ": " + s.message()));
  }
  return std::make_unique<Reconnector>(std::move(*first), factory);
}

StatusOr<std::unique_ptr<Reconnector>> ConnectNode(const NodeRecord& node) {
  // A rented host given back took its jobs with it; another machine may answer at its address now.
  if (std::optional<RentedHost> back = RentedHosts().FindGivenBack(node.host)) {
    return UnavailableError("cannot reach " + node.host + ": it was the rented host " + back->name +
                            ", given back " + FormatTime(back->ended_unix_ms) + "; its jobs ended with it");
  }
  return ConnectHost(node.ToConnectOptions());
}

}  // namespace sftctl::client
