#include "trainer/training/gpu_metrics.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <type_traits>
#include <vector>

#include "common/os/host_memory.h"

// The caching allocator's statistics exist only in CUDA builds of LibTorch (trainer/CMakeLists.txt
// defines SFTCTL_TORCH_CUDA there); CPU builds ship the header without the library behind it.
#if defined(SFTCTL_TORCH_CUDA) && __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>
#define SFTCTL_HAVE_CUDA_ALLOCATOR_STATS 1
#else
#define SFTCTL_HAVE_CUDA_ALLOCATOR_STATS 0
#endif

namespace sftctl::trainer {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct GpuPeak {
  const char* name_part;
  double tflops;
};
// Dense bf16 (fp16 where the GPU has no bf16) tensor-core peaks from the vendors' data sheets. The
// first entry whose text the device name contains wins, so specific names come before general ones.
constexpr GpuPeak kGpuPeaks[] = {
    {"B200", 2250}, {"H200", 989},     {"H100 PCIe", 756}, {"H100 NVL", 835}, {"H100", 989}, {"H800", 989},
    {"A100", 312},  {"A800", 312},     {"A10G", 70},       {"A10", 125},      {"L40S", 362}, {"L40", 181},
    {"L4", 121},    {"RTX 4090", 165}, {"V100", 125},      {"T4", 65},
};

}  // namespace

std::optional<double> PeakTflopsForGpu(std::string_view name) {
  for (const GpuPeak& p : kGpuPeaks) {
    if (name.find(p.name_part) != std::string_view::npos) return p.tflops;
  }
  return std::nullopt;
}

double TrainFlopsPerToken(const FlopsModel& m) {
  const double n = static_cast<double>(m.matmul_params);
  const double nt = static_cast<double>(std::min(m.trainable_params, m.matmul_params));
  const double attention = 12.0 * m.layers * static_cast<double>(m.attention_width) * m.seq_len;
  return 4.0 * n + 2.0 * nt + attention;
}

namespace {

// head_dim, or its default for a config built without one (hidden_size / heads).
int64_t HeadDim(const ModelConfig& c) {
  return c.head_dim > 0 ? c.head_dim : c.hidden_size / std::max<int64_t>(1, c.num_attention_heads);
}

}  // namespace

int64_t MatmulParams(const ModelConfig& c) {
  const int64_t head_dim = HeadDim(c);
  const int64_t kv_heads = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const int64_t q = c.num_attention_heads * head_dim, kv = kv_heads * head_dim;
  const int64_t layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size;
  return c.num_hidden_layers * layer + c.vocab_size * c.hidden_size;
}

double ModelFlopsUtilisation(double tokens_per_s, double flops_per_token, double peak_tflops) {
  if (peak_tflops <= 0) return 0;
  return tokens_per_s * flops_per_token / (peak_tflops * 1e12);
}

std::string NvmlDeviceFor(int cuda_index, const char* visible) {
  if (cuda_index < 0) return "";
  if (visible == nullptr) return std::to_string(cuda_index);
  std::vector<std::string> entries;
  std::stringstream in(visible);
  for (std::string e; std::getline(in, e, ',');) {
    const size_t b = e.find_first_not_of(" \t"), end = e.find_last_not_of(" \t");
    entries.push_back(b == std::string::npos ? "" : e.substr(b, end - b + 1));
  }
  if (static_cast<size_t>(cuda_index) >= entries.size()) return "";
  const std::string& e = entries[cuda_index];
  if (e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0) return e;
  if (e.empty()) return "";
  for (char c : e) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return "";
  }
  return e;
}

// The NVML functions used, with NVML's C signatures (nvmlReturn_t is an int; 0 is success).
struct Nvml::Api {
  using Device = void*;
  struct Utilization {
    unsigned int gpu, memory;
  };
  void* handle = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_index)(unsigned int, Device*) = nullptr;
  int (*by_uuid)(const char*, Device*) = nullptr;
  int (*name)(Device, char*, unsigned int) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*power)(Device, unsigned int*) = nullptr;  // milliwatts
};

std::unique_ptr<Nvml> Nvml::Load(const std::string& library) {
  auto api = std::make_unique<Api>();
  api->handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api->handle == nullptr) return nullptr;
  auto sym = [&](const char* name, auto* fn) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(api->handle, name));
    return *fn != nullptr;
  };
  const bool all = sym("nvmlInit_v2", &api->init) && sym("nvmlShutdown", &api->shutdown) &&
                   sym("nvmlDeviceGetHandleByIndex_v2", &api->by_index) &&
                   sym("nvmlDeviceGetHandleByUUID", &api->by_uuid) && sym("nvmlDeviceGetName", &api->name) &&
                   sym("nvmlDeviceGetUtilizationRates", &api->utilization) &&
                   sym("nvmlDeviceGetPowerUsage", &api->power);
  if (!all || api->init() != 0) {
    ::dlclose(api->handle);
    return nullptr;
  }
  return std::unique_ptr<Nvml>(new Nvml(std::move(api)));
}

Nvml::Nvml(std::unique_ptr<Api> api) : api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  ::dlclose(api_->handle);
}

Nvml::Reading Nvml::Read(const std::string& device) const {
  Reading r;
  Api::Device d = nullptr;
  if (device.empty()) return r;
  const int rc =
      device.rfind("GPU-", 0) == 0 || device.rfind("MIG-", 0) == 0
          ? api_->by_uuid(device.c_str(), &d)
          : api_->by_index(static_cast<unsigned int>(std::strtoul(device.c_str(), nullptr, 10)), &d);
  if (rc != 0) return r;
  char name[96] = {};
  if (api_->name(d, name, sizeof(name)) == 0) r.name = std::string(name);
  Api::Utilization u{};
  if (api_->utilization(d, &u) == 0) r.util_pct = u.gpu;
  unsigned int mw = 0;
  if (api_->power(d, &mw) == 0) r.power_w = mw / 1000.0;
  return r;
}

ResourceMetrics::Options ResourceOptionsFor(const ModelConfig& c, int64_t params, int64_t trainable,
                                            int64_t seq_len, bool cuda, int cuda_index,
                                            double peak_override) {
  FlopsModel m;
  const bool adapters = trainable < params;  // LoRA: the trainable adapters are extra matmuls
  m.matmul_params = MatmulParams(c) + (adapters ? trainable : 0);
  m.trainable_params = adapters ? trainable : m.matmul_params;
  m.layers = c.num_hidden_layers;
  m.attention_width = c.num_attention_heads * HeadDim(c);
  m.seq_len = seq_len;
  ResourceMetrics::Options o;
  o.cuda = cuda;
  o.cuda_index = cuda_index;
  o.flops_per_token = TrainFlopsPerToken(m);
  o.peak_tflops = peak_override;
  return o;
}

ResourceMetrics::ResourceMetrics(const Options& o) : o_(o), peak_tflops_(o.peak_tflops) {
  if (!o_.cuda) return;
  nvml_ = Nvml::Load(o_.nvml_library);
  nvml_device_ = NvmlDeviceFor(o_.cuda_index, std::getenv("CUDA_VISIBLE_DEVICES"));
  if (peak_tflops_ <= 0 && nvml_) {
    const Nvml::Reading r = nvml_->Read(nvml_device_);
    if (r.name) peak_tflops_ = PeakTflopsForGpu(*r.name).value_or(0);
  }
}

ResourceMetrics::~ResourceMetrics() = default;

namespace {

// The CUDA caching allocator's figures for device `index`, when this process sees that device and
// the allocator has a pool for it. LibTorch sets the pools up when it initialises CUDA in the
// process (its first CUDA tensor); until then the allocator answers "Invalid device argument" for
// every device (seen on an H100, in a test process that had made no CUDA tensor): omitted then,
// like any figure that cannot be read.
void AddAllocatorStats(int index, nlohmann::json* record) {
#if SFTCTL_HAVE_CUDA_ALLOCATOR_STATS
  if (index < 0 || static_cast<size_t>(index) >= torch::cuda::device_count()) return;
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
    nlohmann::json& r = *record;
    r["gpu_mem_allocated_mb"] = static_cast<double>(stats.allocated_bytes[0].current) / kMiB;  // 0: aggregate
    r["gpu_mem_reserved_mb"] = static_cast<double>(stats.reserved_bytes[0].current) / kMiB;
    r["gpu_mem_peak_mb"] = static_cast<double>(stats.allocated_bytes[0].peak) / kMiB;
  } catch (const c10::Error&) {
    // no pool for the device yet: nothing allocated, nothing to report
  }
#else
  (void)index;
  (void)record;
#endif
}

}  // namespace

void ResourceMetrics::AddTo(nlohmann::json* record) const {
  nlohmann::json& r = *record;
  r["rss_mb"] = static_cast<double>(ResidentBytes()) / kMiB;
  if (!o_.cuda) return;
  AddAllocatorStats(o_.cuda_index, record);
  if (nvml_) {
    const Nvml::Reading n = nvml_->Read(nvml_device_);
    if (n.util_pct) r["gpu_util_pct"] = *n.util_pct;
    if (n.power_w) r["gpu_power_w"] = *n.power_w;
  }
  auto num = [&](const char* k) { return r.contains(k) && r[k].is_number() ? r[k].get<double>() : 0.0; };
  const double step_s = num("step_s");
  const double tps = step_s > 0 ? num("tokens") / step_s : num("tokens_per_s");
  if (peak_tflops_ > 0 && o_.flops_per_token > 0 && tps > 0)
    r["mfu"] = ModelFlopsUtilisation(tps, o_.flops_per_token, peak_tflops_);
}

void ResourceMetrics::AddMfuInputsTo(nlohmann::json* record) const {
  (*record)["flops_per_token"] = o_.flops_per_token;
  if (peak_tflops_ > 0) (*record)["gpu_peak_tflops"] = peak_tflops_;
}

}  // namespace sftctl::trainer
