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
};

// "host" for port 22, else "[host]:port" (how OpenSSH names the host in known_hosts).
std::string KnownHostsName(const std::string& host, int port);

// Checks `key` for host:port against `file` (a missing file means no entries). Lines libssh2 cannot
// parse (e.g. @cert-authority, sk- keys) are skipped, not fatal.
StatusOr<HostKeyState> CheckKnownHost(LIBSSH2_SESSION* session, const std::string& file,
                                      const std::string& host, int port, const HostKey& key);

// Appends a plain entry for host:port to `file`, creating its folder with mode 0700 (and the file
// with 0600) when missing.
Status AddKnownHost(LIBSSH2_SESSION* session, const std::string& file, const std::string& host, int port,
                    const HostKey& key);

}  // namespace sftctl::client::ssh
