#include "client/ssh/ssh_config.h"

#include <cctype>
#include <fstream>
#include <sstream>

namespace sftctl::client::ssh {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<int> ParsePort(const std::string& s) {
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  int p = std::stoi(s);
  if (p < 1 || p > 65535) return std::nullopt;
  return p;
}

// Splits a config line into keyword and arguments: "Key value", "Key=value", "Key = value"; double
// quotes group an argument. Returns false for blank and comment lines.
bool SplitLine(const std::string& line, std::string* key, std::vector<std::string>* args) {
  size_t i = line.find_first_not_of(" \t\r");
  if (i == std::string::npos || line[i] == '#') return false;
  size_t k = i;
  while (k < line.size() && !std::isspace(static_cast<unsigned char>(line[k])) && line[k] != '=') ++k;
  *key = Lower(line.substr(i, k - i));
  // Skip separators: whitespace and at most one '='.
  while (k < line.size() && std::isspace(static_cast<unsigned char>(line[k]))) ++k;
  if (k < line.size() && line[k] == '=') ++k;
  args->clear();
  std::string cur;
  bool in_quotes = false, have = false;
  for (; k < line.size(); ++k) {
    char c = line[k];
    if (c == '"') {
      in_quotes = !in_quotes;
      have = true;
    } else if (!in_quotes && std::isspace(static_cast<unsigned char>(c))) {
      if (have) args->push_back(cur);
      cur.clear();
      have = false;
    } else if (!in_quotes && c == '#' && !have) {
      break;  // trailing comment
    } else {
      cur += c;
      have = true;
    }
  }
  if (have) args->push_back(cur);
  return !key->empty();
}

bool MatchAt(const char* p, const char* s) {
  for (;;) {
    if (*p == '\0') return *s == '\0';
    if (*p == '*') {
      while (*p == '*') ++p;
      if (*p == '\0') return true;
      for (; *s; ++s) {
        if (MatchAt(p, s)) return true;
      }
      return false;
    }
    if (*s == '\0') return false;
    if (*p != '?' &&
        std::tolower(static_cast<unsigned char>(*p)) != std::tolower(static_cast<unsigned char>(*s))) {
      return false;
    }
    ++p;
    ++s;
  }
}

// A Host line matches when some pattern matches and no negated pattern does.
bool HostLineMatches(const std::vector<std::string>& patterns, const std::string& alias) {
  bool matched = false;
  for (const auto& pat : patterns) {
    if (!pat.empty() && pat[0] == '!') {
      if (MatchHostPattern(pat.substr(1), alias)) return false;
    } else if (MatchHostPattern(pat, alias)) {
      matched = true;
    }
  }
  return matched;
}

}  // namespace

std::string ExpandTilde(const std::string& path, const std::string& home) {
  if (path == "~") return home;
  if (path.rfind("~/", 0) == 0) return home + path.substr(1);
  if (path.rfind("%d/", 0) == 0) return home + path.substr(2);
  return path;
}

bool MatchHostPattern(const std::string& pattern, const std::string& host) {
  return MatchAt(pattern.c_str(), host.c_str());
}

StatusOr<HostSpec> ParseHostSpec(const std::string& spec) {
  HostSpec out;
  std::string rest = spec;
  size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    out.user = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (out.user.empty()) return InvalidArgumentError("host \"" + spec + "\": empty user before '@'");
  }
  std::string port;
  if (!rest.empty() && rest[0] == '[') {
    size_t close = rest.find(']');
    if (close == std::string::npos) return InvalidArgumentError("host \"" + spec + "\": missing ']'");
    out.host = rest.substr(1, close - 1);
    std::string tail = rest.substr(close + 1);
    if (!tail.empty()) {
      if (tail[0] != ':') return InvalidArgumentError("host \"" + spec + "\": expected ':port' after ']'");
      port = tail.substr(1);
      if (port.empty()) return InvalidArgumentError("host \"" + spec + "\": empty port");
    }
  } else {
    size_t colon = rest.find(':');
    if (colon != std::string::npos && rest.find(':', colon + 1) == std::string::npos) {
      out.host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
      if (port.empty()) return InvalidArgumentError("host \"" + spec + "\": empty port");
    } else {
      out.host = rest;  // no colon, or a bare IPv6 address
    }
  }
  if (out.host.empty()) return InvalidArgumentError("host \"" + spec + "\": empty host name");
  if (!port.empty()) {
    out.port = ParsePort(port);
    if (!out.port) return InvalidArgumentError("host \"" + spec + "\": bad port \"" + port + "\" (1..65535)");
  }
  return out;
}

StatusOr<SshConfigEntry> LookupSshConfig(const std::string& config_text, const std::string& alias,
                                         const std::string& home, const std::string& source) {
  SshConfigEntry e;
  std::istringstream in(config_text);
  std::string line, key;
  std::vector<std::string> args;
  bool active = true;  // options before the first Host line apply to every host
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!SplitLine(line, &key, &args)) continue;
    if (key == "host") {
      active = HostLineMatches(args, alias);
      continue;
    }
    if (key == "match") {
      active = false;  // unsupported: skip the block
      continue;
    }
    if (!active || args.empty()) continue;
    if (key == "hostname") {
      if (e.hostname.empty()) e.hostname = args[0];
    } else if (key == "user") {
      if (e.user.empty()) e.user = args[0];
    } else if (key == "port") {
      if (!e.port) {
        e.port = ParsePort(args[0]);
        if (!e.port) {
          return InvalidArgumentError(source + ":" + std::to_string(lineno) + ": bad Port \"" + args[0] +
                                      "\"");
        }
      }
    } else if (key == "identityfile") {
      std::string path = ExpandTilde(args[0], home);
      bool dup = false;
      for (const auto& p : e.identity_files) dup |= p == path;
      if (!dup) e.identity_files.push_back(path);
    }
  }
  // %h in HostName stands for the alias.
  if (size_t p = e.hostname.find("%h"); p != std::string::npos) e.hostname.replace(p, 2, alias);
  return e;
}

std::string ResolvedHost::Display() const { return user + "@" + hostname + ":" + std::to_string(port); }

StatusOr<ResolvedHost> ResolveHost(const std::string& spec, const std::string& config_file,
                                   const std::string& home, const std::string& local_user) {
  SFT_ASSIGN_OR_RETURN(HostSpec hs, ParseHostSpec(spec));
  std::string text;
  if (!config_file.empty()) {
    std::ifstream f(config_file);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    }
  }
  SFT_ASSIGN_OR_RETURN(SshConfigEntry e, LookupSshConfig(text, hs.host, home, config_file));
  ResolvedHost r;
  r.alias = hs.host;
  r.hostname = e.hostname.empty() ? hs.host : e.hostname;
  r.user = !hs.user.empty() ? hs.user : !e.user.empty() ? e.user : local_user;
  r.port = hs.port ? *hs.port : e.port ? *e.port : 22;
  r.identity_files = e.identity_files;
  return r;
}

}  // namespace sftctl::client::ssh
