// known_hosts verification and recording (OpenSSH file format, plain and hashed "|1|" entries, the
// "[host]:port" form for ports other than 22), on top of libssh2's knownhost API.
//
// Thread safety: functions take a session and must run on the thread that owns it.
#pragma once

#include <libssh2.h>

#include <string>

#include "common/status.h"

namespace sftctl::client::ssh {

// The server's host key, as presented during the handshake.
struct HostKey {
  std::string blob;         // SSH wire format
  int libssh2_type = 0;     // LIBSSH2_HOSTKEY_TYPE_*
  std::string type_name;    // "ssh-ed25519", ...
  std::string fingerprint;  // "SHA256:..."
};

// REQUIRES: the handshake of `session` is done. INTERNAL if libssh2 has no host key.
StatusOr<HostKey> SessionHostKey(LIBSSH2_SESSION* session);

enum class HostKeyState {
  kMatch,           // a known_hosts entry for the host holds this key
  kMismatch,        // the host is known with a different key of the same type: possible MITM
  kOtherTypeKnown,  // the host is known, but only with keys of other types
  kUnknown,         // the host has no entry
  kRevoked,         // an "@revoked" line names this key: refused for every host, always
};

// "host" for port 22, else "[host]:port" (how OpenSSH names the host in known_hosts).
std::string KnownHostsName(const std::string& host, int port);

// Checks `key` for host:port against `file` (a missing file means no entries). Lines libssh2 cannot
// parse (e.g. @cert-authority, sk- keys) are skipped, not fatal. "@revoked" lines are read here
// (libssh2 1.10 cannot): a key they name is kRevoked whatever host pattern the line gives.
StatusOr<HostKeyState> CheckKnownHost(LIBSSH2_SESSION* session, const std::string& file,
                                      const std::string& host, int port, const HostKey& key);

// Appends an entry for host:port to `file`, creating its folder with mode 0700 (and the file with
// 0600) when missing. The entry is hashed ("|1|salt|HMAC-SHA1", as HashKnownHosts writes it) when
// the file already holds hashed entries, so recording a host does not reveal it; plain otherwise.
Status AddKnownHost(LIBSSH2_SESSION* session, const std::string& file, const std::string& host, int port,
                    const HostKey& key);

}  // namespace sftctl::client::ssh
