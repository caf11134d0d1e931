// common/os/net_addr.h: one loopback rule for the agent's listen check, node 0's master_addr and Gloo.
#include "common/os/net_addr.h"

#include <gtest/gtest.h>

namespace sftctl {
namespace {

TEST(IsLoopbackHost, LoopbackLiteralsAndLocalhostOnly) {
  for (const char* yes : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(yes)) << yes;
  }
  for (const char* no : {"", "0.0.0.0", "10.0.0.1", "128.0.0.1", "::", "[::]", "127.example.com",
                         "localhost.evil", "gpu-box", "127.0.0.1:22", "::2"}) {
    EXPECT_FALSE(IsLoopbackHost(no)) << no;
  }
}

}  // namespace
}  // namespace sftctl
