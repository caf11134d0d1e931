# How the fused CPU kernels run in parallel (trainer/runtime/parallel.h), included by trainer/CMakeLists.txt
# after find_package(Torch). Exactly one of:
#   openmp       LibTorch is built with OpenMP and the compiler has OpenMP for the same runtime:
#                at::parallel_for on LibTorch's own OpenMP threads (Linux: GCC + libgomp; macOS:
#                Homebrew's pytorch with Homebrew's libomp, or a wheel that ships libomp + omp.h).
#   aten-native  LibTorch uses its native thread pool: at::parallel_for, no OpenMP needed.
#   pool         otherwise (AppleClang without a usable libomp): trainer/runtime/parallel.cpp's own pool.
# It never brings in a second OpenMP runtime next to LibTorch's (on macOS two libomp copies in one
# process abort: "OMP: Error #15").

find_file(SFTCTL_ATEN_CONFIG_H ATen/Config.h PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
if(NOT SFTCTL_ATEN_CONFIG_H)
  message(FATAL_ERROR "sftctl: ATen/Config.h not found in TORCH_INCLUDE_DIRS (${TORCH_INCLUDE_DIRS})")
endif()
file(STRINGS ${SFTCTL_ATEN_CONFIG_H} _sftctl_aten_omp REGEX "^#define AT_PARALLEL_OPENMP 1")
file(STRINGS ${SFTCTL_ATEN_CONFIG_H} _sftctl_aten_native REGEX "^#define AT_PARALLEL_NATIVE(_TBB)? 1")

# On macOS: the libomp LibTorch itself loads (its libtorch_cpu's load command), and the omp.h
# beside it, handed to FindOpenMP so that AppleClang's -Xpreprocessor -fopenmp uses that copy.
function(sftctl_hint_torch_libomp)
  find_library(_torch_cpu torch_cpu HINTS ${TORCH_INSTALL_PREFIX}/lib NO_DEFAULT_PATH)
  find_program(_otool otool)
  if(NOT _torch_cpu OR NOT _otool)
    return()
  endif()
  execute_process(COMMAND ${_otool} -L ${_torch_cpu} OUTPUT_VARIABLE _deps ERROR_QUIET)
  string(REGEX MATCH "[^\t\n ]*libomp[^\t\n ]*\\.dylib" _omp "${_deps}")
  if(_omp MATCHES "^@")  # @rpath/@loader_path: the copy a wheel ships beside libtorch_cpu
    get_filename_component(_omp_name ${_omp} NAME)
    get_filename_component(_torch_lib ${_torch_cpu} DIRECTORY)
    set(_omp ${_torch_lib}/${_omp_name})
  endif()
  if(NOT _omp OR NOT EXISTS ${_omp})
    return()
  endif()
  get_filename_component(_omp_dir ${_omp} DIRECTORY)
  find_path(_omp_include omp.h HINTS ${_omp_dir}/../include ${TORCH_INSTALL_PREFIX}/include NO_DEFAULT_PATH)
  if(_omp_include)
    set(OpenMP_CXX_FLAGS "-Xpreprocessor -fopenmp -I${_omp_include}" CACHE STRING "LibTorch's libomp")
    set(OpenMP_CXX_LIB_NAMES omp CACHE STRING "LibTorch's libomp")
    set(OpenMP_omp_LIBRARY ${_omp} CACHE FILEPATH "LibTorch's libomp")
  endif()
endfunction()

set(SFTCTL_PARALLEL_BACKEND pool)
if(_sftctl_aten_omp)
  if(APPLE AND CMAKE_CXX_COMPILER_ID STREQUAL "AppleClang" AND NOT OpenMP_CXX_FLAGS)
    sftctl_hint_torch_libomp()
  endif()
  find_package(OpenMP COMPONENTS CXX)
  if(OpenMP_CXX_FOUND)
    set(SFTCTL_PARALLEL_BACKEND openmp)
  endif()
elseif(_sftctl_aten_native)
  set(SFTCTL_PARALLEL_BACKEND aten-native)
endif()

if(SFTCTL_PARALLEL_BACKEND STREQUAL "openmp")
  # at::parallel_for is a header template over `#pragma omp parallel`: parallel.cpp needs the
  # OpenMP flags, and the runtime is the one LibTorch links already.
  target_link_libraries(sftctl_trainer_runtime PRIVATE OpenMP::OpenMP_CXX)
endif()
if(NOT SFTCTL_PARALLEL_BACKEND STREQUAL "pool")
  # parallel.cpp stops the build if at::parallel_for turns out serial there after all.
  set_property(SOURCE runtime/parallel.cpp APPEND PROPERTY COMPILE_DEFINITIONS SFTCTL_PARALLEL_ATEN)
endif()
message(STATUS "sftctl: fused CPU kernels run on the '${SFTCTL_PARALLEL_BACKEND}' parallel backend"
               " (trainer/runtime/parallel.h; SFTCTL_PARALLEL=pool selects the pool at run time)")
