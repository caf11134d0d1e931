// Resource figures of a training step, added to its metrics.jsonl record (docs/observability.md):
//   rss_mb                                   this process's resident set (common/os/host_memory.h), always
//   gpu_mem_allocated_mb, gpu_mem_reserved_mb, gpu_mem_peak_mb
//                                            the CUDA caching allocator of the training device (CUDA
//                                            builds of LibTorch, on a CUDA device only)
//   gpu_util_pct, gpu_power_w                NVML, loaded at run time with dlopen("libnvidia-ml.so.1");
//                                            no library, no symbol or no device: omitted, never an error
//   mfu                                      model FLOPs utilisation of the step: its tokens / its
//                                            seconds (step_s) x FLOPs per token (TrainFlopsPerToken) /
//                                            the GPU's peak (a table of common GPUs by NVML name, or
//                                            the spec's metrics.gpu_peak_tflops); omitted when unknown
// The one MFU: `sftctl status`, `logs`, the TensorBoard scalars and bench/gpu show or average this
// field; bench/gpu applies the start record's flops_per_token and gpu_peak_tflops (AddMfuInputsTo)
// to the reference it runs beside the trainer.
// Nothing here links a library: NVML is reached through dlopen, the allocator through LibTorch.
//
// Thread safety: the free functions are pure; a ResourceMetrics or Nvml is used by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "trainer/model/model_config.h"

namespace sftctl::trainer {

// The dense bf16 tensor-core peak in TFLOP/s of a GPU named `name` (NVML's or CUDA's device name, e.g.
// "NVIDIA H100 80GB HBM3"); nullopt for a GPU the table does not know.
std::optional<double> PeakTflopsForGpu(std::string_view name);

// Training FLOPs per token: 2 N forward and 2 N backward through the activations, 2 N_t for the weight
// gradients (N: parameters that multiply activations, N_t: those that train), and 12 L d T for
// attention scores and values (L layers, d = heads x head_dim, T the sequence length). That is
// PaLM's count (appendix B), 6 N + 12 L d T for a full fine-tune: attention counted over the whole
// T x T square, not the causal half, as PaLM, Megatron and torchtitan report it.
struct FlopsModel {
  int64_t matmul_params = 0;     // N
  int64_t trainable_params = 0;  // N_t (at most N)
  int64_t layers = 0;
  int64_t attention_width = 0;  // heads x head_dim
  int64_t seq_len = 0;
};
double TrainFlopsPerToken(const FlopsModel& m);

// The parameters of the weight matrices that multiply activations: q, k, v, o and the three MLP
// projections of every layer, and the LM head (the embedding matrix when tied). Not the embedding
// lookup, norms or biases.
int64_t MatmulParams(const ModelConfig& c);

// tokens_per_s x flops_per_token / (peak_tflops x 1e12), as a fraction; 0 when peak_tflops <= 0.
double ModelFlopsUtilisation(double tokens_per_s, double flops_per_token, double peak_tflops);

// The NVML device that CUDA device `cuda_index` is, given CUDA_VISIBLE_DEVICES (`visible`, null when
// unset): its NVML index as text, or a UUID ("GPU-..."); empty when the list does not name it.
std::string NvmlDeviceFor(int cuda_index, const char* visible);

// NVML through dlopen. Thread safety: one thread.
class Nvml {
 public:
  // nullptr when `library` cannot be loaded, lacks a function used here, or nvmlInit fails.
  static std::unique_ptr<Nvml> Load(const std::string& library = "libnvidia-ml.so.1");
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  struct Reading {
    std::optional<std::string> name;
    std::optional<double> util_pct;  // GPU busy percentage over NVML's last sample period
    std::optional<double> power_w;
  };
  // `device`: NvmlDeviceFor's result. Fields NVML cannot read are empty.
  Reading Read(const std::string& device) const;

 private:
  struct Api;
  explicit Nvml(std::unique_ptr<Api> api);
  std::unique_ptr<Api> api_;
};

class ResourceMetrics {
 public:
  struct Options {
    bool cuda = false;  // training on a CUDA device
    int cuda_index = 0;
    double flops_per_token = 0;
    double peak_tflops = 0;  // the spec's override; 0: PeakTflopsForGpu of the NVML name
    std::string nvml_library = "libnvidia-ml.so.1";
  };
  explicit ResourceMetrics(const Options& o);
  ~ResourceMetrics();

  // Adds the fields above to `record` (a "step" record; its tokens and step_s give mfu; a record
  // without step_s falls back to its tokens_per_s).
  void AddTo(nlohmann::json* record) const;
  // Adds flops_per_token, and gpu_peak_tflops when known, to `record` (the run's "start" record).
  void AddMfuInputsTo(nlohmann::json* record) const;

 private:
  Options o_;
  std::unique_ptr<Nvml> nvml_;
  std::string nvml_device_;
  double peak_tflops_ = 0;
};

// A run's options: FLOPs per token from the model's shape (`seq_len`: the spec's data.max_seq_len, so
// the attention term is an upper bound for shorter samples) and its trainable count (`trainable` <
// `params`: a LoRA run, whose trainable adapters multiply activations too and alone get weight
// gradients), the device, and the spec's metrics.gpu_peak_tflops (0: the table).
ResourceMetrics::Options ResourceOptionsFor(const ModelConfig& c, int64_t params, int64_t trainable,
                                            int64_t seq_len, bool cuda, int cuda_index, double peak_override);

}  // namespace sftctl::trainer
