#include "client/remote/ssh/channel_pump.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "common/os/fd_util.h"

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

// One pump's copying loop: each Round() moves what it can in both directions, makes at most one
// send-type libssh2 call, and waits when nothing moved. Round() returns false when the loop must end:
// error() says why ("" when gRPC closed its end or both sides finished).
class PumpLoop {
 public:
  PumpLoop(SshSession* session, LIBSSH2_CHANNEL* channel, int local_fd, int waker_fd, const std::string& peer,
           std::function<void(const char*, size_t)> on_stderr)
      : session_(session),
        s_(session->raw()),
        sock_(session->socket_fd()),
        channel_(channel),
        local_fd_(local_fd),
        waker_fd_(waker_fd),
        peer_(peer),
        on_stderr_(std::move(on_stderr)),
        keepalive_s_(session->keepalive_s()),
        next_keepalive_(SteadyClock::now() + std::chrono::seconds(keepalive_s_ > 0 ? keepalive_s_ : 3600)),
        last_rx_(SteadyClock::now()),
        dead_after_(std::chrono::seconds(keepalive_s_ > 0 ? 3 * keepalive_s_ + 5 : 1 << 30)) {}

  bool Round() {
    ++rounds_;
    progress_ = false;
    if (!ReadChannel() || !ToLocal()) return false;
    FromLocal();
    if (!SendOne()) return false;
    if (remote_eof_ && down_.empty()) {
      err_ = peer_ + " closed the SSH channel";
      return false;
    }
    if (local_eof_ && eof_sent_ && remote_eof_) return false;
    if (progress_ || (read_avail_ > 0 && down_.room() > 0)) return true;
    return Wait();
  }

  const std::string& error() const { return err_; }
  bool connection_lost() const { return lost_; }
  void PrintStats() const {
    std::fprintf(stderr, "pump: rounds %lld polls %lld poll timeouts %lld\n", rounds_, polls_,
                 poll_timeouts_);
  }

 private:
  // A send-type libssh2 call that returned EAGAIN must be repeated before any other send (see
  // SafeToSendSmall).
  enum class Pending { kNone, kWrite, kAdjust, kEof };

  bool Lost(const std::string& what) {
    err_ = "SSH connection lost (" + what + ")";
    lost_ = true;
    return false;
  }

  // 1. SSH channel -> buffer: drain until EAGAIN or the buffer is full; the stderr tail too.
  bool ReadChannel() {
    if (!remote_eof_ && down_.room() > 0) {
      ssize_t n = libssh2_channel_read(channel_, down_.tail(), down_.room());
      if (n > 0) {
        down_.end += static_cast<size_t>(n);
        progress_ = true;
        last_rx_ = SteadyClock::now();
      } else if (n == 0 || n == LIBSSH2_ERROR_EAGAIN) {
        if (libssh2_channel_eof(channel_)) remote_eof_ = true;
      } else {
        return Lost("reading: " + session_->LastError());
      }
    }
    if (on_stderr_) {
      char eb[1024];
      ssize_t n = libssh2_channel_read_stderr(channel_, eb, sizeof(eb));
      if (n > 0) {
        progress_ = true;
        on_stderr_(eb, static_cast<size_t>(n));
      }
    }
    return true;
  }

  // 2. buffer -> gRPC. False when gRPC closed its end: the pump is being torn down.
  bool ToLocal() {
    if (down_.empty()) return true;
    ssize_t w = SendNoSignal(local_fd_, down_.head(), down_.size(), MSG_DONTWAIT);
    if (w > 0) {
      down_.consume(static_cast<size_t>(w));
      progress_ = true;
    } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
      return false;
    }
    return true;
  }

  // 3. gRPC -> buffer.
  void FromLocal() {
    if (local_eof_ || up_.room() == 0) return;
    ssize_t r = ::recv(local_fd_, up_.tail(), up_.room(), MSG_DONTWAIT);
    if (r > 0) {
      up_.end += static_cast<size_t>(r);
      progress_ = true;
    } else if (r == 0) {
      local_eof_ = true;
      progress_ = true;
    } else if (errno != EAGAIN && errno != EINTR) {
      local_eof_ = true;
    }
  }

  // 4. Exactly one send-type libssh2 call per round, repeating a pending one first: a window
  // adjust, channel data, EOF, or a keepalive, in that order of preference.
  bool SendOne() {
    unsigned long window = libssh2_channel_window_read_ex(channel_, &read_avail_, nullptr);
    bool want_adjust = window < SshSession::kWindow / 2;
    if (pending_ == Pending::kAdjust ||
        (pending_ == Pending::kNone && want_adjust && SafeToSendSmall(sock_))) {
      unsigned int granted = 0;
      int rc = libssh2_channel_receive_window_adjust2(channel_, SshSession::kWindow - window, 1, &granted);
      if (rc < 0 && rc != LIBSSH2_ERROR_EAGAIN) return Lost("window adjust: " + session_->LastError());
      Sent(rc == LIBSSH2_ERROR_EAGAIN, Pending::kAdjust);
    } else if (pending_ == Pending::kWrite || (pending_ == Pending::kNone && !up_.empty())) {
      ssize_t w = libssh2_channel_write(channel_, up_.head(), up_.size());
      if (w < 0 && w != LIBSSH2_ERROR_EAGAIN) return Lost("writing: " + session_->LastError());
      if (w >= 0) up_.consume(static_cast<size_t>(w));
      Sent(w == LIBSSH2_ERROR_EAGAIN, Pending::kWrite);
    } else if (pending_ == Pending::kEof ||
               (pending_ == Pending::kNone && local_eof_ && up_.empty() && !eof_sent_)) {
      int rc = libssh2_channel_send_eof(channel_);
      if (rc != LIBSSH2_ERROR_EAGAIN) eof_sent_ = true;
      Sent(rc == LIBSSH2_ERROR_EAGAIN, Pending::kEof);
    } else if (pending_ == Pending::kNone && keepalive_s_ > 0 && SteadyClock::now() >= next_keepalive_ &&
               SafeToSendSmall(sock_)) {
      int next = keepalive_s_;
      if (libssh2_keepalive_send(s_, &next) < 0) return Lost("keepalive: " + session_->LastError());
      next_keepalive_ = SteadyClock::now() + std::chrono::seconds(std::max(1, next));
    }
    return true;
  }
  void Sent(bool again, Pending kind) {
    pending_ = again ? kind : Pending::kNone;
    if (!again) progress_ = true;
  }

  // 5. Nothing moved: wait for the SSH socket, the local socket or a stop request. False when the
  // server is silent past dead_after_ or poll fails.
  bool Wait() {
    auto now = SteadyClock::now();
    if (down_.room() == 0) last_rx_ = now;  // not listening to the server: no liveness verdict
    if (now - last_rx_ > dead_after_) {
      return Lost("no answer to keepalives for " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - last_rx_).count()) +
                  " s");
    }
    int dirs = libssh2_session_block_directions(s_);
    short sev = 0;
    if (down_.room() > 0 || (dirs & LIBSSH2_SESSION_BLOCK_INBOUND)) sev |= POLLIN;
    if ((dirs & LIBSSH2_SESSION_BLOCK_OUTBOUND) || pending_ != Pending::kNone) sev |= POLLOUT;
    short lev = 0;
    if (!down_.empty()) lev |= POLLOUT;
    if (!local_eof_ && up_.room() > 0) lev |= POLLIN;
    pollfd fds[3] = {{sock_, sev, 0}, {local_fd_, lev, 0}, {waker_fd_, POLLIN, 0}};
    int timeout_ms = 1000;
    if (keepalive_s_ > 0) {
      auto until = std::chrono::duration_cast<std::chrono::milliseconds>(next_keepalive_ - now).count();
      timeout_ms = static_cast<int>(std::max<long long>(10, std::min<long long>(until, 1000)));
    }
    int rc = ::poll(fds, 3, timeout_ms);
    ++polls_;
    if (rc == 0) ++poll_timeouts_;
    if (rc < 0 && errno != EINTR) {
      err_ = std::string("poll: ") + std::strerror(errno);
      return false;
    }
    if (rc > 0 && (fds[0].revents & (POLLIN | POLLERR | POLLHUP))) last_rx_ = SteadyClock::now();
    if (rc > 0 && (fds[1].revents & (POLLHUP | POLLERR)) && !(fds[1].revents & POLLIN)) local_eof_ = true;
    return true;
  }

  SshSession* session_;
  LIBSSH2_SESSION* s_;
  const int sock_;
  LIBSSH2_CHANNEL* channel_;
  const int local_fd_;
  const int waker_fd_;
  const std::string& peer_;
  std::function<void(const char*, size_t)> on_stderr_;  // null: stderr is not read
  const int keepalive_s_;
  SteadyClock::time_point next_keepalive_;
  SteadyClock::time_point last_rx_;
  // No sign of life from the server for this long while we listen: the connection is dead.
  const SteadyClock::duration dead_after_;
  Buffer down_{kDownBuf}, up_{kUpBuf};
  bool remote_eof_ = false, local_eof_ = false, eof_sent_ = false, progress_ = false;
  unsigned long read_avail_ = 0;
  Pending pending_ = Pending::kNone;
  std::string err_;
  bool lost_ = false;
  long long polls_ = 0, poll_timeouts_ = 0, rounds_ = 0;
};

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
  MutexLock l(&mu_);
  return failure_;
}

std::string ChannelPump::stderr_tail() const {
  MutexLock l(&mu_);
  return stderr_tail_;
}

void ChannelPump::Fail(FailureKind kind, const std::string& why) {
  MutexLock l(&mu_);
  if (!failure_.empty()) return;
  failure_ = why;
  failure_kind_ = kind;
}

ChannelPump::FailureKind ChannelPump::failure_kind() const {
  MutexLock l(&mu_);
  return failure_kind_;
}

void ChannelPump::Run() {
  std::function<void(const char*, size_t)> on_stderr;
  if (capture_stderr_) {
    on_stderr = [this](const char* bytes, size_t n) {
      MutexLock l(&mu_);
      stderr_tail_.append(bytes, n);
      if (stderr_tail_.size() > kStderrTail) stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
    };
  }
  PumpLoop loop(session_.get(), channel_, local_fd_, waker_->fd(), peer_, std::move(on_stderr));
  while (!stop_.load() && loop.Round()) {
  }
  if (std::getenv("SFTCTL_PUMP_STATS") != nullptr) loop.PrintStats();
  if (!loop.error().empty()) {
    Fail(loop.connection_lost() ? FailureKind::kConnectionLost : FailureKind::kOther, loop.error());
  }
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
