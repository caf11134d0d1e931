// The host memory seam (common/os/host_memory.h): MemAvailable parsing, and this process's resident
// set and its peak, reset and regrown by a real allocation.
#include "common/os/host_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace sftctl {
namespace {

TEST(HostMemory, ParsesMemAvailable) {
  const std::string meminfo =
      "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\nBuffers: 1 "
      "kB\n";
  EXPECT_EQ(ParseMemAvailable(meminfo), int64_t{20000000} * 1024);
  EXPECT_EQ(ParseMemAvailable("MemTotal: 5 kB\n"), std::nullopt);       // an old kernel: no such line
  EXPECT_EQ(ParseMemAvailable("MemAvailable: lots\n"), std::nullopt);   // malformed
  EXPECT_EQ(ParseMemAvailable("MemAvailable: 12 MB\n"), std::nullopt);  // an unknown unit
  EXPECT_EQ(ParseMemAvailable("MemAvailableX: 12 kB\n"), std::nullopt);
}

#if defined(__linux__)
TEST(HostMemory, ReadsThisMachine) {
  StatusOr<HostMemory> m = AvailableHostMemory();
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_GT(m->available_bytes, int64_t{64} << 20);
  EXPECT_EQ(m->source, "MemAvailable in /proc/meminfo");
}

TEST(HostMemory, PeakFollowsAnAllocationAndResets) {
  ASSERT_TRUE(ResetPeakResident());
  const int64_t before = ResidentBytes();
  EXPECT_GT(before, 0);
  EXPECT_LE(PeakResidentBytes() - before, int64_t{8} << 20);
  {
    std::vector<char> block(int64_t{200} << 20);
    std::memset(block.data(), 1, block.size());  // touched, so resident
    EXPECT_GE(ResidentBytes() - before, int64_t{190} << 20);
  }
  EXPECT_GE(PeakResidentBytes() - before, int64_t{190} << 20);
  ASSERT_TRUE(ResetPeakResident());
  // From the set resident now: the freed block may still be (ASan keeps freed memory in quarantine).
  const int64_t after = ResidentBytes();
  EXPECT_LE(PeakResidentBytes() - after, int64_t{16} << 20) << "the reset starts from the current set";
}
#endif

}  // namespace
}  // namespace sftctl
