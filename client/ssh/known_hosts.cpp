#include "client/ssh/known_hosts.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>

#include "client/ssh/ssh_keys.h"

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
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
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
  KnownHostsPtr kh(libssh2_knownhost_init(session));
  if (!kh) return InternalError("libssh2_knownhost_init failed");
  std::string name = KnownHostsName(host, port);
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
  std::string data(buf, len);
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
