#include "trainer/runtime/cxx_runtime_check.h"

#include <cstdint>
#include <filesystem>
#include <system_error>

#if defined(__linux__) && defined(__GLIBCXX__)
#include <dlfcn.h>
#define SFTCTL_CHECK_CXX_RUNTIME 1
#endif

// Set by trainer/CMakeLists.txt for this file (libstdcxx_first.cmake's findings).
#ifndef SFTCTL_CXX_COMPILER_DESC
#define SFTCTL_CXX_COMPILER_DESC "an unrecorded compiler"
#endif
#ifndef SFTCTL_LIBSTDCXX_LINK_DESC
#define SFTCTL_LIBSTDCXX_LINK_DESC "C++ runtime link unrecorded"
#endif

namespace sftctl::trainer {
namespace {

#ifdef SFTCTL_CHECK_CXX_RUNTIME
struct Checked {
  const char* name;
  void* address;  // what a call from this executable reaches (this file is compiled -fPIC: through the GOT)
};

template <typename Fn>
void* Address(Fn fn) {
  return reinterpret_cast<void*>(fn);
}

// The std::filesystem functions the trainer calls that libstdc++ defines out of line (an inline one
// would have its copy in this executable and prove nothing).
std::vector<Checked> CheckedFunctions() {
  namespace fs = std::filesystem;
  using P = const fs::path&;
  using E = std::error_code&;
  return {
      {"std::filesystem::remove_all(const path&, error_code&)",
       Address(static_cast<std::uintmax_t (*)(P, E)>(&fs::remove_all))},
      {"std::filesystem::remove_all(const path&)",
       Address(static_cast<std::uintmax_t (*)(P)>(&fs::remove_all))},
      {"std::filesystem::remove(const path&, error_code&)",
       Address(static_cast<bool (*)(P, E)>(&fs::remove))},
      {"std::filesystem::rename(const path&, const path&, error_code&)",
       Address(static_cast<void (*)(P, P, E)>(&fs::rename))},
      {"std::filesystem::rename(const path&, const path&)",
       Address(static_cast<void (*)(P, P)>(&fs::rename))},
      {"std::filesystem::create_directories(const path&)",
       Address(static_cast<bool (*)(P)>(&fs::create_directories))},
      {"std::filesystem::create_directories(const path&, error_code&)",
       Address(static_cast<bool (*)(P, E)>(&fs::create_directories))},
      {"std::filesystem::status(const path&)", Address(static_cast<fs::file_status (*)(P)>(&fs::status))},
      {"std::filesystem::status(const path&, error_code&)",
       Address(static_cast<fs::file_status (*)(P, E)>(&fs::status))},
      {"std::filesystem::file_size(const path&, error_code&)",
       Address(static_cast<std::uintmax_t (*)(P, E)>(&fs::file_size))},
      {"std::filesystem::temp_directory_path()",
       Address(static_cast<fs::path (*)()>(&fs::temp_directory_path))},
      {"std::filesystem::current_path()", Address(static_cast<fs::path (*)()>(&fs::current_path))},
  };
}

// The load address of this executable (this file is linked into it, from a static library).
const void* ExecutableBase() {
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&ExecutableBase), &self) == 0) return nullptr;
  return self.dli_fbase;
}

// (No std::filesystem here: it is what may be broken.)
bool IsCxxRuntime(const std::string& object) {
  const size_t slash = object.rfind('/');
  return object.compare(slash == std::string::npos ? 0 : slash + 1, 9, "libstdc++") == 0;
}
#endif  // SFTCTL_CHECK_CXX_RUNTIME

}  // namespace

std::vector<FunctionBinding> FilesystemBindings() {
  std::vector<FunctionBinding> out;
#ifdef SFTCTL_CHECK_CXX_RUNTIME
  const void* exe = ExecutableBase();
  for (const Checked& c : CheckedFunctions()) {
    FunctionBinding b;
    b.function = c.name;
    Dl_info info{};
    if (dladdr(c.address, &info) == 0 || info.dli_fname == nullptr) {
      b.object = "an address no loaded object holds";
    } else {
      b.object = info.dli_fname;
      b.in_runtime = (exe != nullptr && info.dli_fbase == exe) || IsCxxRuntime(b.object);
      if (info.dli_fbase == exe) b.object = "this executable (" + b.object + ")";
    }
    out.push_back(std::move(b));
  }
#endif
  return out;
}

std::string BuildToolchainSummary() {
  return std::string(SFTCTL_CXX_COMPILER_DESC) + ", " + SFTCTL_LIBSTDCXX_LINK_DESC;
}

Status CheckCxxRuntimeBinding() {
  for (const FunctionBinding& b : FilesystemBindings()) {
    if (b.in_runtime) continue;
    return FailedPreconditionError(
        "sftctl-trainer will not run: " + b.function + " binds to " + b.object +
        ", not to the C++ runtime (libstdc++). A pip wheel's LibTorch exports a copy of std::filesystem that "
        "crashes when called (pytorch/pytorch#133437): this trainer would die at its first checkpoint "
        "rotation. It was built with " +
        BuildToolchainSummary() +
        "; trainer/libstdcxx_first.cmake links the C++ runtime ahead of LibTorch and did not take effect. "
        "Fix: build the trainer again in a new build folder with this sftctl's source (on a rented host: "
        "`sftctl bootstrap --host HOST` again), or with CXX set to a compiler whose libstdc++ is shared "
        "(for example CXX=/usr/bin/g++)");
  }
  return OkStatus();
}

}  // namespace sftctl::trainer
