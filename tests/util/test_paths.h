// The folders of the build under test: where its executables are, the source it was configured from,
// and the build folder itself, as CMake knew them (tests/util/test_paths.cpp.in, generated into the
// build folder and linked into every test program by tests/CMakeLists.txt).
//
// Functions, not compile definitions: no test's compile line then names a folder of this checkout,
// so ccache (CCACHE_BASEDIR, CMakeLists.txt) serves the tests' objects to the same source checked out
// anywhere else (CI's checkout). The macros keep the spelling the tests use.
// Thread-safe: each returns a constant string with static storage.
#pragma once

namespace sftctl::testing {

const char* BinDir();     // CMAKE_RUNTIME_OUTPUT_DIRECTORY: sftctl, sftd, sftctl-trainer, tests
const char* SourceDir();  // CMAKE_SOURCE_DIR
const char* BuildDir();   // CMAKE_BINARY_DIR

}  // namespace sftctl::testing

#define SFTCTL_BIN_DIR (::sftctl::testing::BinDir())
#define SFTCTL_SOURCE_DIR (::sftctl::testing::SourceDir())
#define SFTCTL_BUILD_DIR (::sftctl::testing::BuildDir())
