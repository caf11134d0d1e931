#include "client/remote/job_registry.h"

#include <cctype>
#include <functional>
#include <nlohmann/json.hpp>

#include "client/remote/registry_file.h"
#include "client/remote/remote_options.h"
#include "client/remote/rented_hosts.h"
#include "client/remote/ssh/ssh_config.h"
#include "common/json_parse.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

using nlohmann::json;

json NodeToJson(const NodeRecord& n) {
  return {{"host", n.host},
          {"id", n.id},
          {"identity_file", n.identity_file},
          {"sftd", n.sftd},
          {"agent_data_dir", n.agent_data_dir},
          {"transport", n.transport}};
}

NodeRecord NodeFromJson(const json& j) {
  NodeRecord n;
  n.host = j.value("host", "");
  n.id = j.value("id", "");
  n.identity_file = j.value("identity_file", "");
  n.sftd = j.value("sftd", "");
  n.agent_data_dir = j.value("agent_data_dir", "");
  n.transport = j.value("transport", "auto");
  // "accept_new_host_key" in registries written by older versions is ignored: see NodeRecord.
  return n;
}

json RecordToJson(const JobRecord& r) {
  json nodes = json::array();
  for (const auto& n : r.nodes) nodes.push_back(NodeToJson(n));
  json j = {{"host", r.host},           {"id", r.id},
            {"name", r.name},           {"submitted_unix_ms", r.submitted_unix_ms},
            {"upload_to", r.upload_to}, {"endpoint_url", r.endpoint_url},
            {"region", r.region},       {"nodes", nodes}};
  const JobRecord::Resubmit& b = r.resubmit;
  if (!b.spec_path.empty()) {
    j["resubmit"] = {{"spec_path", b.spec_path},
                     {"spec_sha256", b.spec_sha256},
                     {"name", b.name},
                     {"sets", b.sets},
                     {"gpus", b.gpus},
                     {"cpu_ranks", b.cpu_ranks},
                     {"max_restarts", b.max_restarts}};
  }
  return j;
}

JobRecord::Resubmit ResubmitFromJson(const json& j) {
  JobRecord::Resubmit b;
  b.spec_path = j.value("spec_path", "");
  b.spec_sha256 = j.value("spec_sha256", "");
  b.name = j.value("name", "");
  b.sets = j.value("sets", std::vector<std::string>());
  b.gpus = j.value("gpus", -1);
  b.cpu_ranks = j.value("cpu_ranks", -1);
  b.max_restarts = j.value("max_restarts", 0u);
  return b;
}

bool AllIdsValid(const JobRecord& r) {
  if (!IsJobId(r.id)) return false;
  for (const auto& n : r.nodes) {
    if (!IsJobId(n.id)) return false;
  }
  return true;
}

StatusOr<std::vector<JobRecord>> Parse(const std::string& text, const std::string& path) {
  std::vector<JobRecord> out;
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return out;
  StatusOr<json> parsed = ParseJson(text, path);
  if (!parsed.ok()) {
    return DataLossError("job registry '" + path + "' is damaged (" + parsed.status().message() +
                         "); fix or remove it");
  }
  try {
    const json& j = *parsed;
    for (const auto& e : j.at("jobs")) {
      JobRecord r;
      r.host = e.at("host").get<std::string>();
      r.id = e.at("id").get<std::string>();
      r.name = e.value("name", "");
      r.submitted_unix_ms = e.value("submitted_unix_ms", int64_t{0});
      r.upload_to = e.value("upload_to", "");
      r.endpoint_url = e.value("endpoint_url", "");
      r.region = e.value("region", "");
      if (e.contains("resubmit") && e["resubmit"].is_object()) r.resubmit = ResubmitFromJson(e["resubmit"]);
      if (e.contains("nodes")) {
        for (const auto& n : e["nodes"]) r.nodes.push_back(NodeFromJson(n));
      }
      if (r.nodes.empty()) {
        NodeRecord n;
        n.host = r.host;
        n.id = r.id;
        r.nodes.push_back(n);
      }
      // Not written by this sftctl (it checks every id it stores): never used, printed or rewritten.
      if (!AllIdsValid(r)) continue;
      out.push_back(std::move(r));
    }
  } catch (const json::exception& e) {
    return DataLossError("job registry '" + path + "' is damaged (" + e.what() + "); fix or remove it");
  }
  return out;
}

}  // namespace

ConnectOptions NodeRecord::ToConnectOptions() const {
  ConnectOptions c;
  c.host = host;
  c.identity_file = identity_file;
  c.sftd = sftd;
  c.agent_data_dir = agent_data_dir;
  auto t = ParseTransport(transport);
  c.transport = t.ok() ? *t : Transport::kAuto;
  // A job on a rented host: that host's own known_hosts file (client/remote/rented_hosts.h).
  if (std::optional<RentedHost> rented = RentedHosts().FindLive(host))
    c.known_hosts_file = rented->known_hosts;
  return c;
}

NodeRecord NodeRecord::From(const ConnectOptions& opts, const std::string& job_id) {
  NodeRecord n;
  n.host = opts.host;
  n.id = job_id;
  n.identity_file = opts.identity_file;
  n.sftd = opts.sftd;
  n.agent_data_dir = opts.agent_data_dir;
  n.transport = TransportName(opts.transport);
  return n;
}

bool IsJobId(const std::string& id) {
  constexpr size_t kPrefix = 4;  // "job-"
  if (id.size() <= kPrefix || id.size() > kPrefix + 20 || id.compare(0, kPrefix, "job-") != 0) return false;
  return id.find_first_not_of("0123456789", kPrefix) == std::string::npos;
}

Status CheckJobId(const std::string& id) {
  if (IsJobId(id)) return OkStatus();
  return InvalidArgumentError("the agent reported an unusable job id '" +
                              EscapeForTerminal(id.substr(0, 64)) + (id.size() > 64 ? "...' " : "' ") +
                              "(expected job-N, e.g. job-7)");
}

Status CheckJobHost(const std::string& host) {
  if (IsLocalAgentHost(host)) {
    for (unsigned char c : host) {
      if (std::iscntrl(c)) {
        return InvalidArgumentError("host '" + EscapeForTerminal(host) + "' contains a control character");
      }
    }
    return OkStatus();
  }
  return ssh::ParseHostSpec(host).status();
}

std::optional<std::pair<std::string, std::string>> SplitJobRef(const std::string& ref) {
  const size_t slash = ref.rfind('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == ref.size()) return std::nullopt;
  return std::make_pair(ref.substr(0, slash), ref.substr(slash + 1));
}

std::string JobRegistry::DefaultPath() { return ClientConfigDir() + "/jobs.json"; }

StatusOr<std::vector<JobRecord>> JobRegistry::Load() const {
  SFT_ASSIGN_OR_RETURN(std::string text, ReadRegistryText(path_));
  return Parse(text, path_);
}

Status JobRegistry::Add(const JobRecord& r) const {
  SFT_RETURN_IF_ERROR(CheckJobId(r.id));
  for (const auto& n : r.nodes) SFT_RETURN_IF_ERROR(CheckJobId(n.id));
  return UpdateRegistryFile(path_, [&](const std::string& text) -> StatusOr<std::string> {
    SFT_ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, Parse(text, path_));
    json out = json::array();
    for (const auto& j : jobs) {
      if (j.host == r.host && j.id == r.id) continue;
      out.push_back(RecordToJson(j));
    }
    out.push_back(RecordToJson(r));
    return json({{"version", 1}, {"jobs", out}}).dump(2) + "\n";
  });
}

StatusOr<JobRecord> JobRegistry::Resolve(const std::string& ref) const {
  SFT_ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, Load());
  const std::string shown = EscapeForTerminal(ref);
  if (auto split = SplitJobRef(ref)) {
    if (!IsJobId(split->second)) {
      return NotFoundError("unknown job '" + shown + "': '" + EscapeForTerminal(split->second) +
                           "' is not a job id (HOST/job-N)");
    }
    SFT_RETURN_IF_ERROR(CheckJobHost(split->first));
    for (const auto& j : jobs) {
      for (const auto& n : j.nodes) {
        if (n.host == split->first && n.id == split->second) return j;
      }
    }
    return NotFoundError("unknown job '" + shown + "': not in the job registry " + path_ +
                         " (give --host to reach a job submitted elsewhere)");
  }
  auto pick = [&](const std::function<bool(const JobRecord&)>& match) -> StatusOr<std::optional<JobRecord>> {
    std::vector<const JobRecord*> hits;
    for (const auto& j : jobs) {
      if (match(j)) hits.push_back(&j);
    }
    if (hits.empty()) return std::optional<JobRecord>();
    if (hits.size() == 1) return std::optional<JobRecord>(*hits[0]);
    std::string names;
    for (const auto* h : hits) names += (names.empty() ? "" : ", ") + h->Ref();
    return InvalidArgumentError("job '" + shown + "' is ambiguous in the job registry " + path_ +
                                ": it could be " + names + "; name it as HOST/JOB");
  };
  SFT_ASSIGN_OR_RETURN(auto by_id, pick([&](const JobRecord& j) { return j.id == ref; }));
  if (by_id) return *by_id;
  SFT_ASSIGN_OR_RETURN(auto by_name,
                       pick([&](const JobRecord& j) { return !j.name.empty() && j.name == ref; }));
  if (by_name) return *by_name;
  return NotFoundError("unknown job '" + shown + "': not in the job registry " + path_ +
                       " (see `sftctl list`; give HOST/JOB or --host for a job submitted elsewhere)");
}

}  // namespace sftctl::client
