#include "client/remote/rented_hosts.h"

#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "client/remote/registry_file.h"
#include "common/json_parse.h"
#include "common/os/file_system.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

using nlohmann::json;

json ToJson(const RentedHost& h) {
  return {{"name", h.name},
          {"provider", h.provider},
          {"instance_id", h.instance_id},
          {"instance_type", h.instance_type},
          {"region", h.region},
          {"gpu", h.gpu},
          {"gpu_count", h.gpu_count},
          {"price_per_hour", h.price_per_hour},
          {"launched_unix_ms", h.launched_unix_ms},
          {"ended_unix_ms", h.ended_unix_ms},
          {"state", h.state},
          {"ssh_user", h.ssh_user},
          {"ssh_host", h.ssh_host},
          {"ssh_port", h.ssh_port},
          {"identity_file", h.identity_file},
          {"sftd", h.sftd},
          {"agent_data_dir", h.agent_data_dir},
          {"known_hosts", h.known_hosts},
          {"max_cost", h.max_cost},
          {"down_when_done", h.down_when_done}};
}

template <typename T>
T Field(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->template get<std::string>() : fallback;
  } else if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->template get<bool>() : fallback;
  } else {
    return it->is_number() ? it->template get<T>() : fallback;
  }
}

RentedHost FromJson(const json& j) {
  RentedHost h;
  h.name = Field<std::string>(j, "name", "");
  h.provider = Field<std::string>(j, "provider", "");
  h.instance_id = Field<std::string>(j, "instance_id", "");
  h.instance_type = Field<std::string>(j, "instance_type", "");
  h.region = Field<std::string>(j, "region", "");
  h.gpu = Field<std::string>(j, "gpu", "");
  h.gpu_count = Field<int>(j, "gpu_count", 0);
  h.price_per_hour = Field<double>(j, "price_per_hour", 0);
  h.launched_unix_ms = Field<int64_t>(j, "launched_unix_ms", 0);
  h.ended_unix_ms = Field<int64_t>(j, "ended_unix_ms", 0);
  h.state = Field<std::string>(j, "state", "starting");
  h.ssh_user = Field<std::string>(j, "ssh_user", "");
  h.ssh_host = Field<std::string>(j, "ssh_host", "");
  h.ssh_port = Field<int>(j, "ssh_port", 22);
  h.identity_file = Field<std::string>(j, "identity_file", "");
  h.sftd = Field<std::string>(j, "sftd", "");
  h.agent_data_dir = Field<std::string>(j, "agent_data_dir", "");
  h.known_hosts = Field<std::string>(j, "known_hosts", "");
  h.max_cost = Field<double>(j, "max_cost", 0);
  h.down_when_done = Field<bool>(j, "down_when_done", false);
  return h;
}

StatusOr<std::vector<RentedHost>> Parse(const std::string& text, const std::string& path) {
  std::vector<RentedHost> out;
  if (text.empty()) return out;
  StatusOr<json> parsed = ParseJson(text, path);
  if (!parsed.ok()) return DataLossError(parsed.status().message());
  const json& doc = *parsed;
  if (!doc.is_object() || !doc.contains("hosts") || !doc["hosts"].is_array()) {
    return DataLossError(path + ": not a hosts registry (expected {\"version\": 1, \"hosts\": [...]})");
  }
  for (const auto& e : doc["hosts"]) {
    if (!e.is_object()) continue;
    RentedHost h = FromJson(e);
    if (CheckRentedHostName(h.name).ok()) out.push_back(std::move(h));
  }
  return out;
}

}  // namespace

std::string RentedHost::SshTarget() const {
  if (ssh_host.empty()) return "";
  const std::string host = ssh_host.find(':') != std::string::npos ? "[" + ssh_host + "]" : ssh_host;
  std::string t = ssh_user.empty() ? host : ssh_user + "@" + host;
  return ssh_port == 22 ? t : t + ":" + std::to_string(ssh_port);
}

double RentedHost::SpentUsd(int64_t now_unix_ms) const {
  if (launched_unix_ms <= 0) return 0;
  const int64_t end = ended_unix_ms > 0 ? ended_unix_ms : now_unix_ms;
  return end <= launched_unix_ms ? 0 : price_per_hour * static_cast<double>(end - launched_unix_ms) / 3.6e6;
}

Status CheckRentedHostName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 63 && std::isalpha(static_cast<unsigned char>(name[0]));
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  }
  if (ok) return OkStatus();
  return InvalidArgumentError(
      "host name '" + EscapeForTerminal(name) +
      "': use letters, digits, '.', '_' and '-', starting with a letter (at most 63)");
}

std::string RentedHosts::DefaultPath() { return ClientConfigDir() + "/hosts.json"; }

StatusOr<std::vector<RentedHost>> RentedHosts::Load() const {
  SFT_ASSIGN_OR_RETURN(std::string text, ReadRegistryText(path_));
  return Parse(text, path_);
}

Status RentedHosts::Put(const RentedHost& h) const {
  SFT_RETURN_IF_ERROR(CheckRentedHostName(h.name));
  return UpdateRegistryFile(path_, [&](const std::string& text) -> StatusOr<std::string> {
    SFT_ASSIGN_OR_RETURN(std::vector<RentedHost> hosts, Parse(text, path_));
    json out = json::array();
    bool replaced = false;
    for (const auto& e : hosts) {
      replaced |= e.name == h.name;
      out.push_back(ToJson(e.name == h.name ? h : e));
    }
    if (!replaced) out.push_back(ToJson(h));
    return json({{"version", 1}, {"hosts", out}}).dump(2) + "\n";
  });
}

StatusOr<RentedHost> RentedHosts::Get(const std::string& name) const {
  SFT_ASSIGN_OR_RETURN(std::vector<RentedHost> hosts, Load());
  for (auto& h : hosts) {
    if (h.name == name) return h;
  }
  return NotFoundError("no rented host '" + EscapeForTerminal(name) + "' in " + path_ +
                       " (`sftctl hosts` lists them)");
}

std::string RentedHosts::KnownHostsFor(const std::string& name) const {
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  return (dir.empty() ? std::string("known_hosts.d/") : dir + "/known_hosts.d/") + name;
}

std::optional<RentedHost> RentedHosts::FindLive(const std::string& host) const {
  if (host.empty() || !FileSystem::Default()->Exists(path_)) return std::nullopt;
  auto hosts = Load();
  if (!hosts.ok()) return std::nullopt;
  for (auto& h : *hosts) {
    if ((h.name == host || h.SshTarget() == host) && h.Live() && !h.ssh_host.empty()) return h;
  }
  return std::nullopt;
}

std::optional<RentedHost> RentedHosts::FindGivenBack(const std::string& host) const {
  if (host.empty() || !FileSystem::Default()->Exists(path_)) return std::nullopt;
  auto hosts = Load();
  if (!hosts.ok()) return std::nullopt;
  std::optional<RentedHost> out;
  for (auto& h : *hosts) {
    if (h.name != host && h.SshTarget() != host) continue;
    if (h.Live()) return std::nullopt;  // a provider may give a new host the address of an old one
    if (h.state == "down" && (!out || h.ended_unix_ms > out->ended_unix_ms)) out = h;
  }
  return out;
}

}  // namespace sftctl::client
