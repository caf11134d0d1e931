// The descriptor seam (common/fd_util) and the Waker (common/waker), both implementations of each:
// the portable one is what macOS runs, exercised here on Linux.
#include "common/os/fd_util.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

#include "common/os/waker.h"
#include "tests/util/status_matchers.h"

namespace sftctl {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

bool CloseOnExec(int fd) { return (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; }
bool NonBlocking(int fd) { return (::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }
bool Readable(int fd, int timeout_ms = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

class FdUtilTest : public ::testing::TestWithParam<FdImpl> {};

TEST_P(FdUtilTest, PipeEndsAreCloseOnExecAndBlockingByDefault) {
  int fds[2];
  ASSERT_TRUE(MakePipe(fds, {}, GetParam()).ok());
  for (int fd : fds) {
    EXPECT_TRUE(CloseOnExec(fd));
    EXPECT_FALSE(NonBlocking(fd));
  }
  ASSERT_EQ(::write(fds[1], "x", 1), 1);
  char c = 0;
  EXPECT_EQ(::read(fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_P(FdUtilTest, NonBlockingPipeReturnsEagainWhenEmpty) {
  int fds[2];
  ASSERT_TRUE(MakePipe(fds, FdFlags{true}, GetParam()).ok());
  EXPECT_TRUE(NonBlocking(fds[0]) && NonBlocking(fds[1]));
  char c;
  EXPECT_EQ(::read(fds[0], &c, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_P(FdUtilTest, SocketGetsTheAskedFlags) {
  auto blocking = MakeSocket(AF_INET, SOCK_STREAM, 0, {}, GetParam());
  ASSERT_TRUE(blocking.ok()) << blocking.status().ToString();
  EXPECT_TRUE(CloseOnExec(*blocking));
  EXPECT_FALSE(NonBlocking(*blocking));
  auto nonblocking = MakeSocket(AF_INET, SOCK_STREAM, 0, FdFlags{true}, GetParam());
  ASSERT_TRUE(nonblocking.ok());
  EXPECT_TRUE(CloseOnExec(*nonblocking));
  EXPECT_TRUE(NonBlocking(*nonblocking));
  ::close(*blocking);
  ::close(*nonblocking);
}

TEST_P(FdUtilTest, BadSocketDomainIsAnError) {
  auto s = MakeSocket(-1, SOCK_STREAM, 0, {}, GetParam());
  EXPECT_THAT(s, StatusIs(StatusCode::kInternal, HasSubstr("cannot create 'a socket'")));  // EAFNOSUPPORT
}

TEST_P(FdUtilTest, SendToAClosedPeerIsEpipeNotSigpipe) {
  int sv[2];
  ASSERT_TRUE(MakeSocketPair(AF_UNIX, SOCK_STREAM, sv, {}, GetParam()).ok());
  EXPECT_TRUE(CloseOnExec(sv[0]) && CloseOnExec(sv[1]));
  ASSERT_EQ(SendNoSignal(sv[0], "ab", 2, 0), 2);
  char buf[2];
  ASSERT_EQ(::recv(sv[1], buf, 2, 0), 2);
  ::close(sv[1]);
  // SIGPIPE's default action would end this test binary; SendNoSignal must return EPIPE instead.
  EXPECT_EQ(SendNoSignal(sv[0], "ab", 2, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EPIPE);
  ::close(sv[0]);
}

TEST_P(FdUtilTest, SendQueueCountsUnreadBytesWhereTheSystemCanTell) {
  int sv[2];
  ASSERT_TRUE(MakeSocketPair(AF_UNIX, SOCK_STREAM, sv, {}, GetParam()).ok());
  ASSERT_EQ(SendNoSignal(sv[0], "hello", 5, 0), 5);
  long queued = SendQueueBytes(sv[0], GetParam());
  if (GetParam() == FdImpl::kPortable) {
    EXPECT_EQ(queued, -1);  // what a system without SIOCOUTQ / SO_NWRITE answers
  } else {
#if defined(__linux__)
    // Linux counts an AF_UNIX stream's unread data (with its buffer overhead) in the sender's queue.
    EXPECT_GE(queued, 5);
    char buf[5];
    ASSERT_EQ(::recv(sv[1], buf, 5, 0), 5);
    EXPECT_EQ(SendQueueBytes(sv[0], GetParam()), 0);
#else
    EXPECT_GE(queued, 0);
#endif
  }
  ::close(sv[0]);
  ::close(sv[1]);
}

INSTANTIATE_TEST_SUITE_P(Impl, FdUtilTest, ::testing::Values(FdImpl::kNative, FdImpl::kPortable),
                         [](const auto& info) {
                           return info.param == FdImpl::kNative ? "Native" : "Portable";
                         });

class WakerTest : public ::testing::TestWithParam<Waker::Kind> {};

// Waker::Create(kind), skipping the test where this system lacks the kind (eventfd off Linux).
#define CREATE_OR_SKIP(w)                                                                                \
  auto w = Waker::Create(GetParam());                                                                    \
  if (!w.ok() && w.status().code() == StatusCode::kUnimplemented) GTEST_SKIP() << w.status().ToString(); \
  ASSERT_TRUE(w.ok()) << w.status().ToString()

TEST_P(WakerTest, WakeMakesReadableUntilDrained) {
  CREATE_OR_SKIP(w);
  EXPECT_EQ((*w)->kind(), GetParam());
  EXPECT_TRUE(CloseOnExec((*w)->fd()));
  EXPECT_FALSE(Readable((*w)->fd()));
  for (int i = 0; i < 3; ++i) (*w)->Wake();
  EXPECT_TRUE(Readable((*w)->fd()));
  (*w)->Drain();
  EXPECT_FALSE(Readable((*w)->fd()));
}

TEST_P(WakerTest, ManyWakesNeverBlockAndOneDrainClearsThem) {
  CREATE_OR_SKIP(w);
  for (int i = 0; i < 200000; ++i) (*w)->Wake();  // more than a pipe buffer holds
  (*w)->Drain();
  EXPECT_FALSE(Readable((*w)->fd()));
}

TEST_P(WakerTest, WakeFromAnotherThreadEndsAPoll) {
  CREATE_OR_SKIP(w);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*w)->Wake();
  });
  EXPECT_TRUE(Readable((*w)->fd(), 10000));
  t.join();
}

INSTANTIATE_TEST_SUITE_P(Kind, WakerTest, ::testing::Values(Waker::Kind::kEventFd, Waker::Kind::kPipe),
                         [](const auto& info) {
                           return info.param == Waker::Kind::kPipe ? "Pipe" : "EventFd";
                         });

TEST(WakerTest, BestIsEventFdOnLinuxAndAPipeElsewhere) {
  auto w = Waker::Create();
  ASSERT_TRUE(w.ok());
#if defined(__linux__)
  EXPECT_EQ((*w)->kind(), Waker::Kind::kEventFd);
  EXPECT_TRUE(Waker::Create(Waker::Kind::kEventFd).ok());
#else
  EXPECT_EQ((*w)->kind(), Waker::Kind::kPipe);
  EXPECT_EQ(Waker::Create(Waker::Kind::kEventFd).status().code(), StatusCode::kUnimplemented);
#endif
}

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFd, ClosesWhatItHoldsWhenDestroyedOrReassigned) {
  int fds[2];
  ASSERT_TRUE(MakePipe(fds).ok());
  {
    UniqueFd read_end(fds[0]);
    UniqueFd write_end(fds[1]);
    EXPECT_TRUE(read_end.valid());
    EXPECT_EQ(read_end.get(), fds[0]);
    write_end = UniqueFd();  // the old descriptor is closed, the new (none) held
    EXPECT_FALSE(IsOpen(fds[1]));
    EXPECT_FALSE(write_end.valid());
    EXPECT_TRUE(IsOpen(fds[0]));
  }
  EXPECT_FALSE(IsOpen(fds[0]));
}

TEST(UniqueFd, MovesAndReleasesWithoutClosing) {
  int fds[2];
  ASSERT_TRUE(MakePipe(fds).ok());
  UniqueFd a(fds[0]);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): a moved-from UniqueFd holds none
  EXPECT_EQ(b.get(), fds[0]);
  UniqueFd c(fds[1]);
  c = std::move(b);  // closes fds[1], takes fds[0]
  EXPECT_FALSE(IsOpen(fds[1]));
  EXPECT_EQ(c.Release(), fds[0]);
  EXPECT_FALSE(c.valid());
  EXPECT_TRUE(IsOpen(fds[0]));  // released: the caller owns it
  EXPECT_EQ(::close(fds[0]), 0);
}

TEST(UniqueFd, CloseReportsCloseResultOnce) {
  int fds[2];
  ASSERT_TRUE(MakePipe(fds).ok());
  ::close(fds[1]);
  UniqueFd fd(fds[0]);
  EXPECT_EQ(fd.Close(), 0);
  EXPECT_FALSE(IsOpen(fds[0]));
  EXPECT_EQ(fd.Close(), 0);  // holds none: nothing to close
  UniqueFd stale(fds[0]);    // already closed under it: close(2) fails with EBADF
  EXPECT_EQ(stale.Close(), -1);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
}  // namespace sftctl
