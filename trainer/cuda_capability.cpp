#include "trainer/cuda_capability.h"

#if defined(__linux__)
#include <dlfcn.h>
#endif

namespace sftctl::trainer {

#if defined(__linux__)
namespace {

// The few driver-API entry points used, with the driver's C signatures (cuda.h is not needed:
// CUresult is an int, CUdevice an int, and the attribute numbers are stable ABI).
using CuInit = int (*)(unsigned int);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetAttribute = int (*)(int*, int, int);
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

}  // namespace

std::optional<ComputeCapability> CudaComputeCapability(int index) {
  // The handle is kept: LibTorch has the driver loaded anyway whenever CUDA is in use.
  static void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return std::nullopt;
  auto init = reinterpret_cast<CuInit>(::dlsym(lib, "cuInit"));
  auto device_get = reinterpret_cast<CuDeviceGet>(::dlsym(lib, "cuDeviceGet"));
  auto attribute = reinterpret_cast<CuDeviceGetAttribute>(::dlsym(lib, "cuDeviceGetAttribute"));
  if (init == nullptr || device_get == nullptr || attribute == nullptr) return std::nullopt;
  int device = 0;
  ComputeCapability cc;
  if (init(0) != 0 || device_get(&device, index) != 0 ||
      attribute(&cc.major, kAttrComputeCapabilityMajor, device) != 0 ||
      attribute(&cc.minor, kAttrComputeCapabilityMinor, device) != 0) {
    return std::nullopt;
  }
  return cc;
}

#else

std::optional<ComputeCapability> CudaComputeCapability(int) { return std::nullopt; }

#endif

}  // namespace sftctl::trainer
