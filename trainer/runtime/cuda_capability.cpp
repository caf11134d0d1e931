#include "trainer/runtime/cuda_capability.h"

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
using CuDeviceTotalMem = int (*)(size_t*, int);
using CuIntQuery = int (*)(int*);  // cuDeviceGetCount, cuDriverGetVersion
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;

// The driver, loaded once and kept (LibTorch has it loaded anyway whenever CUDA is in use), and
// initialised; null when absent or when cuInit fails.
void* Driver() {
  static void* lib = [] {
    void* l = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    auto init = l ? reinterpret_cast<CuInit>(::dlsym(l, "cuInit")) : nullptr;
    return init != nullptr && init(0) == 0 ? l : nullptr;
  }();
  return lib;
}

// The driver's handle of device `index`, or -1.
int DeviceHandle(void* lib, int index) {
  auto device_get = reinterpret_cast<CuDeviceGet>(::dlsym(lib, "cuDeviceGet"));
  int device = -1;
  return device_get != nullptr && device_get(&device, index) == 0 ? device : -1;
}

}  // namespace

std::optional<ComputeCapability> CudaComputeCapability(int index) {
  void* lib = Driver();
  if (lib == nullptr) return std::nullopt;
  auto attribute = reinterpret_cast<CuDeviceGetAttribute>(::dlsym(lib, "cuDeviceGetAttribute"));
  const int device = DeviceHandle(lib, index);
  ComputeCapability cc;
  if (attribute == nullptr || device < 0 || attribute(&cc.major, kAttrComputeCapabilityMajor, device) != 0 ||
      attribute(&cc.minor, kAttrComputeCapabilityMinor, device) != 0) {
    return std::nullopt;
  }
  return cc;
}

std::optional<int64_t> CudaTotalMemory(int index) {
  void* lib = Driver();
  if (lib == nullptr) return std::nullopt;
  auto total_mem = reinterpret_cast<CuDeviceTotalMem>(::dlsym(lib, "cuDeviceTotalMem_v2"));
  const int device = DeviceHandle(lib, index);
  size_t bytes = 0;
  if (total_mem == nullptr || device < 0 || total_mem(&bytes, device) != 0) return std::nullopt;
  return static_cast<int64_t>(bytes);
}

std::optional<CudaDriverInfo> CudaDriver() {
  void* lib = Driver();
  if (lib == nullptr) return std::nullopt;
  auto count = reinterpret_cast<CuIntQuery>(::dlsym(lib, "cuDeviceGetCount"));
  auto version = reinterpret_cast<CuIntQuery>(::dlsym(lib, "cuDriverGetVersion"));
  CudaDriverInfo info;
  if (count == nullptr || count(&info.devices) != 0) return std::nullopt;
  if (version == nullptr || version(&info.cuda_version) != 0) info.cuda_version = 0;
  return info;
}

#else

std::optional<ComputeCapability> CudaComputeCapability(int) { return std::nullopt; }
std::optional<int64_t> CudaTotalMemory(int) { return std::nullopt; }
std::optional<CudaDriverInfo> CudaDriver() { return std::nullopt; }

#endif

}  // namespace sftctl::trainer
