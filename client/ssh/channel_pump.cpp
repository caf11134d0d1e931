#include "client/ssh/channel_pump.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/fd_util.h"

namespace sftctl::client::ssh {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr size_t kDownBuf = 1 << 20;  // channel -> gRPC
constexpr size_t kUpBuf = 256 << 10;  // gRPC -> channel
constexpr size_t kStderrTail = 4096;

// A byte buffer drained from the front and filled at the back; compacted when empty.
struct Buffer {
  explicit Buffer(size_t cap) : data(cap) {}
  std::vector<char> data;
  size_t begin = 0, end = 0;
  bool empty() const { return begin == end; }
  size_t room() const { return data.size() - end; }
  char* tail() { return data.data() + end; }
  const char* head() const { return data.data() + begin; }
  size_t size() const { return end - begin; }
  void consume(size_t n) {
    begin += n;
    if (begin == end) begin = end = 0;
  }
};

// True when a small packet (keepalive, window adjust, EOF) can go out without a partial send: the
// socket is writable and its send queue nearly empty. libssh2 resumes a partially sent packet on the
// next send of *any* kind and reports that next packet as sent, so a partial keepalive would silently
// swallow channel data. Where the system cannot count the unsent bytes (SendQueueBytes < 0), POLLOUT
// alone decides: BSD-derived kernels report it only with at least the send low-water mark (2 KiB by
// default) free, more than any of these packets needs.
bool SafeToSendSmall(int fd) {
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLOUT)) return false;
  const long queued = SendQueueBytes(fd);
  return queued < (16 << 10);
}

}  // namespace

StatusOr<std::unique_ptr<ChannelPump>> ChannelPump::Start(std::unique_ptr<SshSession> session,
                                                          LIBSSH2_CHANNEL* channel, bool capture_stderr,
                                                          std::string peer) {
  std::unique_ptr<ChannelPump> p(new ChannelPump());
  p->session_ = std::move(session);
  p->channel_ = channel;
  p->capture_stderr_ = capture_stderr;
  p->peer_ = std::move(peer);
  int sv[2];
  SFT_RETURN_IF_ERROR(MakeSocketPair(AF_UNIX, SOCK_STREAM, sv));
  p->local_fd_ = sv[0];
  p->client_fd_ = sv[1];
  // Large socket buffers: fewer wake-ups per megabyte in both the pump and gRPC.
  int big = 4 << 20;
  ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
  ::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  ::setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
  ::setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  SFT_RETURN_IF_ERROR(SetNonBlocking(sv[0]));
  SFT_ASSIGN_OR_RETURN(p->waker_, Waker::Create());
  p->session_->SetNonBlocking();
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  return p;
}

ChannelPump::~ChannelPump() {
  stop_.store(true);
  if (waker_) waker_->Wake();
  if (thread_.joinable()) thread_.join();
  if (client_fd_ >= 0) ::close(client_fd_);
  if (local_fd_ >= 0) ::close(local_fd_);
}

int ChannelPump::TakeClientFd() {
  int fd = client_fd_;
  client_fd_ = -1;
  return fd;
}

std::string ChannelPump::failure() const {
  std::lock_guard<std::mutex> l(mu_);
  return failure_;
}

std::string ChannelPump::stderr_tail() const {
  std::lock_guard<std::mutex> l(mu_);
  return stderr_tail_;
}

void ChannelPump::Fail(FailureKind kind, const std::string& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (!failure_.empty()) return;
  failure_ = why;
  failure_kind_ = kind;
}

ChannelPump::FailureKind ChannelPump::failure_kind() const {
  std::lock_guard<std::mutex> l(mu_);
  return failure_kind_;
}

void ChannelPump::Run() {
  LIBSSH2_SESSION* s = session_->raw();
  const int sock = session_->socket_fd();
  Buffer down(kDownBuf), up(kUpBuf);
  bool remote_eof = false, local_eof = false, eof_sent = false;
  // A send-type libssh2 call that returned EAGAIN must be repeated before any other send (see
  // SafeToSendSmall).
  enum class Pending { kNone, kWrite, kAdjust, kEof } pending = Pending::kNone;
  const int keepalive_s = session_->keepalive_s();
  auto next_keepalive = SteadyClock::now() + std::chrono::seconds(keepalive_s > 0 ? keepalive_s : 3600);
  auto last_rx = SteadyClock::now();
  // No sign of life from the server for this long while we listen: the connection is dead.
  const auto dead_after = std::chrono::seconds(keepalive_s > 0 ? 3 * keepalive_s + 5 : 1 << 30);
  std::string err;
  FailureKind err_kind = FailureKind::kOther;
  auto connection_lost = [&](const std::string& what) {
    err = "SSH connection lost (" + what + ")";
    err_kind = FailureKind::kConnectionLost;
  };
  long long polls = 0, poll_timeouts = 0, rounds = 0;
  const bool stats = std::getenv("SFTCTL_PUMP_STATS") != nullptr;

  while (!stop_.load()) {
    ++rounds;
    bool progress = false;

    // 1. SSH channel -> buffer: drain until EAGAIN or the buffer is full.
    if (!remote_eof && down.room() > 0) {
      ssize_t n = libssh2_channel_read(channel_, down.tail(), down.room());
      if (n > 0) {
        down.end += static_cast<size_t>(n);
        progress = true;
        last_rx = SteadyClock::now();
      } else if (n == 0 || n == LIBSSH2_ERROR_EAGAIN) {
        if (libssh2_channel_eof(channel_)) remote_eof = true;
      } else {
        connection_lost("reading: " + session_->LastError());
        break;
      }
    }
    if (capture_stderr_) {
      char eb[1024];
      ssize_t n = libssh2_channel_read_stderr(channel_, eb, sizeof(eb));
      if (n > 0) {
        progress = true;
        std::lock_guard<std::mutex> l(mu_);
        stderr_tail_.append(eb, static_cast<size_t>(n));
        if (stderr_tail_.size() > kStderrTail) stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
      }
    }

    // 2. buffer -> gRPC.
    if (!down.empty()) {
      ssize_t w = SendNoSignal(local_fd_, down.head(), down.size(), MSG_DONTWAIT);
      if (w > 0) {
        down.consume(static_cast<size_t>(w));
        progress = true;
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        break;  // gRPC closed its end: we are being torn down
      }
    }

    // 3. gRPC -> buffer.
    if (!local_eof && up.room() > 0) {
      ssize_t r = ::recv(local_fd_, up.tail(), up.room(), MSG_DONTWAIT);
      if (r > 0) {
        up.end += static_cast<size_t>(r);
        progress = true;
      } else if (r == 0) {
        local_eof = true;
        progress = true;
      } else if (errno != EAGAIN && errno != EINTR) {
        local_eof = true;
      }
    }

    // 4. Exactly one send-type libssh2 call per round, repeating a pending one first.
    unsigned long read_avail = 0;
    unsigned long window = libssh2_channel_window_read_ex(channel_, &read_avail, nullptr);
    bool want_adjust = window < SshSession::kWindow / 2;
    if (pending == Pending::kAdjust || (pending == Pending::kNone && want_adjust && SafeToSendSmall(sock))) {
      unsigned int granted = 0;
      int rc = libssh2_channel_receive_window_adjust2(channel_, SshSession::kWindow - window, 1, &granted);
      if (rc == LIBSSH2_ERROR_EAGAIN) {
        pending = Pending::kAdjust;
      } else if (rc < 0) {
        connection_lost("window adjust: " + session_->LastError());
        break;
      } else {
        pending = Pending::kNone;
        progress = true;
      }
    } else if (pending == Pending::kWrite || (pending == Pending::kNone && !up.empty())) {
      ssize_t w = libssh2_channel_write(channel_, up.head(), up.size());
      if (w == LIBSSH2_ERROR_EAGAIN) {
        pending = Pending::kWrite;
      } else if (w < 0) {
        connection_lost("writing: " + session_->LastError());
        break;
      } else {
        pending = Pending::kNone;
        up.consume(static_cast<size_t>(w));
        progress = true;
      }
    } else if (pending == Pending::kEof ||
               (pending == Pending::kNone && local_eof && up.empty() && !eof_sent)) {
      int rc = libssh2_channel_send_eof(channel_);
      if (rc == LIBSSH2_ERROR_EAGAIN) {
        pending = Pending::kEof;
      } else {
        pending = Pending::kNone;
        eof_sent = true;
        progress = true;
      }
    } else if (pending == Pending::kNone && keepalive_s > 0 && SteadyClock::now() >= next_keepalive &&
               SafeToSendSmall(sock)) {
      int next = keepalive_s;
      if (libssh2_keepalive_send(s, &next) < 0) {
        connection_lost("keepalive: " + session_->LastError());
        break;
      }
      next_keepalive = SteadyClock::now() + std::chrono::seconds(std::max(1, next));
    }

    if (remote_eof && down.empty()) {
      err = peer_ + " closed the SSH channel";
      break;
    }
    if (local_eof && eof_sent && remote_eof) break;
    if (progress || (read_avail > 0 && down.room() > 0)) continue;

    // 5. Nothing moved: wait for the SSH socket, the local socket or a stop request.
    auto now = SteadyClock::now();
    if (down.room() == 0) last_rx = now;  // not listening to the server: no liveness verdict
    if (now - last_rx > dead_after) {
      connection_lost(
          "no answer to keepalives for " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - last_rx).count()) + " s");
      break;
    }
    int dirs = libssh2_session_block_directions(s);
    short sev = 0;
    if (down.room() > 0 || (dirs & LIBSSH2_SESSION_BLOCK_INBOUND)) sev |= POLLIN;
    if ((dirs & LIBSSH2_SESSION_BLOCK_OUTBOUND) || pending != Pending::kNone) sev |= POLLOUT;
    short lev = 0;
    if (!down.empty()) lev |= POLLOUT;
    if (!local_eof && up.room() > 0) lev |= POLLIN;
    pollfd fds[3] = {{sock, sev, 0}, {local_fd_, lev, 0}, {waker_->fd(), POLLIN, 0}};
    int timeout_ms = 1000;
    if (keepalive_s > 0) {
      auto until = std::chrono::duration_cast<std::chrono::milliseconds>(next_keepalive - now).count();
      timeout_ms = static_cast<int>(std::max<long long>(10, std::min<long long>(until, 1000)));
    }
    int rc = ::poll(fds, 3, timeout_ms);
    ++polls;
    if (rc == 0) ++poll_timeouts;
    if (rc < 0 && errno != EINTR) {
      err = std::string("poll: ") + std::strerror(errno);
      break;
    }
    if (rc > 0 && (fds[0].revents & (POLLIN | POLLERR | POLLHUP))) last_rx = SteadyClock::now();
    if (rc > 0 && (fds[1].revents & (POLLHUP | POLLERR)) && !(fds[1].revents & POLLIN)) local_eof = true;
  }

  if (stats) {
    std::fprintf(stderr, "pump: rounds %lld polls %lld poll timeouts %lld\n", rounds, polls, poll_timeouts);
  }
  if (!err.empty()) Fail(err_kind, err);
  alive_.store(false);
  // gRPC sees EOF on its end now (UNAVAILABLE for every call), before the SSH teardown.
  ::shutdown(local_fd_, SHUT_RDWR);
  Teardown();
}

void ChannelPump::Teardown() {
  LIBSSH2_SESSION* s = session_->raw();
  const int sock = session_->socket_fd();
  bool lost = failure_kind() == FailureKind::kConnectionLost;
  auto deadline = SteadyClock::now() + std::chrono::seconds(1);
  auto wait = [&] {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
    if (left <= 0) return false;
    int dirs = libssh2_session_block_directions(s);
    short ev = 0;
    if (dirs & LIBSSH2_SESSION_BLOCK_INBOUND) ev |= POLLIN;
    if (dirs & LIBSSH2_SESSION_BLOCK_OUTBOUND) ev |= POLLOUT;
    pollfd p{sock, ev ? ev : short(POLLIN), 0};
    ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 100)));
    return true;
  };
  if (lost) ::shutdown(sock, SHUT_RDWR);  // nothing to be polite to: sends fail at once
  // Close the channel politely when the peer is there; give up after the deadline.
  int rc;
  while ((rc = libssh2_channel_close(channel_)) == LIBSSH2_ERROR_EAGAIN && wait()) {
  }
  if (rc == LIBSSH2_ERROR_EAGAIN) {
    ::shutdown(sock, SHUT_RDWR);
    lost = true;
  }
  for (int spins = 0; (rc = libssh2_channel_free(channel_)) == LIBSSH2_ERROR_EAGAIN && spins < 1000;
       ++spins) {
    if (!wait()) {
      ::shutdown(sock, SHUT_RDWR);  // sends now fail with an error instead of EAGAIN
      lost = true;
    }
  }
  channel_ = nullptr;
  if (!lost) {
    while (libssh2_session_disconnect(s, "sftctl: bye") == LIBSSH2_ERROR_EAGAIN && wait()) {
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  session_->MarkDisconnected();
  session_.reset();
}

}  // namespace sftctl::client::ssh
