// Host specs ("[user@]host[:port]") and the subset of ~/.ssh/config that sftctl honours, with OpenSSH's
// semantics (man ssh_config):
//   * Host blocks (patterns with * and ?, negation with !);
//   * Match blocks with the criteria host, originalhost, user, localuser and all (comma-separated
//     pattern lists, every criterion must hold). Criteria that need a command or state sftctl does not
//     have (exec, canonical, final, localnetwork, tagged, ...) make the block skipped with a warning:
//     sftctl never runs commands from a config silently;
//   * Include (several paths, globs, "~", paths relative to ~/.ssh, nesting up to 16 deep; inside a
//     Host or Match block an Include applies under that block's condition);
//   * host and user names as typed are checked with OpenSSH's rules (CheckHostName, CheckUserName);
//   * HostName (%h, %%), User, Port, IdentityFile (accumulates), ProxyJump ("[user@]host[:port]" or
//     "ssh://...", comma-separated chains, "none") and ProxyCommand (%h %p %r %n %d %u %%, "none").
// Like OpenSSH the first value obtained for an option wins; ProxyJump and ProxyCommand compete: the
// first one seen (including "none") prevents the other. Errors name "file:line". Pure functions apart
// from reading the config and its Includes; thread-safe.
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

// Parses "[user@]host[:port]" and "[user@][v6addr]:port". INVALID_ARGUMENT on an empty host, a bad
// port (not 1..65535), or a host or user name that CheckHostName / CheckUserName refuse.
StatusOr<HostSpec> ParseHostSpec(const std::string& spec);

// OpenSSH's rules (>= 9.6, ssh.c valid_hostname / valid_ruser) for the names a user types, checked
// before any lookup or %-expansion: a host or user name from the command line, a job reference or a
// ProxyJump hop reaches ProxyCommand's shell through %h %n %r, so none may start with '-' or hold a
// control character, whitespace or any of ' ` " $ \ ; & < > | ( ) { } (and ',' in host names).
// INVALID_ARGUMENT naming the host and the character. (Values from the config itself, HostName and
// User, are the user's own and are not checked, as in OpenSSH; ExpandProxyCommand quotes them.)
Status CheckHostName(const std::string& host);
Status CheckUserName(const std::string& user, const std::string& host);

// OpenSSH's pattern match: '*' any run of characters, '?' one character; case-insensitive like
// OpenSSH's host matching.
bool MatchHostPattern(const std::string& pattern, const std::string& host);

// Who asks: the name being looked up and what Match criteria compare against.
struct ConfigQuery {
  std::string alias;       // the host as typed (Host patterns, Match originalhost, %n)
  std::string user;        // the user typed on the command line; empty: none (Match user then sees the
                           // config's User so far, else local_user)
  std::string local_user;  // Match localuser, %u
  std::string home;        // "~", %d, and the folder of relative Include paths (home + "/.ssh")
};

// The options found for a host in an ssh config. Unset options are empty/nullopt.
struct SshConfigEntry {
  std::string hostname;  // %h expanded
  std::string user;
  std::optional<int> port;
  std::vector<std::string> identity_files;  // ~ expanded against the given home
  // ProxyJump / ProxyCommand: set once by whichever comes first ("none" sets neither list nor command).
  bool proxy_set = false;
  std::vector<HostSpec> proxy_jump;   // hops in the order they are contacted
  std::string proxy_command;          // as written, tokens not yet expanded
  std::string proxy_command_origin;   // "file:line" of the ProxyCommand, for token errors
  std::vector<std::string> warnings;  // "file:line: ..." (skipped Match blocks)
};

// Applies the config text to the query (first obtained value wins). INVALID_ARGUMENT "<source>:<line>:
// ..." on a malformed Port, ProxyJump, Match line or Include (nested more than 16 deep, unreadable).
StatusOr<SshConfigEntry> LookupSshConfig(const std::string& config_text, const ConfigQuery& query,
                                         const std::string& source = "ssh config");
// The same with only an alias (no command-line user, local user "").
StatusOr<SshConfigEntry> LookupSshConfig(const std::string& config_text, const std::string& alias,
                                         const std::string& home, const std::string& source = "ssh config");

// Where to connect, after the spec and the config are combined: the spec's user/port win over the
// config's; defaults are the local user name and port 22.
struct ResolvedHost {
  std::string alias;     // the host part as typed
  std::string hostname;  // what to connect to (HostName, else the alias); also the known_hosts name
  std::string user;
  int port = 22;
  std::vector<std::string> identity_files;  // from the config, in order
  std::vector<HostSpec> proxy_jump;         // jump hosts, first contacted first; empty: none
  std::string proxy_command;                // tokens expanded; empty: none
  std::vector<std::string> warnings;        // from the config, for the user
  std::string Display() const;              // "user@hostname:port"
};

// Reads `config_file` (a missing file means no config) and resolves `spec` through it.
StatusOr<ResolvedHost> ResolveHost(const std::string& spec, const std::string& config_file,
                                   const std::string& home, const std::string& local_user);
StatusOr<ResolvedHost> ResolveHostSpec(const HostSpec& spec, const std::string& config_file,
                                       const std::string& home, const std::string& local_user);

// Expands a ProxyCommand's tokens for `host`: %h hostname, %p port, %r user, %n alias, %d home,
// %u local user, %% a percent sign. The result runs as `/bin/sh -c "exec ..."`, so:
//   * a value made only of characters that mean nothing to a shell (A-Z a-z 0-9 . _ - + , : / @ = %)
//     is pasted as it is, like OpenSSH does: `ssh -W %h:%p bastion`, `"%h"` and `sh -c 'nc %h %p'`
//     all keep working;
//   * any other value is pasted as one single-quoted word ('it'\''s') where the token stands outside
//     quotes, command substitutions, `${...}` and backslash escapes; elsewhere it is refused
//     (INVALID_ARGUMENT naming the token), as is a value with a control character.
// INVALID_ARGUMENT "<origin>: ProxyCommand: unknown token ..." for any other token.
StatusOr<std::string> ExpandProxyCommand(const std::string& command, const ResolvedHost& host,
                                         const std::string& home, const std::string& local_user,
                                         const std::string& origin);

// "~" and "~/x" → home + "/x"; other paths unchanged.
std::string ExpandTilde(const std::string& path, const std::string& home);

}  // namespace sftctl::client::ssh
