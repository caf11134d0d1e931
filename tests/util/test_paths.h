// The folders of the build under test: where its executables are, the source it was configured from,
// the build folder itself and the tests' temporary folder, as CMake knew them (tests/util/test_paths.cpp.in,
// generated into the build folder and linked into every test program by tests/CMakeLists.txt).
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
// SFTCTL_TEST_TMPDIR (<build>/test-tmp): the base of $TMPDIR for a test program run without one
// (tests/util/tmpdir_guard.cpp); ctest sets TMPDIR to it.
const char* TestTmpDir();

}  // namespace sftctl::testing

#define SFTCTL_BIN_DIR (::sftctl::testing::BinDir())
#define SFTCTL_SOURCE_DIR (::sftctl::testing::SourceDir())
#define SFTCTL_BUILD_DIR (::sftctl::testing::BuildDir())
