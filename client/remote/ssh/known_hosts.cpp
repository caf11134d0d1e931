#include "client/remote/ssh/known_hosts.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "client/remote/ssh/ssh_keys.h"

namespace sftctl::client::ssh {
namespace {

struct KnownHostsDeleter {
  void operator()(LIBSSH2_KNOWNHOSTS* k) const { libssh2_knownhost_free(k); }
};
using KnownHostsPtr = std::unique_ptr<LIBSSH2_KNOWNHOSTS, KnownHostsDeleter>;

int KnownHostKeyBits(int hostkey_type) {
  switch (hostkey_type) {
    case LIBSSH2_HOSTKEY_TYPE_RSA:
      return LIBSSH2_KNOWNHOST_KEY_SSHRSA;
    case LIBSSH2_HOSTKEY_TYPE_DSS:
      return LIBSSH2_KNOWNHOST_KEY_SSHDSS;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_256:
      return LIBSSH2_KNOWNHOST_KEY_ECDSA_256;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_384:
      return LIBSSH2_KNOWNHOST_KEY_ECDSA_384;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_521:
      return LIBSSH2_KNOWNHOST_KEY_ECDSA_521;
    case LIBSSH2_HOSTKEY_TYPE_ED25519:
      return LIBSSH2_KNOWNHOST_KEY_ED25519;
    default:
      return LIBSSH2_KNOWNHOST_KEY_UNKNOWN;
  }
}

int Check(LIBSSH2_KNOWNHOSTS* kh, const std::string& host, int port, const HostKey& key, int key_bits) {
  return libssh2_knownhost_checkp(kh, host.c_str(), port, key.blob.data(), key.blob.size(),
                                  LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | key_bits,
                                  nullptr);
}

// The lines of `file` that are entries (not blank, not comments); none for a missing file.
std::vector<std::string> EntryLines(const std::string& file) {
  std::vector<std::string> lines;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    lines.push_back(line.substr(start));
  }
  return lines;
}

// "@revoked <hosts> <type> <base64 key>" naming `key`.
bool RevokedBy(const std::string& line, const std::string& key_b64) {
  std::istringstream ss(line);
  std::string marker, hosts, type, b64;
  ss >> marker >> hosts >> type >> b64;
  return marker == "@revoked" && b64 == key_b64;
}

// A hashed entry ("|1|<salt>|<hash> ...") whose hash is not a SHA-1 digest: it can match no host,
// and libssh2 1.10 leaks an HMAC context every time it checks a host against one.
bool IsMalformedHashedEntry(const std::string& line) {
  if (line.rfind("|1|", 0) != 0) return false;
  const size_t end = line.find_first_of(" \t");
  const size_t bar = line.find('|', 3);
  if (bar == std::string::npos || bar >= end) return true;
  auto hash =
      Base64Decode(line.substr(bar + 1, end == std::string::npos ? std::string::npos : end - bar - 1));
  return !hash.ok() || hash->size() != 20;
}

// "|1|<base64 salt>|<base64 HMAC-SHA1(salt, name)>", OpenSSH's hashed host name.
StatusOr<std::string> HashedName(const std::string& name) {
  unsigned char salt[20];
  if (RAND_bytes(salt, sizeof(salt)) != 1)
    return InternalError("no random bytes for a hashed known_hosts entry");
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (HMAC(EVP_sha1(), salt, sizeof(salt), reinterpret_cast<const unsigned char*>(name.data()), name.size(),
           mac, &mac_len) == nullptr) {
    return InternalError("cannot hash a known_hosts entry");
  }
  return "|1|" + Base64Encode(std::string_view(reinterpret_cast<const char*>(salt), sizeof(salt))) + "|" +
         Base64Encode(std::string_view(reinterpret_cast<const char*>(mac), mac_len));
}

// The line to append for `name`: hashed when the file already uses hashed entries.
StatusOr<std::string> EntryLine(LIBSSH2_SESSION* session, const std::string& file, const std::string& name,
                                const HostKey& key) {
  bool hashed = false;
  for (const auto& l : EntryLines(file)) hashed |= l.rfind("|1|", 0) == 0;
  if (hashed) {
    SFT_ASSIGN_OR_RETURN(std::string host, HashedName(name));
    return host + " " + key.type_name + " " + Base64Encode(key.blob) + "\n";
  }
  KnownHostsPtr kh(libssh2_knownhost_init(session));
  if (!kh) return InternalError("libssh2_knownhost_init failed");
  libssh2_knownhost* entry = nullptr;
  if (libssh2_knownhost_addc(
          kh.get(), name.c_str(), nullptr, key.blob.data(), key.blob.size(), nullptr, 0,
          LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW | KnownHostKeyBits(key.libssh2_type),
          &entry) != 0) {
    return InternalError("cannot make a known_hosts entry for " + name);
  }
  char buf[8192];
  size_t len = 0;
  if (libssh2_knownhost_writeline(kh.get(), entry, buf, sizeof(buf), &len, LIBSSH2_KNOWNHOST_FILE_OPENSSH) !=
      0) {
    return InternalError("cannot format a known_hosts entry for " + name);
  }
  return std::string(buf, len);
}

}  // namespace

std::string KnownHostsName(const std::string& host, int port) {
  return port == 22 ? host : "[" + host + "]:" + std::to_string(port);
}

StatusOr<HostKey> SessionHostKey(LIBSSH2_SESSION* session) {
  size_t len = 0;
  int type = 0;
  const char* blob = libssh2_session_hostkey(session, &len, &type);
  if (blob == nullptr || len == 0) return InternalError("the server sent no host key");
  HostKey k;
  k.blob.assign(blob, len);
  k.libssh2_type = type;
  k.type_name = KeyTypeOfBlob(k.blob);
  const char* digest = libssh2_hostkey_hash(session, LIBSSH2_HOSTKEY_HASH_SHA256);
  if (digest == nullptr) return InternalError("libssh2 cannot hash the host key");
  k.fingerprint = FingerprintFromDigest(std::string_view(digest, 32));
  return k;
}

StatusOr<HostKeyState> CheckKnownHost(LIBSSH2_SESSION* session, const std::string& file,
                                      const std::string& host, int port, const HostKey& key) {
  KnownHostsPtr kh(libssh2_knownhost_init(session));
  if (!kh) return InternalError("libssh2_knownhost_init failed");
  const std::string key_b64 = Base64Encode(key.blob);
  for (const std::string& line : EntryLines(file)) {
    if (RevokedBy(line, key_b64)) return HostKeyState::kRevoked;
    if (IsMalformedHashedEntry(line)) continue;
    // One line at a time, so an entry libssh2 1.10 cannot parse does not hide the others.
    (void)libssh2_knownhost_readline(kh.get(), line.data(), line.size(), LIBSSH2_KNOWNHOST_FILE_OPENSSH);
  }
  int rc = Check(kh.get(), host, port, key, KnownHostKeyBits(key.libssh2_type));
  switch (rc) {
    case LIBSSH2_KNOWNHOST_CHECK_MATCH:
      return HostKeyState::kMatch;
    case LIBSSH2_KNOWNHOST_CHECK_MISMATCH:
      return HostKeyState::kMismatch;
    case LIBSSH2_KNOWNHOST_CHECK_NOTFOUND:
      // Key type 0 matches entries of any type: a "mismatch" then means the host is known with
      // other key types only.
      if (Check(kh.get(), host, port, key, 0) == LIBSSH2_KNOWNHOST_CHECK_MISMATCH) {
        return HostKeyState::kOtherTypeKnown;
      }
      return HostKeyState::kUnknown;
    default:
      return InternalError("checking " + file + " failed");
  }
}

Status AddKnownHost(LIBSSH2_SESSION* session, const std::string& file, const std::string& host, int port,
                    const HostKey& key) {
  SFT_ASSIGN_OR_RETURN(std::string data, EntryLine(session, file, KnownHostsName(host, port), key));
  size_t slash = file.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    std::string dir = file.substr(0, slash);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return ErrnoError("cannot create", dir, errno);
    }
  }
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot open", file, errno);
  // Make sure the new entry starts on its own line.
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) {
    char last = '\n';
    int rfd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (rfd >= 0) {
      if (::pread(rfd, &last, 1, st.st_size - 1) != 1) last = '\n';
      ::close(rfd);
    }
    if (last != '\n') data.insert(0, "\n");
  }
  ssize_t n = ::write(fd, data.data(), data.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(data.size())) return ErrnoError("cannot write", file, err);
  return OkStatus();
}

}  // namespace sftctl::client::ssh
