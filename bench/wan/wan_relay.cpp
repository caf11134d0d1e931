// wan_relay: a user-space TCP relay that makes a loopback connection behave like a network link, for
// the WAN transfer bench (bench/wan/run.sh). This kernel has no netem, so delay and rate are emulated
// here: every byte read from one side is released to the other side after the link's serialization
// time (RATE, shared by all connections in that direction, as on one access link) plus half the
// round-trip time (plus optional jitter, never reordering bytes).
//
//   wan_relay --listen PORT --to HOST:PORT --rtt-ms 40 --mbit 500 [--jitter-ms 2] [--queue-kib N]
//
// Prints "WAN_RELAY_READY <port>" on stdout once listening; runs until killed. Each direction holds at
// most one bandwidth-delay product plus the queue (default 1 MiB) in flight: beyond that the relay
// stops reading and the sender's TCP feels the back-pressure, as behind a router's queue.
//
// Not emulated: loss and TCP's own congestion control across the link (the relay splits each TCP
// connection in two). Flow control that spans the link end to end (SSH channel windows, HTTP/2
// windows) is emulated faithfully, which is what the bench measures.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using SteadyClock = std::chrono::steady_clock;
using Ns = std::chrono::nanoseconds;

struct Options {
  int listen_port = 0;
  std::string to_host = "127.0.0.1";
  int to_port = 0;
  double rtt_ms = 0;
  double mbit = 0;  // 0: unlimited
  double jitter_ms = 0;
  size_t queue_bytes = 1 << 20;
};

// One direction of the emulated link, shared by every connection.
struct Link {
  double bytes_per_ns = 0;  // 0: unlimited
  SteadyClock::time_point free_at{};
  Ns one_way{0};
  Ns jitter{0};
  size_t cap = 0;  // bytes in flight per connection and direction
};

struct Packet {
  SteadyClock::time_point release;
  std::string data;
  size_t off = 0;
};

// Bytes flowing from `in` to `out` through `link`.
struct Pipe {
  int in = -1, out = -1;
  Link* link = nullptr;
  std::deque<Packet> q;
  size_t queued = 0;
  bool in_eof = false, out_shut = false, broken = false;
  SteadyClock::time_point last_release{};
};

struct Conn {
  Pipe up, down;  // client -> server, server -> client
  bool done() const {
    auto finished = [](const Pipe& p) { return p.broken || (p.in_eof && p.q.empty() && p.out_shut); };
    return finished(up) && finished(down);
  }
};

std::mt19937_64 rng(42);

void ReadInto(Pipe& p, SteadyClock::time_point now) {
  static std::vector<char> buf(256 << 10);
  size_t room = p.link->cap > p.queued ? p.link->cap - p.queued : 0;
  if (room == 0) return;
  ssize_t n = ::read(p.in, buf.data(), std::min(room, buf.size()));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) {
    p.in_eof = true;
    if (n < 0) p.broken = true;
    return;
  }
  Link& l = *p.link;
  SteadyClock::time_point start = std::max(now, l.free_at);
  Ns serialize{l.bytes_per_ns > 0 ? static_cast<int64_t>(static_cast<double>(n) / l.bytes_per_ns) : 0};
  l.free_at = start + serialize;
  Ns extra{0};
  if (l.jitter.count() > 0) extra = Ns(static_cast<int64_t>(rng() % static_cast<uint64_t>(l.jitter.count())));
  SteadyClock::time_point release = std::max(l.free_at + l.one_way + extra, p.last_release);
  p.last_release = release;
  p.q.push_back(Packet{release, std::string(buf.data(), static_cast<size_t>(n)), 0});
  p.queued += static_cast<size_t>(n);
}

void WriteOut(Pipe& p, SteadyClock::time_point now) {
  while (!p.q.empty() && p.q.front().release <= now) {
    Packet& pk = p.q.front();
    ssize_t n = ::write(p.out, pk.data.data() + pk.off, pk.data.size() - pk.off);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) {
      p.broken = true;
      return;
    }
    pk.off += static_cast<size_t>(n);
    p.queued -= static_cast<size_t>(n);
    if (pk.off < pk.data.size()) return;
    p.q.pop_front();
  }
  if (p.in_eof && p.q.empty() && !p.out_shut) {
    ::shutdown(p.out, SHUT_WR);
    p.out_shut = true;
  }
}

int ListenOn(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0) {
    std::perror("wan_relay: listen");
    std::exit(2);
  }
  return fd;
}

int ConnectTo(const Options& o) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(o.to_port));
  ::inet_pton(AF_INET, o.to_host.c_str(), &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void Prepare(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--listen") {
      o.listen_port = std::atoi(v.c_str());
    } else if (k == "--to") {
      size_t c = v.rfind(':');
      o.to_host = v.substr(0, c);
      o.to_port = std::atoi(v.substr(c + 1).c_str());
    } else if (k == "--rtt-ms") {
      o.rtt_ms = std::atof(v.c_str());
    } else if (k == "--mbit") {
      o.mbit = std::atof(v.c_str());
    } else if (k == "--jitter-ms") {
      o.jitter_ms = std::atof(v.c_str());
    } else if (k == "--queue-kib") {
      o.queue_bytes = static_cast<size_t>(std::atol(v.c_str())) << 10;
    } else {
      std::fprintf(stderr, "wan_relay: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (o.to_port == 0) {
    std::fprintf(stderr, "usage: wan_relay --listen PORT --to HOST:PORT --rtt-ms MS --mbit RATE\n");
    std::exit(2);
  }
  return o;
}

Link MakeLink(const Options& o) {
  Link l;
  l.bytes_per_ns = o.mbit > 0 ? o.mbit * 1e6 / 8 / 1e9 : 0;
  l.one_way = Ns(static_cast<int64_t>(o.rtt_ms * 1e6 / 2));
  l.jitter = Ns(static_cast<int64_t>(o.jitter_ms * 1e6));
  double bdp = o.mbit > 0 ? o.mbit * 1e6 / 8 * o.rtt_ms / 1e3 : 64.0 * (1 << 20);
  l.cap = static_cast<size_t>(bdp) + o.queue_bytes;
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = Parse(argc, argv);
  Link up = MakeLink(o), down = MakeLink(o);
  int lfd = ListenOn(o.listen_port);
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&bound), &len);
  std::printf("WAN_RELAY_READY %d\n", ntohs(bound.sin_port));
  std::fflush(stdout);
  std::vector<std::unique_ptr<Conn>> conns;
  for (;;) {
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    SteadyClock::time_point now = SteadyClock::now();
    Ns wait = Ns(std::chrono::seconds(1));
    for (auto& c : conns) {
      for (Pipe* p : {&c->up, &c->down}) {
        if (p->broken) continue;
        if (!p->in_eof && p->queued < p->link->cap) fds.push_back({p->in, POLLIN, 0});
        if (!p->q.empty()) {
          if (p->q.front().release <= now) {
            fds.push_back({p->out, POLLOUT, 0});
          } else {
            wait = std::min(wait, std::chrono::duration_cast<Ns>(p->q.front().release - now));
          }
        }
      }
    }
    timespec ts{static_cast<time_t>(wait.count() / 1000000000), static_cast<long>(wait.count() % 1000000000)};
    ::ppoll(fds.data(), fds.size(), &ts, nullptr);
    now = SteadyClock::now();
    if (fds[0].revents & POLLIN) {
      int cfd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      int sfd = cfd >= 0 ? ConnectTo(o) : -1;
      if (sfd < 0) {
        if (cfd >= 0) ::close(cfd);
      } else {
        Prepare(cfd);
        Prepare(sfd);
        auto c = std::make_unique<Conn>();
        c->up.in = c->down.out = cfd;
        c->up.out = c->down.in = sfd;
        c->up.link = &up;
        c->down.link = &down;
        conns.push_back(std::move(c));
      }
    }
    for (auto& c : conns) {
      for (Pipe* p : {&c->up, &c->down}) {
        if (p->broken) continue;
        ReadInto(*p, now);
        WriteOut(*p, now);
      }
    }
    for (auto it = conns.begin(); it != conns.end();) {
      Conn& c = **it;
      if (c.done() || c.up.broken || c.down.broken) {
        ::close(c.up.in);
        ::close(c.down.in);
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }
}
