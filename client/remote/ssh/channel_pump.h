// ChannelPump: copies bytes between one libssh2 channel and one end of a socketpair, on its own
// thread; the other end of the socketpair is handed to gRPC (grpc::CreateCustomInsecureChannelFromFd), so
// the gRPC client needs no listening port.
//
// Why a plain poll(2) loop and not Boost.Asio: the loop waits on exactly three descriptors (the SSH
// socket, whose readiness libssh2 dictates through libssh2_session_block_directions; the local
// socketpair end; a wake-up Waker, an eventfd or a self-pipe) and must re-drive libssh2 until EAGAIN after
// every wake-up, because decrypted data can sit inside libssh2 while the socket is not readable. Asio would
// wrap the same poll in reactor callbacks without removing any of that logic, and adds no second consumer.
//
// Ownership and threads: the pump owns the SshSession and the channel from Start() on; after Start()
// no other thread may touch them (libssh2 sessions are not thread-safe). The destructor stops the
// thread and frees the channel and the session; it returns within about 2 s even when the peer is
// gone (a graceful close is tried for 1 s, then the TCP socket is shut down). alive(), failure() and
// stderr_tail() are thread-safe.
#pragma once

#include <libssh2.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "client/remote/ssh/ssh_session.h"
#include "common/mutex.h"
#include "common/os/waker.h"
#include "common/status.h"

namespace sftctl::client::ssh {

class ChannelPump {
 public:
  // Takes ownership of `session` (switched to non-blocking) and `channel` (opened on it).
  // `capture_stderr`: keep the last 4 KiB of the channel's stderr (the `sftd bridge` channel).
  // `peer` names the far end in failure() when it closes the channel ("the agent side", or "the
  // target host" for a ProxyJump relay).
  static StatusOr<std::unique_ptr<ChannelPump>> Start(std::unique_ptr<SshSession> session,
                                                      LIBSSH2_CHANNEL* channel, bool capture_stderr,
                                                      std::string peer = "the agent side");
  ~ChannelPump();
  ChannelPump(const ChannelPump&) = delete;
  ChannelPump& operator=(const ChannelPump&) = delete;

  // The socketpair end for gRPC. The caller owns it (gRPC takes it over). Call once; -1 afterwards.
  int TakeClientFd();

  bool alive() const { return alive_.load(); }
  // Why the pump stopped ("" while alive or after a clean shutdown).
  std::string failure() const EXCLUDES(mu_);
  std::string stderr_tail() const EXCLUDES(mu_);

 private:
  // What stopped the pump, recorded with the message: Teardown is polite to a peer that is still there.
  enum class FailureKind {
    kNone,            // alive, or a clean shutdown
    kConnectionLost,  // the SSH connection failed: nothing left to be polite to
    kOther,           // the agent closed the channel, or a local error
  };

  ChannelPump() = default;
  void Run();
  // Records the first failure only.
  void Fail(FailureKind kind, const std::string& why) EXCLUDES(mu_);
  FailureKind failure_kind() const EXCLUDES(mu_);
  void Teardown();

  std::unique_ptr<SshSession> session_;
  LIBSSH2_CHANNEL* channel_ = nullptr;
  bool capture_stderr_ = false;
  std::string peer_;
  int local_fd_ = -1;             // pump's end of the socketpair
  int client_fd_ = -1;            // gRPC's end until taken
  std::unique_ptr<Waker> waker_;  // stop request
  std::atomic<bool> stop_{false};
  std::atomic<bool> alive_{true};
  mutable Mutex mu_;
  std::string failure_ GUARDED_BY(mu_);
  FailureKind failure_kind_ GUARDED_BY(mu_) = FailureKind::kNone;  // set with failure_
  std::string stderr_tail_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace sftctl::client::ssh
