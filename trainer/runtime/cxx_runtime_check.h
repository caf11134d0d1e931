// Where this process's std::filesystem calls land, checked before the trainer does anything else.
//
// A pip wheel's libtorch exports its own, statically linked copy of libstdc++'s std::filesystem
// (pytorch/pytorch#133437). A call that binds there crashes: SIGSEGV at the first checkpoint
// rotation, hours into a paid run (seen on H100 and H200 hosts). trainer/libstdcxx_first.cmake links
// every LibTorch executable so that these calls bind to the C++ runtime, whatever compiler built it;
// CheckCxxRuntimeBinding proves at start that it did, and refuses to run when it did not.
//
// On platforms without libstdc++ (macOS's libc++, two-level namespaces) there is nothing to check:
// every function reports OK.
//
// Thread safety: every function is safe to call from any thread (they only read).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::trainer {

struct FunctionBinding {
  std::string function;     // "std::filesystem::remove_all(const path&, error_code&)"
  std::string object;       // the shared library or executable that holds the code the call reaches
  bool in_runtime = false;  // that object is the C++ runtime: libstdc++, or this executable (static)
};

// The object each checked std::filesystem function (the ones the trainer calls: remove_all,
// rename, create_directories, status, ...) resolves to in this process.
std::vector<FunctionBinding> FilesystemBindings();

// "g++ 13.3.0 (/opt/gcc/bin/g++), libstdc++ static only: the system's libstdc++.so.6 linked by
// path": the compiler this trainer was built with and how libstdcxx_first.cmake linked its runtime.
std::string BuildToolchainSummary();

// OK when every binding of FilesystemBindings() is in the C++ runtime. Otherwise
// FAILED_PRECONDITION with one message naming the first function that binds elsewhere, the object
// it binds to, the compiler this trainer was built with (BuildToolchainSummary) and the fix.
Status CheckCxxRuntimeBinding();

}  // namespace sftctl::trainer
