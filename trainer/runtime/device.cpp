#include "trainer/runtime/device.h"

#include <ATen/autocast_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

namespace sftctl::trainer {

bool CpuHasNativeBf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0 && line.rfind("Features", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::string w;
    while (words >> w) {
      if (w == "avx512_bf16" || w == "amx_bf16" || w == "bf16") return true;
    }
    return false;
  }
  return false;
}

StatusOr<DevicePlan> ChooseDevice(const std::string& device, const std::string& precision) {
  DevicePlan plan;
  const bool has_cuda = torch::cuda::is_available();
  const bool has_mps = at::hasMPS();
  if (device == "auto") {
    plan.device = has_cuda  ? torch::Device(torch::kCUDA, 0)
                  : has_mps ? torch::Device(torch::kMPS)
                            : torch::kCPU;
  } else if (device.rfind("cuda", 0) == 0) {
    if (!has_cuda)
      return FailedPreconditionError("field 'device': '" + device + "' requested but CUDA is not available");
    int index = 0;
    if (device.size() > 5 && device[4] == ':') index = std::stoi(device.substr(5));
    if (index >= static_cast<int>(torch::cuda::device_count())) {
      return FailedPreconditionError("field 'device': '" + device + "' but only " +
                                     std::to_string(torch::cuda::device_count()) + " CUDA device(s) exist");
    }
    plan.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  } else if (device == "mps") {
    if (!has_mps) return FailedPreconditionError("field 'device': 'mps' requested but MPS is not available");
    plan.device = torch::Device(torch::kMPS);
  } else {
    plan.device = torch::kCPU;
  }
  if (device == "auto" && !has_cuda && !has_mps) {
    if (const std::optional<CudaDriverInfo> driver = CudaDriver()) {
      plan.warning = CudaFallbackWarning(driver->devices, driver->cuda_version, LibTorchCudaVersion(),
                                         /*torch_cuda_usable=*/false);
    }
  }

  const std::optional<ComputeCapability> cc =
      plan.device.is_cuda() ? CudaComputeCapability(plan.device.index()) : std::nullopt;
  SFT_RETURN_IF_ERROR(PickPrecision(precision, plan.device.is_cpu() && CpuHasNativeBf16(), cc, &plan));
  return plan;
}

StatusOr<std::string> RankDevice(const std::string& device, int world_size, int local_rank,
                                 int local_world_size, int cuda_visible) {
  if (world_size <= 1) return device;
  if (device == "cuda" || (device == "auto" && cuda_visible > 0)) {
    // Fewer GPUs than ranks on this host: the launcher gave each rank its own.
    return cuda_visible >= local_world_size ? "cuda:" + std::to_string(local_rank) : std::string("cuda:0");
  }
  if (device.rfind("cuda:", 0) == 0 && local_world_size > 1) {
    return InvalidArgumentError(fmt::format(
        "field 'device': '{}' would put all {} ranks of this host on one GPU; use 'cuda' or "
        "'auto' (each rank takes the GPU of its LOCAL_RANK, or the one GPU its launcher shows it)",
        device, local_world_size));
  }
  return device;
}

std::string CudaVersionText(long version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::optional<long> LibTorchCudaVersion() {
  try {
    return at::detail::getCUDAHooks().versionCUDART();
  } catch (const c10::Error&) {
    return std::nullopt;  // no ATen CUDA library: a CPU-only LibTorch
  }
}

std::string CudaFallbackWarning(int driver_gpus, int driver_cuda, std::optional<long> libtorch_cuda,
                                bool torch_cuda_usable) {
  if (driver_gpus <= 0 || torch_cuda_usable) return "";
  const std::string driver_text = driver_cuda > 0
                                      ? "its driver supports CUDA up to " + CudaVersionText(driver_cuda)
                                      : "its driver version unknown";
  std::string s = fmt::format(
      "device 'auto' falls back to the CPU although the CUDA driver reports {} GPU(s) ({}): ", driver_gpus,
      driver_text);
  if (!libtorch_cuda) {
    return s +
           "this LibTorch was built without CUDA. Build sftctl-trainer against a CUDA LibTorch "
           "(docs/portability.md, --preset trainer-only), or set device: cpu to silence this";
  }
  s += "this LibTorch is built for CUDA " + CudaVersionText(*libtorch_cuda);
  if (driver_cuda > 0 && *libtorch_cuda / 1000 > driver_cuda / 1000) {
    return s + ", newer than the driver supports. Update the NVIDIA driver, or build against a LibTorch " +
           "for CUDA " + std::to_string(driver_cuda / 1000) + ".x";
  }
  return s + " and could not initialise it (check nvidia-smi, CUDA_VISIBLE_DEVICES and the " +
         "driver's kernel module)";
}

void MakeDeviceCurrent(const DevicePlan& plan) {
  if (!plan.device.is_cuda() || !plan.device.has_index()) return;
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(plan.device);
}

void ConfigureDeterminism(bool deterministic) {
  if (!deterministic) return;
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
}

Status PickPrecision(const std::string& precision, bool cpu_native_bf16,
                     const std::optional<ComputeCapability>& cuda_cc, DevicePlan* plan) {
  const torch::Device& d = plan->device;
  const bool cuda_bf16 = !cuda_cc || cuda_cc->major >= 8;
  const std::string cc_text = cuda_cc ? fmt::format("{}.{}", cuda_cc->major, cuda_cc->minor) : "unknown";
  if (precision == "bf16") {
    if (d.is_mps())
      return FailedPreconditionError("field 'precision': bf16 is not supported on MPS; use fp32");
    plan->bf16 = true;
    plan->reason = "bf16 requested";
    if (d.is_cuda() && !cuda_bf16)
      plan->reason += " (compute capability " + cc_text + " emulates bf16 slowly; fp16 is native there)";
  } else if (precision == "fp16") {
    if (!d.is_cuda()) {
      return FailedPreconditionError("field 'precision': fp16 (with loss scaling) needs a CUDA device; on " +
                                     d.str() + " use fp32" + (d.is_cpu() ? " or bf16" : ""));
    }
    plan->fp16 = plan->loss_scaling = true;
    plan->reason = "fp16 requested: fp16 autocast with dynamic loss scaling";
  } else if (precision == "fp32") {
    plan->reason = "fp32 requested";
  } else if (d.is_cuda() && !cuda_bf16) {
    plan->fp16 = plan->loss_scaling = true;
    plan->reason = "CUDA compute capability " + cc_text +
                   " has no bf16: fp16 autocast with dynamic loss scaling, fp32 master weights";
  } else if (d.is_cuda()) {
    plan->bf16 = true;
    plan->reason = "CUDA: bf16 autocast with fp32 master weights";
  } else if (d.is_mps()) {
    plan->reason = "MPS: fp32 (fp16/bf16 autocast is unreliable there)";
  } else if (cpu_native_bf16) {
    plan->bf16 = true;
    plan->reason =
        "CPU with native bf16: bf16 autocast (measured not to hurt learning, see docs/precision.md)";
  } else {
    plan->reason = "CPU without native bf16: fp32";
  }
  return OkStatus();
}

// LibTorch 2.4 made autocast device-generic and deprecated the per-device calls (a -Werror build
// against 2.6 fails on them); 1.13 (Debian 12) has only those. The version split lives here.
#if defined(TORCH_VERSION_MAJOR) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))
#define SFTCTL_GENERIC_AUTOCAST 1
#else
#define SFTCTL_GENERIC_AUTOCAST 0
#endif

namespace {

void SetAutocast(at::DeviceType type, bool on, at::ScalarType dtype) {
#if SFTCTL_GENERIC_AUTOCAST
  if (on) at::autocast::set_autocast_dtype(type, dtype);
  at::autocast::set_autocast_enabled(type, on);
#else
  if (type == at::kCPU) {
    if (on) at::autocast::set_autocast_cpu_dtype(dtype);
    at::autocast::set_cpu_enabled(on);
  } else {
    if (on) at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(on);
  }
#endif
}

}  // namespace

bool AutocastEnabled(at::DeviceType type) {
#if SFTCTL_GENERIC_AUTOCAST
  return at::autocast::is_autocast_enabled(type);
#else
  return type == at::kCPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
#endif
}

at::ScalarType AutocastDtype(at::DeviceType type) {
#if SFTCTL_GENERIC_AUTOCAST
  return at::autocast::get_autocast_dtype(type);
#else
  return type == at::kCPU ? at::autocast::get_autocast_cpu_dtype() : at::autocast::get_autocast_gpu_dtype();
#endif
}

AutocastState CurrentAutocast() {
  AutocastState s;
  s.cpu = AutocastEnabled(at::kCPU);
  s.cpu_dtype = AutocastDtype(at::kCPU);
  s.cuda = AutocastEnabled(at::kCUDA);
  s.cuda_dtype = AutocastDtype(at::kCUDA);
  s.cache = at::autocast::is_autocast_cache_enabled();
  return s;
}

namespace {
void ApplyAutocast(const AutocastState& s) {
  SetAutocast(at::kCPU, s.cpu, s.cpu_dtype);
  SetAutocast(at::kCUDA, s.cuda, s.cuda_dtype);
  at::autocast::set_autocast_cache_enabled(s.cache);
}
}  // namespace

AutocastRestore::AutocastRestore(const AutocastState& state) : saved_(CurrentAutocast()) {
  ApplyAutocast(state);
}

AutocastRestore::~AutocastRestore() { ApplyAutocast(saved_); }

void SetAutocastCache(bool enabled) { at::autocast::set_autocast_cache_enabled(enabled); }

AutocastScope::AutocastScope(const DevicePlan& plan) {
  if (!plan.bf16 && !plan.fp16) return;
  const at::ScalarType dtype = plan.fp16 ? at::kHalf : at::kBFloat16;
  if (plan.device.is_cpu()) {
    cpu_ = true;
    SetAutocast(at::kCPU, true, dtype);
  } else if (plan.device.is_cuda()) {
    cuda_ = true;
    SetAutocast(at::kCUDA, true, dtype);
  }
}

AutocastScope::~AutocastScope() {
  if (cpu_) SetAutocast(at::kCPU, false, at::kBFloat16);
  if (cuda_) SetAutocast(at::kCUDA, false, at::kBFloat16);
}

void ClearAutocastCache() { at::autocast::clear_cache(); }

int ConfigureThreads(int64_t requested, int local_ranks) {
  int n = requested > 0 ? static_cast<int>(requested)
                        : static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, local_ranks);
  if (n <= 0) n = 1;
  torch::set_num_threads(n);
  return torch::get_num_threads();
}

}  // namespace sftctl::trainer
