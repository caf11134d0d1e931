#include "agent/serving/auth.h"

#include <fcntl.h>
#include <grpcpp/server_context.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/agent_identity.h"
#include "common/os/file_system.h"

namespace sftctl::agent {
namespace {
std::string ModeString(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}
}  // namespace

StatusOr<std::string> LoadOrCreateToken(const std::string& path) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      struct stat st;
      if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        return ErrnoError("cannot stat", path, err);
      }
      ::close(fd);
      if ((st.st_mode & 077) != 0) {
        return PermissionDeniedError("token file '" + path + "' is accessible by group/others (mode " +
                                     ModeString(st.st_mode) + "); chmod 600 it");
      }
      if (st.st_uid != ::geteuid())
        return PermissionDeniedError("token file '" + path + "' has another owner");
      SFT_ASSIGN_OR_RETURN(std::string token, FileSystem::Default()->ReadFile(path));
      while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
      if (token.size() < 32) return FailedPreconditionError("token file '" + path + "' is too short");
      return token;
    }
    if (errno != ENOENT) return ErrnoError("cannot open", path, errno);
    unsigned char raw[32];
    if (RAND_bytes(raw, sizeof(raw)) != 1) return InternalError("RAND_bytes failed");
    static const char kHex[] = "0123456789abcdef";
    std::string token;
    for (unsigned char c : raw) {
      token.push_back(kHex[c >> 4]);
      token.push_back(kHex[c & 15]);
    }
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;  // another agent won the race: read its token
      return ErrnoError("cannot create", path, errno);
    }
    std::string line = token + "\n";
    bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) && ::fsync(fd) == 0;
    int err = errno;
    ::close(fd);
    if (!ok) {
      ::unlink(path.c_str());
      return ErrnoError("cannot write", path, err);
    }
    return token;
  }
  return InternalError("cannot create token file '" + path + "'");
}

Status Authenticator::Check(const rpc::ServerContextBase& ctx) const {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return CheckHeader("", false);
  return CheckHeader(std::string(it->second.data(), it->second.size()), true);
}

Status Authenticator::CheckHeader(const std::string& value, bool present) const {
  if (!present) return UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  static const std::string kPrefix = "Bearer ";
  if (value.compare(0, kPrefix.size(), kPrefix) != 0) {
    return UnauthenticatedError("authorization metadata must be 'Bearer <token>'");
  }
  std::string given = value.substr(kPrefix.size());
  if (given.size() != token_.size() || CRYPTO_memcmp(given.data(), token_.data(), token_.size()) != 0) {
    return UnauthenticatedError("wrong bearer token");
  }
  return OkStatus();
}

std::string Authenticator::Prove(const std::string& addr, const std::string& challenge) const {
  return AgentIdentityProof(token_, addr, challenge);
}

}  // namespace sftctl::agent
