// HoldRelay: a TCP relay for tests that need a request to stay in flight for as long as the test
// wants. 127.0.0.1:port() forwards each connection to 127.0.0.1:to_port, except while held: then a new
// connection is accepted (its client's request sent, waiting for an answer) and nothing of it is read
// or passed on until Release(), which lets the held connections through, or with `drop_held` closes
// them (a link that went down) and lets only later ones through. Thread safety: construct, call and
// destroy from one thread; the relay runs its own threads (joined by the destructor).
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace sftctl::testing {

class HoldRelay {
 public:
  explicit HoldRelay(int to_port) : to_port_(to_port) {
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
  ~HoldRelay() {
    stop_ = true;
    if (accept_.joinable()) accept_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (std::thread& t : pumps_) t.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  HoldRelay(const HoldRelay&) = delete;
  HoldRelay& operator=(const HoldRelay&) = delete;

  int port() const { return port_; }
  // Connections accepted from now on wait.
  void Hold() { hold_ = true; }
  void Release(bool drop_held = false) {
    if (drop_held) ++epoch_;
    hold_ = false;
  }
  // Connections waiting now.
  int held() const { return held_; }

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
  // Waits while held, then relays the connection until either side closes or the relay stops.
  void Pump(int client, bool held, int epoch) {
    while (held && hold_ && !stop_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (held) --held_;
    if (held && epoch != epoch_) {  // Release(drop_held)
      ::close(client);
      return;
    }
    const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = Loopback(to_port_);
    bool up = server >= 0 && ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    char buf[65536];
    while (up && !stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int from = 0; from < 2 && up; ++from) {
        if (p[from].revents == 0) continue;
        const ssize_t n = ::read(p[from].fd, buf, sizeof(buf));
        up = n > 0 && ::send(p[1 - from].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) == n;
      }
    }
    ::close(client);
    if (server >= 0) ::close(server);
  }

  int to_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false}, hold_{false};
  std::atomic<int> held_{0}, epoch_{0};
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
};

}  // namespace sftctl::testing
