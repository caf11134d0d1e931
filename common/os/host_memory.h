// Host memory: what the system can still give this process, and this process's peak resident
// set. A portability seam (docs/macos.md): Linux reads /proc/meminfo and /proc/self/status;
// macOS asks the Mach host statistics and getrusage. Stateless and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace sftctl {

struct HostMemory {
  int64_t available_bytes = 0;  // memory a new allocation can get without swapping
  std::string source;           // where the number comes from, for messages
};

// Linux: MemAvailable of /proc/meminfo. macOS: free + inactive + purgeable pages. UNAVAILABLE
// when the system does not say (another system, an unreadable /proc).
StatusOr<HostMemory> AvailableHostMemory();

// MemAvailable (in bytes) of a /proc/meminfo text; nullopt when the line is missing or malformed.
std::optional<int64_t> ParseMemAvailable(const std::string& meminfo);

// The peak resident set of this process since it started or since the last ResetPeakResident,
// in bytes (Linux VmHWM; macOS ru_maxrss, which cannot be reset). 0 when unknown.
int64_t PeakResidentBytes();
// The current resident set in bytes (Linux VmRSS); 0 when unknown.
int64_t ResidentBytes();
// Starts a new peak from the current resident set (Linux: "5" into /proc/self/clear_refs).
// Returns false where that is impossible (macOS, an old kernel): PeakResidentBytes then keeps
// the whole process's peak.
bool ResetPeakResident();

}  // namespace sftctl
