#include "client/remote/ssh/ssh_transport.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/os/fd_util.h"

namespace sftctl::client::ssh {
namespace {

using SteadyClock = std::chrono::steady_clock;

class FdTransport : public SshTransport {
 public:
  FdTransport(int fd, std::vector<std::string> hops) : fd_(fd), hops_(std::move(hops)) {}
  ~FdTransport() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const override { return fd_; }
  std::vector<std::string> Hops() const override { return hops_; }

 private:
  int fd_;
  std::vector<std::string> hops_;
};

// connect() on a non-blocking socket, waiting until `deadline`. Returns 0 or -1 with errno set
// (ETIMEDOUT when the deadline passed).
int ConnectBy(int fd, const addrinfo* a, SteadyClock::time_point deadline) {
  int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
  if (rc == 0 || errno != EINPROGRESS) return rc;
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count());
  pollfd p{fd, POLLOUT, 0};
  rc = ms > 0 ? ::poll(&p, 1, ms) : 0;
  if (rc == 0) {
    errno = ETIMEDOUT;
    return -1;
  }
  if (rc < 0) return -1;
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
  errno = err;
  return err == 0 ? 0 : -1;
}

}  // namespace

std::unique_ptr<SshTransport> AdoptFd(int fd, std::vector<std::string> hops) {
  return std::make_unique<FdTransport>(fd, std::move(hops));
}

StatusOr<std::unique_ptr<SshTransport>> ConnectTcp(const std::string& host, int port, int timeout_ms,
                                                   const std::string& display) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_s.c_str(), &hints, &res); rc != 0) {
    return UnavailableError(display + ": cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  const auto deadline = SteadyClock::now() + std::chrono::milliseconds(timeout_ms);
  std::string last = "no address";
  bool timed_out = false;
  int connected = -1;
  for (addrinfo* a = res; a != nullptr && connected < 0; a = a->ai_next) {
    StatusOr<int> sock =
        MakeSocket(a->ai_family, a->ai_socktype, a->ai_protocol, FdFlags{/*nonblocking=*/true});
    if (!sock.ok()) continue;
    if (ConnectBy(*sock, a, deadline) == 0) {
      connected = *sock;
      break;
    }
    timed_out |= errno == ETIMEDOUT;
    last = std::strerror(errno);
    ::close(*sock);
  }
  ::freeaddrinfo(res);
  if (connected < 0) {
    std::string msg = display + ": cannot connect to " + host + " port " + port_s + ": " + last;
    return timed_out ? DeadlineExceededError(msg) : UnavailableError(msg);
  }
  int one = 1;
  ::setsockopt(connected, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(connected, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  return AdoptFd(connected);
}

}  // namespace sftctl::client::ssh
