// DropRelay: a TCP relay for tests that drops the link. 127.0.0.1:port() forwards each connection to
// 127.0.0.1:to_port; once `cut_after` bytes in all have come back from the server, the connection
// carrying the next byte is closed mid-response and every later connection is closed as soon as it
// is accepted (a link that went down). Thread safety: construct, read, destroy from one thread; the
// relay runs its own threads (joined by the destructor).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace sftctl::testing {

class DropRelay {
 public:
  DropRelay(int to_port, uint64_t cut_after) : to_port_(to_port), cut_after_(cut_after) {
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
  ~DropRelay() {
    stop_ = true;
    if (accept_.joinable()) accept_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (std::thread& t : pumps_) t.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  DropRelay(const DropRelay&) = delete;
  DropRelay& operator=(const DropRelay&) = delete;

  int port() const { return port_; }
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
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      std::lock_guard<std::mutex> l(mu_);
      pumps_.emplace_back([this, client] { Pump(client); });
    }
  }
  // Relays one connection until either side closes, the link drops or the relay stops.
  void Pump(int client) {
    const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = Loopback(to_port_);
    bool up = down_ < cut_after_ && server >= 0 &&
              ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    char buf[65536];
    while (up && !stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      if (p[0].revents != 0) {
        const ssize_t n = ::read(client, buf, sizeof(buf));
        up = n > 0 && ::send(server, buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n;
      }
      if (up && p[1].revents != 0) {
        ssize_t n = ::read(server, buf, sizeof(buf));
        const uint64_t left = cut_after_ > down_ ? cut_after_ - down_ : 0;
        if (n > 0 && static_cast<uint64_t>(n) > left) n = static_cast<ssize_t>(left);
        up = n > 0 && ::send(client, buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n;
        if (n > 0) down_ += static_cast<uint64_t>(n);
      }
    }
    ::close(client);
    if (server >= 0) ::close(server);
  }

  int to_port_;
  uint64_t cut_after_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> down_{0};
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
};

}  // namespace sftctl::testing
