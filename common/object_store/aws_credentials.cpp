#include "common/object_store/aws_credentials.h"

#include <cstdlib>
#include <fstream>
#include <map>

namespace sftctl {

namespace {

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// The key = value pairs of one [section] of an INI file, with each key's line number.
struct IniSection {
  bool found = false;
  std::map<std::string, std::pair<std::string, int>> values;
};

StatusOr<IniSection> ReadIniSection(const std::string& path, const std::string& section) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot be read");
  IniSection out;
  bool inside = false;
  int line_no = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++line_no;
    const std::string line = Trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[') {
      if (line.back() != ']')
        return InvalidArgumentError(path + ":" + std::to_string(line_no) + ": unterminated [section]");
      inside = Trim(line.substr(1, line.size() - 2)) == section;
      out.found = out.found || inside;
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      if (!inside) continue;  // other sections' syntax is not ours to judge
      return InvalidArgumentError(path + ":" + std::to_string(line_no) + ": expected 'name = value' in [" +
                                  section + "]");
    }
    if (inside) out.values[Trim(line.substr(0, eq))] = {Trim(line.substr(eq + 1)), line_no};
  }
  return out;
}

StatusOr<AwsCredentials> FromFile(const EnvLookup& env) {
  const std::optional<std::string> profile_env = env("AWS_PROFILE");
  const std::string profile = profile_env && !profile_env->empty() ? *profile_env : "default";
  std::string path;
  if (auto f = env("AWS_SHARED_CREDENTIALS_FILE"); f && !f->empty()) {
    path = *f;
  } else if (auto home = env("HOME"); home && !home->empty()) {
    path = *home + "/.aws/credentials";
  }
  const std::string looked =
      "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a "
      "profile in " +
      (path.empty() ? std::string("~/.aws/credentials") : path);
  if (path.empty() || !std::ifstream(path)) return NotFoundError(looked);
  SFT_ASSIGN_OR_RETURN(IniSection sec, ReadIniSection(path, profile));
  if (!sec.found) {
    if (!profile_env) return NotFoundError(looked);
    return NotFoundError(path + ": no profile [" + profile + "] (AWS_PROFILE)");
  }
  AwsCredentials c;
  c.source = path + " [" + profile + "]";
  auto get = [&](const char* k) { return sec.values.count(k) ? sec.values[k].first : std::string(); };
  c.access_key_id = get("aws_access_key_id");
  c.secret_access_key = get("aws_secret_access_key");
  c.session_token = get("aws_session_token");
  if (c.access_key_id.empty() != c.secret_access_key.empty())
    return InvalidArgumentError(path + ": profile [" + profile +
                                "]: aws_access_key_id and aws_secret_access_key must both be set");
  if (c.empty()) return NotFoundError(path + ": profile [" + profile + "] has no aws_access_key_id");
  return c;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<AwsCredentials> LoadAwsCredentials(const EnvLookup& env) {
  const std::string key = env("AWS_ACCESS_KEY_ID").value_or("");
  const std::string secret = env("AWS_SECRET_ACCESS_KEY").value_or("");
  if (!key.empty() || !secret.empty()) {
    if (key.empty() || secret.empty())
      return InvalidArgumentError("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must both be set");
    return AwsCredentials{key, secret, env("AWS_SESSION_TOKEN").value_or(""), "environment"};
  }
  return FromFile(env);
}

std::string RegionFromEnv(const EnvLookup& env) {
  if (auto r = env("AWS_REGION"); r && !r->empty()) return *r;
  return env("AWS_DEFAULT_REGION").value_or("");
}

std::string EndpointFromEnv(const EnvLookup& env) {
  if (auto e = env("AWS_ENDPOINT_URL_S3"); e && !e->empty()) return *e;
  return env("AWS_ENDPOINT_URL").value_or("");
}

}  // namespace sftctl
