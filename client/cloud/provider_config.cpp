#include "client/cloud/provider_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "client/remote/registry_file.h"
#include "client/remote/rented_hosts.h"
#include "common/net/http_client.h"
#include "common/json_parse.h"
#include "common/lambda_api.h"
#include "common/os/file_system.h"
#include "common/os/net_addr.h"
#include "common/terminal_text.h"

namespace sftctl::client::cloud {
namespace {

using nlohmann::json;

std::vector<ProviderProfile> BuiltInProfiles() {
  ProviderProfile lambda;
  lambda.name = lambda.type = "lambda";
  lambda.api_url = kLambdaApiUrl;  // common/lambda_api.h, shared with the agent's stop action
  ProviderProfile runpod;
  runpod.name = runpod.type = "runpod";
  runpod.api_url = "https://api.runpod.io";
  return {lambda, runpod};
}

std::string ConfigDir(const ProviderConfig& c) {
  return c.config_dir.empty() ? ClientConfigDir() : c.config_dir;
}

// Whether the user opted in, on this machine, to profile `name` sending its key where its defaults
// would not (kProviderOverridesVariable lists such names, comma-separated).
bool OptedIn(const std::string& name) {
  const char* v = std::getenv(kProviderOverridesVariable);
  if (v == nullptr) return false;
  const std::string list = std::string(",") + v + ",";
  return list.find("," + name + ",") != std::string::npos;
}

// The key goes with every request: https, or http only to this machine (the tests' stand-ins).
Status CheckApiUrl(const std::string& file, const std::string& field, const std::string& url) {
  const std::string origin = UrlOrigin(url);
  if (!IsHttpUrl(url) || origin.empty()) return FieldError(file, field, "must be an https:// URL");
  const std::string authority = origin.substr(origin.find("://") + 3);
  if (authority.find('@') != std::string::npos) return FieldError(file, field, "must not hold a user name");
  if (origin.rfind("https://", 0) == 0) return OkStatus();
  const std::string host = authority[0] == '[' ? authority.substr(0, authority.find(']') + 1)
                                               : authority.substr(0, authority.find(':'));
  if (IsLoopbackHost(host)) return OkStatus();
  return FieldError(file, field,
                    "must be an https:// URL (http:// only to this machine: 127.0.0.1, [::1], localhost): "
                    "the API key goes with every request");
}

// Where profile `name`'s key goes and which variable it is read from, once its entry was applied:
// its own variable, and a built-in profile's own server, unless the user opted in (OptedIn).
Status CheckWhereTheKeyGoes(const std::string& file, const std::string& name, const ProviderProfile& p,
                            const std::string& builtin_url, const std::string& key_env) {
  const std::string where = "providers." + name;
  SFT_RETURN_IF_ERROR(CheckApiUrl(file, where + ".api_url", p.api_url));
  if (OptedIn(name)) return OkStatus();
  const std::string own = DefaultKeyVariable(name);
  const std::string opt_in =
      "; a file that may have come from someone else cannot decide that: if you mean "
      "it, opt in on this machine with " +
      std::string(kProviderOverridesVariable) + "=" + name + " (docs/remote.md)";
  if (!key_env.empty() && key_env != own) {
    return FieldError(file, where + ".api_key_env",
                      "'" + EscapeForTerminal(key_env) + "' is not this profile's own variable " + own +
                          ": it would send that variable's secret to " + EscapeForTerminal(p.api_url) +
                          opt_in);
  }
  if (!builtin_url.empty() && p.api_url != builtin_url) {
    return FieldError(file, where + ".api_url",
                      "sends the built-in profile's key (" + own + ") to " + EscapeForTerminal(p.api_url) +
                          " instead of " + builtin_url + opt_in + ", or add a profile of your own name");
  }
  return OkStatus();
}

// Applies one entry of providers.json to `p` (a built-in one, or a new one named `name`).
Status ApplyEntry(const std::string& file, const std::string& name, const json& e, ProviderProfile* p,
                  std::string* key_env) {
  const std::string where = "providers." + name;
  if (!e.is_object()) return FieldError(file, where, "must be an object");
  for (const auto& [k, v] : e.items()) {
    if (k == "api_key") {
      return FieldError(file, where + ".api_key",
                        "keys do not go in this file: set " + DefaultKeyVariable(name) +
                            " or write the key to " + "keys/" + name + " next to it (mode 0600)");
    }
    const bool is_port = k == "ssh_port";
    if (is_port ? !v.is_number_integer() : !v.is_string()) {
      return FieldError(file, where + "." + k, is_port ? "must be an integer" : "must be a string");
    }
    if (k == "type") {
      p->type = v.get<std::string>();
    } else if (k == "api_url") {
      p->api_url = v.get<std::string>();
    } else if (k == "api_key_env") {
      *key_env = v.get<std::string>();
    } else if (k == "ssh_port") {
      p->ssh_port = v.get<int>();
      if (p->ssh_port < 1 || p->ssh_port > 65535)
        return FieldError(file, where + ".ssh_port", "must be 1-65535");
    } else if (k == "ssh_user") {
      p->ssh_user = v.get<std::string>();
    } else if (k == "image") {
      p->image = v.get<std::string>();
    } else {
      return FieldError(file, where + "." + k,
                        "unknown field (known: type, api_url, api_key_env, ssh_port, ssh_user, image)");
    }
  }
  if (p->type != "lambda" && p->type != "runpod") {
    return FieldError(file, where + ".type",
                      "'" + EscapeForTerminal(p->type) + "' is not one of lambda, runpod");
  }
  while (!p->api_url.empty() && p->api_url.back() == '/') p->api_url.pop_back();
  return OkStatus();
}

// The key of profile `name`: the variable, else the key file (checked), else "".
StatusOr<std::string> FindKey(const std::string& dir, const std::string& name, const std::string& key_env) {
  const std::string var = key_env.empty() ? DefaultKeyVariable(name) : key_env;
  if (const char* v = std::getenv(var.c_str()); v != nullptr && *v != '\0') return std::string(v);
  const std::string path = dir + "/keys/" + name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return std::string();
  if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return PermissionDeniedError(
        path + ": a key file must be a regular file of this user that no one else may read " + "(chmod 600 " +
        path + ")");
  }
  SFT_ASSIGN_OR_RETURN(std::string text, FileSystem::Default()->ReadFile(path));
  const auto end = text.find_first_of("\r\n");
  std::string key = text.substr(0, end);
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  return key;
}

}  // namespace

std::string DefaultKeyVariable(const std::string& profile_name) {
  std::string v;
  for (char c : profile_name)
    v += c == '-' || c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return v + "_API_KEY";
}

StatusOr<std::vector<ProviderProfile>> LoadProviderProfiles(const ProviderConfig& config) {
  const std::string dir = ConfigDir(config);
  const std::string file = dir + "/providers.json";
  std::vector<ProviderProfile> profiles = BuiltInProfiles();
  std::vector<std::string> key_envs(profiles.size());
  FileSystem* fs = FileSystem::Default();
  if (fs->Exists(file)) {
    SFT_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(file));
    StatusOr<json> parsed = ParseJson(text, file);
    if (!parsed.ok()) return DataLossError(parsed.status().message());
    json doc = std::move(*parsed);
    if (!doc.is_object()) return DataLossError(file + ": not a JSON object");
    if (doc.contains("providers") && !doc["providers"].is_object()) {
      return FieldError(file, "providers", "must be an object of profiles");
    }
    const json entries = doc.value("providers", json::object());  // (items() of a temporary would dangle)
    for (const auto& item : entries.items()) {
      const std::string& name = item.key();  // (a structured binding cannot be captured in C++17)
      const json& entry = item.value();
      if (!CheckRentedHostName(name).ok()) {
        return FieldError(file, "providers." + EscapeForTerminal(name),
                          "a profile name is letters, digits, '.', '_' and '-', starting with a letter");
      }
      auto it = std::find_if(profiles.begin(), profiles.end(), [&](const auto& p) { return p.name == name; });
      const std::string builtin_url = it == profiles.end() ? "" : it->api_url;
      if (it == profiles.end()) {
        profiles.push_back(ProviderProfile{});
        profiles.back().name = name;
        key_envs.emplace_back();
        it = profiles.end() - 1;
      }
      std::string& key_env = key_envs[it - profiles.begin()];
      SFT_RETURN_IF_ERROR(ApplyEntry(file, name, entry, &*it, &key_env));
      SFT_RETURN_IF_ERROR(CheckWhereTheKeyGoes(file, name, *it, builtin_url, key_env));
    }
  }
  for (size_t i = 0; i < profiles.size(); ++i) {
    SFT_ASSIGN_OR_RETURN(profiles[i].api_key, FindKey(dir, profiles[i].name, key_envs[i]));
  }
  return profiles;
}

StatusOr<ProviderProfile> FindProviderProfile(const std::string& name, const ProviderConfig& config) {
  SFT_ASSIGN_OR_RETURN(std::vector<ProviderProfile> profiles, LoadProviderProfiles(config));
  std::string known;
  for (const auto& p : profiles) {
    if (p.name != name) {
      known += (known.empty() ? "" : ", ") + p.name;
      continue;
    }
    if (p.api_key.empty()) {
      return FailedPreconditionError(name + ": no API key: set " + DefaultKeyVariable(name) +
                                     " (or the profile's api_key_env), or write the key to " +
                                     ConfigDir(config) + "/keys/" + name + " (mode 0600)");
    }
    return p;
  }
  return NotFoundError("no provider '" + EscapeForTerminal(name) + "' (known: " + known + "; more in " +
                       ConfigDir(config) + "/providers.json)");
}

StatusOr<std::vector<ProviderProfile>> ConfiguredProviderProfiles(const ProviderConfig& config) {
  SFT_ASSIGN_OR_RETURN(std::vector<ProviderProfile> profiles, LoadProviderProfiles(config));
  std::vector<ProviderProfile> out;
  for (auto& p : profiles) {
    if (!p.api_key.empty()) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace sftctl::client::cloud
