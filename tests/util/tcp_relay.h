// TcpRelay: a TCP relay for tests that hold a link or break it. 127.0.0.1:port() forwards each
// connection to 127.0.0.1:to_port, except:
//   * while held (Hold()): a new connection is accepted (its client's request sent, waiting for an
//     answer) and nothing of it is read or passed on until Release(), which lets the held connections
//     through, or Release(/*drop_held=*/true), which closes them (a link that went down) and lets only
//     later ones through;
//   * with `cut_after` bytes: once that many bytes in all have come back from the server, the
//     connection carrying the next byte is closed mid-answer and every later connection is closed as
//     soon as it is accepted (a link that stays down).
// Thread safety: construct, call and destroy from one thread; the relay runs its own threads (joined
// by the destructor).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

namespace sftctl::testing {

class TcpRelay {
 public:
  static constexpr uint64_t kNoCut = std::numeric_limits<uint64_t>::max();

  explicit TcpRelay(int to_port, uint64_t cut_after = kNoCut) : to_port_(to_port), cut_after_(cut_after) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = Loopback(0);
    socklen_t len = sizeof(a);
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;  // port() stays 0: the test's first request fails
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~TcpRelay() {
    stop_ = true;
    if (accept_.joinable()) accept_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (std::thread& t : pumps_) t.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  int port() const { return port_; }
  // Connections accepted from now on wait.
  void Hold() { hold_ = true; }
  void Release(bool drop_held = false) {
    if (drop_held) ++epoch_;
    hold_ = false;
  }
  // Connections waiting now.
  int held() const { return held_; }
  // Bytes relayed from the server so far.
  uint64_t down() const { return down_; }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const bool held = hold_;
      if (held) ++held_;  // counted before the accept loop goes on: held() sees it at once
      std::lock_guard<std::mutex> l(mu_);
      pumps_.emplace_back([this, client, held, epoch = epoch_.load()] { Pump(client, held, epoch); });
    }
  }
  // Waits while held, then relays the connection until either side closes, the link is cut or the
  // relay stops.
  void Pump(int client, bool held, int epoch) {
    while (held && hold_ && !stop_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (held) --held_;
    const bool dropped = (held && epoch != epoch_) || down_ >= cut_after_;
    const int server = dropped ? -1 : ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = Loopback(to_port_);
    bool up = server >= 0 && ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    while (up && !stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[0].revents != 0) up = Forward(client, server, /*from_server=*/false);
      if (up && p[1].revents != 0) up = Forward(server, client, /*from_server=*/true);
    }
    ::close(client);
    if (server >= 0) ::close(server);
  }
  // Passes on what `from` has to `to`, the server's bytes only up to cut_after_ in all. False once
  // the link is down (either side closed, or the cut reached).
  bool Forward(int from, int to, bool from_server) {
    char buf[65536];
    ssize_t n = ::read(from, buf, sizeof(buf));
    if (from_server && n > 0) {
      const uint64_t left = cut_after_ > down_ ? cut_after_ - down_ : 0;
      if (static_cast<uint64_t>(n) > left) n = static_cast<ssize_t>(left);
    }
    const bool sent = n > 0 && ::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n;
    if (from_server && n > 0) down_ += static_cast<uint64_t>(n);
    return sent;
  }

  int to_port_;
  uint64_t cut_after_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false}, hold_{false};
  std::atomic<int> held_{0}, epoch_{0};
  std::atomic<uint64_t> down_{0};
  std::thread accept_;
  std::mutex mu_;  // guards pumps_
  std::vector<std::thread> pumps_;
};

}  // namespace sftctl::testing
