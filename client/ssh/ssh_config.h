// Host specs ("[user@]host[:port]") and the subset of ~/.ssh/config that sftctl honours: Host blocks
// (patterns with * and ?, negation with !), HostName, User, Port and IdentityFile. Like OpenSSH, the
// first value obtained for an option wins; IdentityFile accumulates (every matching one is tried, in
// order). Match blocks and Include are ignored (their options are skipped). Pure functions, thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client::ssh {

// What the user typed. `port` is unset when the spec had none.
struct HostSpec {
  std::string user;  // empty: none given
  std::string host;  // a name, an address, or an ssh config alias; IPv6 literals as "[::1]:port"
  std::optional<int> port;
};

// Parses "[user@]host[:port]" and "[user@][v6addr]:port". INVALID_ARGUMENT on an empty host or a bad
// port (not 1..65535).
StatusOr<HostSpec> ParseHostSpec(const std::string& spec);

// OpenSSH's pattern match: '*' any run of characters, '?' one character; case-insensitive like
// OpenSSH's host matching.
bool MatchHostPattern(const std::string& pattern, const std::string& host);

// The options found for a host in an ssh config. Unset options are empty/nullopt.
struct SshConfigEntry {
  std::string hostname;
  std::string user;
  std::optional<int> port;
  std::vector<std::string> identity_files;  // ~ expanded against the given home
};

// Applies the config text to `alias` (first obtained value wins). `home` expands a leading "~/" (and
// "%d") in IdentityFile. INVALID_ARGUMENT "<source>:<line>: ..." on a malformed Port.
StatusOr<SshConfigEntry> LookupSshConfig(const std::string& config_text, const std::string& alias,
                                         const std::string& home, const std::string& source = "ssh config");

// Where to connect, after the spec and the config are combined: the spec's user/port win over the
// config's; defaults are the local user name and port 22.
struct ResolvedHost {
  std::string alias;     // the host part as typed
  std::string hostname;  // what to connect to (HostName, else the alias)
  std::string user;
  int port = 22;
  std::vector<std::string> identity_files;  // from the config, in order
  std::string Display() const;              // "user@hostname:port"
};

// Reads `config_file` (a missing file means no config) and resolves `spec` through it.
StatusOr<ResolvedHost> ResolveHost(const std::string& spec, const std::string& config_file,
                                   const std::string& home, const std::string& local_user);

// "~" and "~/x" → home + "/x"; other paths unchanged.
std::string ExpandTilde(const std::string& path, const std::string& home);

}  // namespace sftctl::client::ssh
