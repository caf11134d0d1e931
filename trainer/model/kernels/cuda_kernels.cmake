# The trainer's fused CUDA kernels (trainer/model/kernels/, docs/performance.md): built where the
# trainer's LibTorch has CUDA and a CUDA compiler is found. Included from the top-level
# CMakeLists.txt right after LibTorch is found (CUDA must be enabled in the directory common to
# every target that links the kernels: the trainer and its tests). Sets SFTCTL_CUDA_KERNELS_ON
# (and SFTCTL_CUDA_KERNELS_BUILT in the cache).
#
#   -DSFTCTL_CUDA_KERNELS=AUTO|ON|OFF   ON fails the configure when they cannot be built
#   -DSFTCTL_CUDA_ARCHITECTURES=...    default 80-real;90-real;90-virtual: SASS for Ampere (A100,
#                                      and the 8.6/8.9 cards, which run 8.0 code) and Hopper, PTX for
#                                      anything newer (compiled by the driver on first use)
set(SFTCTL_CUDA_KERNELS AUTO CACHE STRING "Build the trainer's fused CUDA kernels: AUTO, ON or OFF")
set(SFTCTL_CUDA_ARCHITECTURES "80-real;90-real;90-virtual" CACHE STRING "CUDA architectures of the trainer's kernels")
set(SFTCTL_CUDA_KERNELS_ON OFF)
set(_why "LibTorch has no CUDA")
if(SFTCTL_CUDA_KERNELS STREQUAL "OFF")
  set(_why "SFTCTL_CUDA_KERNELS=OFF")
elseif(CUDA_FOUND OR CUDAToolkit_FOUND OR TORCH_CUDA_LIBRARIES)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The CUDA runtime LibTorch loads (shared), never a second, static one.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    # nvcc's host compiler may be another GCC than CMAKE_CXX_COMPILER (Debian 13's nvcc uses g++-13
    # beside g++-14): its library folder would put that GCC's older libstdc++ on every link line
    # that has a CUDA object, ahead of the C++ compiler's own (undefined __cxa_call_terminate).
    # The toolkit's stub folder (a libcuda.so that only links) must not reach a link either.
    list(FILTER CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES EXCLUDE REGEX "/gcc/|/gcc-lib/|/stubs/?$")
    set(SFTCTL_CUDA_KERNELS_ON ON)
  else()
    set(_why "no CUDA compiler (nvcc) found")
  endif()
endif()
# For scripts that read the cache (bench/gpu/run.sh): whether this build has the kernels.
set(SFTCTL_CUDA_KERNELS_BUILT ${SFTCTL_CUDA_KERNELS_ON} CACHE INTERNAL "whether the fused CUDA kernels are built")
if(SFTCTL_CUDA_KERNELS_ON)
  message(STATUS "sftctl: fused CUDA kernels on (${CMAKE_CUDA_COMPILER}, ${SFTCTL_CUDA_ARCHITECTURES})")
elseif(SFTCTL_CUDA_KERNELS STREQUAL "ON")
  message(FATAL_ERROR "sftctl: SFTCTL_CUDA_KERNELS=ON but the CUDA kernels cannot be built: ${_why}")
else()
  message(STATUS "sftctl: fused CUDA kernels off (${_why})")
endif()

# sftctl_cuda_kernels(TARGET): adds the kernels to TARGET (a trainer library) when they are on.
function(sftctl_cuda_kernels target)
  if(NOT SFTCTL_CUDA_KERNELS_ON)
    return()
  endif()
  target_sources(${target} PRIVATE ${CMAKE_SOURCE_DIR}/trainer/model/kernels/cuda_kernels.cu
                                   ${CMAKE_SOURCE_DIR}/trainer/model/kernels/cublas_gemm.cpp)
  set_source_files_properties(${CMAKE_SOURCE_DIR}/trainer/model/cuda_ops.cpp PROPERTIES COMPILE_DEFINITIONS
                              SFTCTL_CUDA_KERNELS)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${SFTCTL_CUDA_ARCHITECTURES}"
                                             CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  set(options "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>")
  if(SFTCTL_WERROR)
    list(APPEND options "$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>")
  endif()
  target_compile_options(${target} PRIVATE ${options})
endfunction()
