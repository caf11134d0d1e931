#include "common/os/host_memory.h"

#include <sys/resource.h>

#if defined(__APPLE__)
#include <mach/mach.h>
#endif

#include <fstream>
#include <sstream>

namespace sftctl {
namespace {

// The value of "<key>:   N kB" in a /proc text, in bytes.
std::optional<int64_t> KibField(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    int64_t kib = -1;
    std::string unit;
    if (!(fields >> kib >> unit) || kib < 0 || unit != "kB") return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

[[maybe_unused]] std::string ReadProc(const char* path) {  // Linux only (/proc)
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::optional<int64_t> ParseMemAvailable(const std::string& meminfo) {
  return KibField(meminfo, "MemAvailable");
}

StatusOr<HostMemory> AvailableHostMemory() {
#if defined(__linux__)
  if (auto bytes = ParseMemAvailable(ReadProc("/proc/meminfo")))
    return HostMemory{*bytes, "MemAvailable in /proc/meminfo"};
  return UnavailableError("/proc/meminfo has no MemAvailable line");
#elif defined(__APPLE__)
  vm_statistics64_data_t vm;
  mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
  vm_size_t page = 0;
  if (host_statistics64(mach_host_self(), HOST_VM_INFO64, reinterpret_cast<host_info64_t>(&vm), &count) !=
          KERN_SUCCESS ||
      host_page_size(mach_host_self(), &page) != KERN_SUCCESS) {
    return UnavailableError("the Mach host statistics are unavailable");
  }
  const int64_t pages = static_cast<int64_t>(vm.free_count) + vm.inactive_count + vm.purgeable_count;
  return HostMemory{pages * static_cast<int64_t>(page),
                    "free + inactive + purgeable pages (Mach host statistics)"};
#else
  return UnavailableError("this system does not report its available memory");
#endif
}

int64_t PeakResidentBytes() {
#if defined(__linux__)
  if (auto bytes = KibField(ReadProc("/proc/self/status"), "VmHWM")) return *bytes;
#endif
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
#if defined(__APPLE__)
  return static_cast<int64_t>(ru.ru_maxrss);  // bytes on macOS
#else
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // KiB elsewhere
#endif
}

int64_t ResidentBytes() {
#if defined(__linux__)
  if (auto bytes = KibField(ReadProc("/proc/self/status"), "VmRSS")) return *bytes;
#endif
  return 0;
}

bool ResetPeakResident() {
#if defined(__linux__)
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
#else
  return false;
#endif
}

}  // namespace sftctl
