#include "client/remote/ssh/ssh_config.h"

#include <glob.h>
#include <sys/stat.h>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string_view>

#include "common/terminal_text.h"

namespace sftctl::client::ssh {
namespace {

constexpr int kMaxIncludeDepth = 16;                 // OpenSSH's limit too
constexpr size_t kMaxConfigBytes = size_t{1} << 20;  // per file: a config, not a data set

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

// One config line: the keyword (lower case), its arguments ("Key value", "Key=value", "Key = value";
// double quotes group an argument) and the raw text after the separator (ProxyCommand takes the rest
// of the line as written).
struct ConfigLine {
  std::string key;
  std::vector<std::string> args;
  std::string raw;
};

// Returns false for blank and comment lines.
bool SplitLine(const std::string& line, ConfigLine* out) {
  size_t i = line.find_first_not_of(" \t\r");
  if (i == std::string::npos || line[i] == '#') return false;
  size_t k = i;
  while (k < line.size() && !std::isspace(static_cast<unsigned char>(line[k])) && line[k] != '=') ++k;
  out->key = Lower(line.substr(i, k - i));
  // Skip separators: whitespace and at most one '='.
  while (k < line.size() && std::isspace(static_cast<unsigned char>(line[k]))) ++k;
  if (k < line.size() && line[k] == '=') ++k;
  while (k < line.size() && std::isspace(static_cast<unsigned char>(line[k]))) ++k;
  out->raw = line.substr(k);
  while (!out->raw.empty() && std::isspace(static_cast<unsigned char>(out->raw.back()))) out->raw.pop_back();
  out->args.clear();
  std::string cur;
  bool in_quotes = false, have = false;
  for (; k < line.size(); ++k) {
    char c = line[k];
    if (c == '"') {
      in_quotes = !in_quotes;
      have = true;
    } else if (!in_quotes && std::isspace(static_cast<unsigned char>(c))) {
      if (have) out->args.push_back(cur);
      cur.clear();
      have = false;
    } else if (!in_quotes && c == '#' && !have) {
      break;  // trailing comment
    } else {
      cur += c;
      have = true;
    }
  }
  if (have) out->args.push_back(cur);
  return !out->key.empty();
}

bool SameChar(char a, char b, bool fold) {
  if (!fold) return a == b;
  return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
}

bool MatchAt(const char* p, const char* s, bool fold) {
  for (;;) {
    if (*p == '\0') return *s == '\0';
    if (*p == '*') {
      while (*p == '*') ++p;
      if (*p == '\0') return true;
      for (; *s; ++s) {
        if (MatchAt(p, s, fold)) return true;
      }
      return false;
    }
    if (*s == '\0') return false;
    if (*p != '?' && !SameChar(*p, *s, fold)) return false;
    ++p;
    ++s;
  }
}

// Some pattern matches and no negated one does (a Host line's patterns, a Match criterion's comma list).
bool PatternsMatch(const std::vector<std::string>& patterns, const std::string& subject, bool fold) {
  bool matched = false;
  for (const auto& pat : patterns) {
    if (!pat.empty() && pat[0] == '!') {
      if (MatchAt(pat.c_str() + 1, subject.c_str(), fold)) return false;
    } else if (MatchAt(pat.c_str(), subject.c_str(), fold)) {
      matched = true;
    }
  }
  return matched;
}

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// HostName's tokens: %h (the alias) and %%.
std::string ExpandHostName(const std::string& value, const std::string& alias) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == '%' && i + 1 < value.size() && (value[i + 1] == 'h' || value[i + 1] == '%')) {
      out += value[i + 1] == 'h' ? alias : "%";
      ++i;
    } else {
      out += value[i];
    }
  }
  return out;
}

// How an error names a character: "'$'", "a space", "a control character (\x1b)".
std::string DescribeChar(unsigned char c) {
  if (c == ' ') return "a space";
  if (std::iscntrl(c) || std::isspace(c)) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "\\x%02x", c);
    return std::string(std::isspace(c) ? "whitespace (" : "a control character (") + hex + ")";
  }
  return std::string("'") + static_cast<char>(c) + "'";
}

// The first character of `name` that OpenSSH's rules refuse, or nullopt; `specials` are the shell
// metacharacters refused anywhere in the name.
std::optional<unsigned char> RefusedChar(const std::string& name, std::string_view specials) {
  for (unsigned char c : name) {
    if (std::iscntrl(c) || std::isspace(c) || specials.find(static_cast<char>(c)) != std::string_view::npos)
      return c;
  }
  return std::nullopt;
}

// Characters that mean nothing to sh in any context (quoted or not, in a nested `sh -c`, ...).
bool ShellInert(const std::string& value) {
  for (unsigned char c : value) {
    if (!std::isalnum(c) &&
        std::string_view("._+,:/@=%-").find(static_cast<char>(c)) == std::string_view::npos)
      return false;
  }
  return true;
}

// Follows the shell quoting of a ProxyCommand's literal text, to tell whether a token stands where a
// single-quoted word means the value and nothing else: outside quotes, not after a backslash or '$',
// and with no command substitution or ${...} before it (those open contexts this scan does not track).
class ShellScan {
 public:
  void Feed(char c) {
    if (quote_ == '\'') {
      if (c == '\'') quote_ = 0;
    } else if (escape_) {
      escape_ = false;
      c = 0;  // an escaped character is literal
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '`' || (prev_ == '$' && (c == '(' || c == '{'))) {
      nested_ = true;
    } else if (c == '"') {
      quote_ = quote_ == '"' ? 0 : '"';
    } else if (c == '\'' && quote_ == 0) {
      quote_ = '\'';
    }
    prev_ = c;
  }
  void FeedValue() { prev_ = 0; }  // what ExpandProxyCommand pastes leaves the quoting as it was
  bool Plain() const { return quote_ == 0 && !escape_ && !nested_ && prev_ != '$'; }

 private:
  char quote_ = 0, prev_ = 0;
  bool escape_ = false, nested_ = false;
};

// One token's value as pasted into the command (see ExpandProxyCommand in the header).
StatusOr<std::string> ShellValue(const std::string& value, char token, const ShellScan& scan,
                                 const std::string& origin) {
  if (ShellInert(value)) return value;
  const std::string shown = "%" + std::string(1, token) + " (\"" + EscapeForTerminal(value) + "\")";
  for (unsigned char c : value) {
    if (std::iscntrl(c)) {
      return InvalidArgumentError(origin + ": ProxyCommand: " + shown + " contains " + DescribeChar(c));
    }
  }
  if (!scan.Plain()) {
    return InvalidArgumentError(origin + ": ProxyCommand: " + shown +
                                " holds characters a shell would interpret, and sftctl quotes such a value "
                                "only where the token stands outside quotes, $(...), `...`, ${...} and "
                                "after no backslash or '$'; write the token there (e.g. `nc %h %p`)");
  }
  std::string out = "'";
  for (char c : value) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A config file's text; nullopt when it does not exist. Anything but a regular file (or /dev/null) and
// files over 1 MiB are errors.
StatusOr<std::optional<std::string>> ReadConfigFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::optional<std::string>();
  if (path == "/dev/null") return std::optional<std::string>(std::string());
  // Only regular files: a FIFO or a terminal would block the lookup.
  if (!S_ISREG(st.st_mode))
    return InvalidArgumentError(path + ": not a regular file, not an ssh config file");
  std::ifstream f(path, std::ios::binary);
  if (!f) return InvalidArgumentError(path + ": cannot be read");
  std::string text(kMaxConfigBytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.size() > kMaxConfigBytes) return InvalidArgumentError(path + ": larger than 1 MiB");
  return std::optional<std::string>(std::move(text));
}

// Match criteria sftctl cannot evaluate: the block is skipped with a warning. The first group takes an
// argument, the second none.
bool IsUnsupportedWithArgument(const std::string& c) {
  return c == "exec" || c == "localnetwork" || c == "tagged" || c == "version" || c == "command" ||
         c == "sessiontype";
}
bool IsUnsupportedAlone(const std::string& c) { return c == "canonical" || c == "final"; }

// One lookup: walks the config and its Includes, filling `entry`.
class ConfigParser {
 public:
  ConfigParser(const ConfigQuery& q, SshConfigEntry* entry) : q_(q), e_(*entry) {}

  Status Parse(const std::string& text, const std::string& source, int depth) {
    std::istringstream in(text);
    std::string line;
    ConfigLine cl;
    bool active = true;  // options before the first Host/Match line apply to every host
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (!SplitLine(line, &cl)) continue;
      const std::string loc = source + ":" + std::to_string(lineno);
      if (cl.key == "host") {
        active = PatternsMatch(cl.args, q_.alias, /*fold=*/true);
      } else if (cl.key == "match") {
        SFT_ASSIGN_OR_RETURN(active, EvalMatch(cl.args, loc));
      } else if (cl.key == "include") {
        if (active) SFT_RETURN_IF_ERROR(Include(cl.args, loc, depth));
      } else if (active) {
        SFT_RETURN_IF_ERROR(Apply(cl, loc));
      }
    }
    return OkStatus();
  }

 private:
  // The target host as it stands now (HostName applied so far), as Match host sees it.
  std::string CurrentHost() const {
    return e_.hostname.empty() ? q_.alias : ExpandHostName(e_.hostname, q_.alias);
  }
  // The remote user as it stands now: the command line's, else the config's so far, else the local one.
  std::string CurrentUser() const {
    return !q_.user.empty() ? q_.user : !e_.user.empty() ? e_.user : q_.local_user;
  }

  StatusOr<bool> EvalMatch(const std::vector<std::string>& args, const std::string& loc) {
    if (args.empty()) return InvalidArgumentError(loc + ": Match needs criteria (e.g. `Match host NAME`)");
    bool matched = true;
    std::string unsupported;
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string c = Lower(args[i]);
      if (c == "all") {
        if (args.size() != 1) {
          return InvalidArgumentError(loc + ": Match all cannot be combined with other criteria");
        }
        continue;
      }
      if (IsUnsupportedAlone(c)) {
        if (unsupported.empty()) unsupported = c;
        continue;
      }
      const bool known = c == "host" || c == "originalhost" || c == "user" || c == "localuser";
      if (!known && !IsUnsupportedWithArgument(c)) {
        return InvalidArgumentError(loc + ": unknown Match criterion '" + args[i] + "'");
      }
      if (i + 1 >= args.size()) return InvalidArgumentError(loc + ": Match " + c + " needs an argument");
      const std::string& value = args[++i];
      if (!known) {
        if (unsupported.empty()) unsupported = c;
        continue;
      }
      const bool is_host = c == "host" || c == "originalhost";
      const std::string subject = c == "host"           ? CurrentHost()
                                  : c == "originalhost" ? q_.alias
                                  : c == "user"         ? CurrentUser()
                                                        : q_.local_user;
      if (!PatternsMatch(SplitCommas(value), subject, /*fold=*/is_host)) matched = false;
    }
    if (matched && !unsupported.empty()) {
      e_.warnings.push_back(
          loc + ": unsupported Match criterion '" + unsupported + "': this Match block is skipped" +
          (unsupported == "exec" ? " (sftctl does not run commands from an ssh config)" : ""));
      return false;
    }
    return matched;
  }

  Status Include(const std::vector<std::string>& args, const std::string& loc, int depth) {
    if (args.empty()) return InvalidArgumentError(loc + ": Include needs a path");
    if (depth >= kMaxIncludeDepth) {
      return InvalidArgumentError(loc + ": Include nested more than " + std::to_string(kMaxIncludeDepth) +
                                  " deep (does a file include itself?)");
    }
    for (const std::string& arg : args) {
      std::string pattern = ExpandTilde(arg, q_.home);
      if (pattern.empty() || pattern[0] != '/') pattern = q_.home + "/.ssh/" + pattern;
      glob_t g{};
      const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);  // sorted: lexical order, like OpenSSH
      if (rc == GLOB_NOMATCH) continue;                        // nothing there: not an error
      std::vector<std::string> files;
      if (rc == 0) files.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      ::globfree(&g);
      if (rc != 0) return InvalidArgumentError(loc + ": Include " + arg + ": cannot list " + pattern);
      for (const std::string& file : files) {
        auto text = ReadConfigFile(file);
        if (!text.ok()) return InvalidArgumentError(loc + ": Include: " + text.status().message());
        if (!text->has_value()) continue;
        SFT_RETURN_IF_ERROR(Parse(**text, file, depth + 1));
      }
    }
    return OkStatus();
  }

  Status ApplyProxyJump(const std::vector<std::string>& args, const std::string& loc) {
    if (args.size() != 1) {
      return InvalidArgumentError(loc + ": ProxyJump takes one comma-separated list without spaces");
    }
    if (Lower(args[0]) == "none") return OkStatus();
    for (std::string hop : SplitCommas(args[0])) {
      if (hop.rfind("ssh://", 0) == 0) hop = hop.substr(6);
      if (!hop.empty() && hop.back() == '/') hop.pop_back();
      auto spec = ParseHostSpec(hop);
      if (!spec.ok()) return InvalidArgumentError(loc + ": ProxyJump: " + spec.status().message());
      e_.proxy_jump.push_back(*spec);
    }
    return OkStatus();
  }

  Status Apply(const ConfigLine& cl, const std::string& loc) {
    const auto& args = cl.args;
    if (args.empty()) return OkStatus();
    if (cl.key == "hostname") {
      if (e_.hostname.empty()) e_.hostname = args[0];
    } else if (cl.key == "user") {
      if (e_.user.empty()) e_.user = args[0];
    } else if (cl.key == "port") {
      if (e_.port) return OkStatus();
      e_.port = ParsePort(args[0]);
      if (!e_.port) return InvalidArgumentError(loc + ": bad Port \"" + args[0] + "\"");
    } else if (cl.key == "identityfile") {
      std::string path = ExpandTilde(args[0], q_.home);
      bool dup = false;
      for (const auto& p : e_.identity_files) dup |= p == path;
      if (!dup) e_.identity_files.push_back(path);
    } else if (cl.key == "proxyjump" || cl.key == "proxycommand") {
      if (e_.proxy_set) return OkStatus();  // the first of the two wins, "none" included
      e_.proxy_set = true;
      if (cl.key == "proxyjump") return ApplyProxyJump(args, loc);
      if (Lower(cl.raw) == "none") return OkStatus();
      e_.proxy_command = cl.raw;
      e_.proxy_command_origin = loc;
    }
    return OkStatus();
  }

  const ConfigQuery& q_;
  SshConfigEntry& e_;
};

}  // namespace

std::string ExpandTilde(const std::string& path, const std::string& home) {
  if (path == "~") return home;
  if (path.rfind("~/", 0) == 0) return home + path.substr(1);
  if (path.rfind("%d/", 0) == 0) return home + path.substr(2);
  return path;
}

bool MatchHostPattern(const std::string& pattern, const std::string& host) {
  return MatchAt(pattern.c_str(), host.c_str(), /*fold=*/true);
}

Status CheckHostName(const std::string& host) {
  std::optional<unsigned char> bad;
  if (!host.empty() && host[0] == '-') bad = '-';
  if (!bad) bad = RefusedChar(host, "'`\"$\\;&<>|(){},");
  if (!bad) return OkStatus();
  return InvalidArgumentError(
      "host \"" + EscapeForTerminal(host) + "\" is refused: " +
      (host[0] == '-' ? std::string("it starts with '-'") : "it contains " + DescribeChar(*bad)) +
      " (like OpenSSH, sftctl accepts no shell metacharacters, whitespace or "
      "control characters in a host name)");
}

Status CheckUserName(const std::string& user, const std::string& host) {
  std::optional<unsigned char> bad;
  if (!user.empty() && user[0] == '-') bad = '-';
  if (!bad) bad = RefusedChar(user, "'`\"$\\;&<>|(){}");
  if (!bad) return OkStatus();
  return InvalidArgumentError(
      "user name \"" + EscapeForTerminal(user) + "\" for host \"" + EscapeForTerminal(host) +
      "\" is refused: " +
      (user[0] == '-' ? std::string("it starts with '-'") : "it contains " + DescribeChar(*bad)) +
      " (like OpenSSH, sftctl accepts no shell metacharacters, whitespace or "
      "control characters in a user name)");
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
  if (out.host.empty())
    return InvalidArgumentError("host \"" + EscapeForTerminal(spec) + "\": empty host name");
  SFT_RETURN_IF_ERROR(CheckHostName(out.host));
  if (!out.user.empty()) SFT_RETURN_IF_ERROR(CheckUserName(out.user, out.host));
  if (!port.empty()) {
    out.port = ParsePort(port);
    if (!out.port) return InvalidArgumentError("host \"" + spec + "\": bad port \"" + port + "\" (1..65535)");
  }
  return out;
}

StatusOr<SshConfigEntry> LookupSshConfig(const std::string& config_text, const ConfigQuery& query,
                                         const std::string& source) {
  SshConfigEntry e;
  ConfigParser parser(query, &e);
  SFT_RETURN_IF_ERROR(parser.Parse(config_text, source, /*depth=*/0));
  e.hostname = ExpandHostName(e.hostname, query.alias);
  return e;
}

StatusOr<SshConfigEntry> LookupSshConfig(const std::string& config_text, const std::string& alias,
                                         const std::string& home, const std::string& source) {
  ConfigQuery q;
  q.alias = alias;
  q.home = home;
  return LookupSshConfig(config_text, q, source);
}

std::string ResolvedHost::Display() const { return user + "@" + hostname + ":" + std::to_string(port); }

StatusOr<std::string> ExpandProxyCommand(const std::string& command, const ResolvedHost& host,
                                         const std::string& home, const std::string& local_user,
                                         const std::string& origin) {
  std::string out;
  ShellScan scan;
  for (size_t i = 0; i < command.size(); ++i) {
    if (command[i] != '%') {
      out += command[i];
      scan.Feed(command[i]);
      continue;
    }
    const char t = i + 1 < command.size() ? command[++i] : '\0';
    const std::string* value = nullptr;
    const std::string port = std::to_string(host.port);
    switch (t) {
      case 'h':
        value = &host.hostname;
        break;
      case 'p':
        value = &port;
        break;
      case 'r':
        value = &host.user;
        break;
      case 'n':
        value = &host.alias;
        break;
      case 'd':
        value = &home;
        break;
      case 'u':
        value = &local_user;
        break;
      case '%':
        out += '%';
        scan.Feed('%');
        continue;
      default:
        return InvalidArgumentError(origin + ": ProxyCommand: unknown token '%" + std::string(t ? 1 : 0, t) +
                                    "' (sftctl expands %h %p %r %n %d %u and %%)");
    }
    SFT_ASSIGN_OR_RETURN(std::string pasted, ShellValue(*value, t, scan, origin));
    out += pasted;
    scan.FeedValue();
  }
  return out;
}

StatusOr<ResolvedHost> ResolveHostSpec(const HostSpec& hs, const std::string& config_file,
                                       const std::string& home, const std::string& local_user) {
  // Every path (the command line, a job reference, a ProxyJump hop) comes through here.
  SFT_RETURN_IF_ERROR(CheckHostName(hs.host));
  if (!hs.user.empty()) SFT_RETURN_IF_ERROR(CheckUserName(hs.user, hs.host));
  std::string text;
  if (!config_file.empty()) {
    SFT_ASSIGN_OR_RETURN(std::optional<std::string> read, ReadConfigFile(config_file));
    if (read) text = std::move(*read);
  }
  ConfigQuery q;
  q.alias = hs.host;
  q.user = hs.user;
  q.local_user = local_user;
  q.home = home;
  SFT_ASSIGN_OR_RETURN(SshConfigEntry e, LookupSshConfig(text, q, config_file));
  ResolvedHost r;
  r.alias = hs.host;
  r.hostname = e.hostname.empty() ? hs.host : e.hostname;
  r.user = !hs.user.empty() ? hs.user : !e.user.empty() ? e.user : local_user;
  r.port = hs.port ? *hs.port : e.port ? *e.port : 22;
  r.identity_files = e.identity_files;
  r.proxy_jump = e.proxy_jump;
  r.warnings = e.warnings;
  if (!e.proxy_command.empty()) {
    SFT_ASSIGN_OR_RETURN(r.proxy_command,
                         ExpandProxyCommand(e.proxy_command, r, home, local_user, e.proxy_command_origin));
  }
  return r;
}

StatusOr<ResolvedHost> ResolveHost(const std::string& spec, const std::string& config_file,
                                   const std::string& home, const std::string& local_user) {
  SFT_ASSIGN_OR_RETURN(HostSpec hs, ParseHostSpec(spec));
  return ResolveHostSpec(hs, config_file, home, local_user);
}

}  // namespace sftctl::client::ssh
