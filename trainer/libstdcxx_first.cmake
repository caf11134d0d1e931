# sftctl_torch: LibTorch as everything that links it (the trainer, its tests, the benches) must link
# it, included from trainer/CMakeLists.txt after find_package(Torch). The one place for this policy.
#
# PyTorch's Linux wheels export the std::filesystem functions of the libstdc++ they link statically
# (pytorch/pytorch#133437), unversioned. The dynamic linker binds a call to the first definition in
# load order, and an executable lists its libraries (NEEDED) in link order, libstdc++ last (g++ adds
# it): our own std::filesystem calls then land in libtorch's copy, which jumped to address 0 on H100
# and H200 hosts (every trainer test, and the trainer at its first checkpoint rotation). So on ELF
# platforms with libstdc++, every executable that links LibTorch names a shared libstdc++ first,
# ahead of its objects and of LibTorch (a link option, placed before the libraries), kept even under
# --as-needed (Ubuntu's default): our calls, and LibTorch's, bind to it whatever LibTorch exports.
# Which shared libstdc++ depends on the compiler (SFTCTL_LIBSTDCXX_KIND):
#   shared       the compiler finds its own libstdc++.so (distribution compilers): `-lstdc++`.
#   static-only  the compiler has only libstdc++.a (custom GCC builds in /opt, some conda
#                toolchains; a GPU image's CXX=/opt/gcc/bin/g++): `-lstdc++` would find the archive,
#                which ahead of the objects pulls nothing in, and the calls would bind to LibTorch.
#                The system's libstdc++.so.6 (what -print-file-name finds, the one LibTorch loads
#                anyway) is named by path instead, once a probe proves it is at least as new as the
#                compiler: a program built with this compiler links against it without pulling a
#                single C++ runtime object from the compiler's archive. Configure fails otherwise.
# The trainer checks at start that its calls bind to the C++ runtime (trainer/runtime/
# cxx_runtime_check.h), so a build that got this wrong refuses to run instead of crashing.
# tests/trainer/wheel_standin/ stands in for such a wheel, and tests/trainer/static_libstdcxx/ for
# such a compiler, in CI. (macOS resolves symbols per library, two-level namespaces: nothing to do
# there; nor with libc++.)
# A target whose SFTCTL_LIBSTDCXX_LAST property is true is linked without the option: the test that
# proves the start-up check refuses a trainer built the wrong way.
add_library(sftctl_torch INTERFACE)
target_link_libraries(sftctl_torch INTERFACE ${TORCH_LIBRARIES})

include(CheckCXXSourceCompiles)
check_cxx_source_compiles("#include <cstddef>\n#ifndef __GLIBCXX__\n#error not libstdc++\n#endif\nint main() {}"
                          SFTCTL_HAS_LIBSTDCXX)

# sftctl_static_runtime_probe(SO_PATH OUT_OK OUT_WHY): builds a program that uses the C++ runtime
# broadly (strings, streams, std::filesystem, threads, exceptions) with SO_PATH ahead of everything;
# OK when it links and defines none of the runtime's own functions (T: each would have come from the
# compiler's archive: SO_PATH is older than the compiler; data such as std::cout may be copied in by
# a copy relocation, B, as from any shared library).
function(sftctl_static_runtime_probe so_path out_ok out_why)
  set(dir ${CMAKE_BINARY_DIR}/CMakeFiles/sftctl_libstdcxx_probe)
  file(WRITE ${dir}/probe.cpp [=[
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
int main(int argc, char** argv) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::temp_directory_path(ec) / "sftctl-probe";
  std::filesystem::create_directories(p, ec);
  std::filesystem::rename(p, p.string() + "-x", ec);
  std::filesystem::remove_all(p.string() + "-x", ec);
  std::ostringstream os;
  os << argc << std::chrono::steady_clock::now().time_since_epoch().count();
  std::thread t([&] { os << argv[0]; });
  t.join();
  try {
    throw std::runtime_error(os.str());
  } catch (const std::exception& e) {
    std::cout << e.what() << std::endl;
  }
  return 0;
}
]=])
  try_compile(linked ${dir}/build ${dir}/probe.cpp
              CMAKE_FLAGS -DCMAKE_CXX_STANDARD=17
              COMPILE_DEFINITIONS -pthread
              LINK_OPTIONS "LINKER:--push-state,--no-as-needed,${so_path},--pop-state" -pthread
              OUTPUT_VARIABLE log
              COPY_FILE ${dir}/probe)
  if(NOT linked)
    set(${out_ok} FALSE PARENT_SCOPE)
    set(${out_why} "a program linked against it failed to link" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND ${CMAKE_NM} --defined-only ${dir}/probe OUTPUT_VARIABLE defined ERROR_QUIET)
  string(REGEX MATCHALL "[0-9a-f]+ T (_ZN?K?St|__cxa_|__gxx_)[A-Za-z0-9_]*" pulled "${defined}")
  list(LENGTH pulled n)
  if(n GREATER 0)
    list(GET pulled 0 first)
    set(${out_ok} FALSE PARENT_SCOPE)
    set(${out_why} "a program linked against it still took ${n} runtime function(s) from the compiler's \
archive (the first: ${first}): it is older than the compiler" PARENT_SCOPE)
    return()
  endif()
  set(${out_ok} TRUE PARENT_SCOPE)
endfunction()

set(SFTCTL_LIBSTDCXX_FIRST OFF)
set(SFTCTL_LIBSTDCXX_KIND "none")
set(SFTCTL_LIBSTDCXX_LINK_DESC "no libstdc++ (nothing to link first)")
if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND SFTCTL_HAS_LIBSTDCXX)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE shared OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${shared}" AND EXISTS "${shared}")
    set(SFTCTL_LIBSTDCXX_KIND "shared")
    set(runtime "-lstdc++")
    set(SFTCTL_LIBSTDCXX_LINK_DESC "libstdc++ shared (-lstdc++)")
  else()
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                    OUTPUT_VARIABLE runtime OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set(fix "Set CXX to a compiler whose libstdc++ is shared (for example CXX=/usr/bin/g++) and configure a \
new build folder")
    if(NOT (IS_ABSOLUTE "${runtime}" AND EXISTS "${runtime}"))
      message(FATAL_ERROR "sftctl: ${CMAKE_CXX_COMPILER} has only a static libstdc++ and no libstdc++.so.6 was \
found beside it (-print-file-name=libstdc++.so.6 printed '${runtime}'): a trainer linked with it would bind \
std::filesystem to a pip wheel's LibTorch copy and crash. ${fix}.")
    endif()
    sftctl_static_runtime_probe("${runtime}" probe_ok probe_why)
    if(NOT probe_ok)
      message(FATAL_ERROR "sftctl: ${CMAKE_CXX_COMPILER} has only a static libstdc++, and the system's \
${runtime} cannot stand in for it: ${probe_why}. ${fix}.")
    endif()
    set(SFTCTL_LIBSTDCXX_KIND "static-only")
    set(SFTCTL_LIBSTDCXX_LINK_DESC "libstdc++ static only (the system's ${runtime} linked first by path)")
  endif()
  # One token (link options are de-duplicated one by one): GNU ld, gold and lld take these flags.
  target_link_options(sftctl_torch INTERFACE
    "$<$<NOT:$<BOOL:$<TARGET_PROPERTY:SFTCTL_LIBSTDCXX_LAST>>>:LINKER:--push-state,--no-as-needed,${runtime},--pop-state>")
  set(SFTCTL_LIBSTDCXX_FIRST ON)
  message(STATUS "sftctl: executables that link LibTorch load the C++ runtime first: ${SFTCTL_LIBSTDCXX_LINK_DESC}")
endif()
set(SFTCTL_CXX_COMPILER_DESC
    "${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} (${CMAKE_CXX_COMPILER})")
