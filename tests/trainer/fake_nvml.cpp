// A stand-in for libnvidia-ml.so.1 with the functions trainer/training/gpu_metrics.cpp looks up: one GPU,
// index 0 or UUID "GPU-fake", named like an H100 SXM, 87% busy, drawing 312.5 W. Anything else is
// NVML_ERROR_NOT_FOUND (6). Built as a shared library for gpu_metrics_test.
#include <cstring>

namespace {
int g_device = 0;  // the handle handed out: &g_device
}  // namespace

extern "C" {

int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index != 0) return 6;
  *device = &g_device;
  return 0;
}

int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  if (std::strcmp(uuid, "GPU-fake") != 0) return 6;
  *device = &g_device;
  return 0;
}

int nvmlDeviceGetName(void* device, char* name, unsigned int length) {
  if (device != &g_device) return 6;
  std::strncpy(name, "NVIDIA H100 80GB HBM3", length - 1);
  name[length - 1] = '\0';
  return 0;
}

struct Utilization {
  unsigned int gpu, memory;
};

int nvmlDeviceGetUtilizationRates(void* device, Utilization* u) {
  if (device != &g_device) return 6;
  u->gpu = 87;
  u->memory = 40;
  return 0;
}

int nvmlDeviceGetPowerUsage(void* device, unsigned int* milliwatts) {
  if (device != &g_device) return 6;
  *milliwatts = 312500;
  return 0;
}

}  // extern "C"
