# sftctl_torch: LibTorch as everything that links it (the trainer, its tests, the benches) must link
# it, included from trainer/CMakeLists.txt after find_package(Torch). The one place for this policy.
#
# PyTorch's Linux wheels export the std::filesystem functions of the libstdc++ they link statically
# (pytorch/pytorch#133437), unversioned. The dynamic linker binds a call to the first definition in
# load order, and an executable lists its libraries (NEEDED) in link order, libstdc++ last (g++ adds
# it): our own std::filesystem calls then land in libtorch's copy, which jumped to address 0 on an
# H100 host (every trainer test, and the trainer at its first checkpoint rotation). So on ELF
# platforms with libstdc++, every executable that links LibTorch names the system libstdc++ first,
# ahead of its objects and of LibTorch (a link option, placed before the libraries), kept even under
# --as-needed (Ubuntu's default): our calls, and LibTorch's, bind to the system library whatever
# LibTorch exports. tests/trainer/wheel_standin/ stands in for such a wheel and proves it in CI.
# (macOS resolves symbols per library, two-level namespaces: nothing to do there; nor with libc++.)
add_library(sftctl_torch INTERFACE)
target_link_libraries(sftctl_torch INTERFACE ${TORCH_LIBRARIES})

include(CheckCXXSourceCompiles)
check_cxx_source_compiles("#include <cstddef>\n#ifndef __GLIBCXX__\n#error not libstdc++\n#endif\nint main() {}"
                          SFTCTL_HAS_LIBSTDCXX)
if(CMAKE_SYSTEM_NAME STREQUAL "Linux" AND SFTCTL_HAS_LIBSTDCXX)
  # One token (link options are de-duplicated one by one): GNU ld, gold and lld take these flags.
  target_link_options(sftctl_torch INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
  set(SFTCTL_LIBSTDCXX_FIRST ON)
  message(STATUS "sftctl: executables that link LibTorch load the system libstdc++ first")
else()
  set(SFTCTL_LIBSTDCXX_FIRST OFF)
endif()
