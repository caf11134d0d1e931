#include "trainer/runtime/rng_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace sftctl::trainer {
namespace {

torch::Tensor GetState(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void SetState(at::Generator gen, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The default generator of a CUDA device, through ATen's CUDA hooks (no CUDA headers needed).
at::Generator CudaGenerator(const torch::Device& device) {
  return at::globalContext().defaultGenerator(
      torch::Device(torch::kCUDA, device.has_index() ? device.index() : static_cast<c10::DeviceIndex>(0)));
}

}  // namespace

RngState CaptureRng(const torch::Device& device) {
  RngState s;
  s.cpu = GetState(at::detail::getDefaultCPUGenerator());
  if (device.is_cuda()) s.cuda = GetState(CudaGenerator(device));
  return s;
}

void RestoreRng(const RngState& state, const torch::Device& device) {
  if (state.cpu.defined()) SetState(at::detail::getDefaultCPUGenerator(), state.cpu);
  if (state.cuda.defined() && device.is_cuda()) SetState(CudaGenerator(device), state.cuda);
}

std::string RngKey(const std::string& kind, int rank) {
  return "rng." + kind + (rank == 0 ? std::string() : ".rank" + std::to_string(rank));
}

NamedTensors RngTensors(const std::vector<RngState>& ranks) {
  NamedTensors out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].cpu.defined()) out.emplace_back(RngKey("cpu", static_cast<int>(r)), ranks[r].cpu);
    if (ranks[r].cuda.defined()) out.emplace_back(RngKey("cuda", static_cast<int>(r)), ranks[r].cuda);
  }
  return out;
}

RngState FindRng(const std::map<std::string, torch::Tensor>& saved, int rank) {
  RngState s;
  if (auto it = saved.find(RngKey("cpu", rank)); it != saved.end()) s.cpu = it->second;
  if (auto it = saved.find(RngKey("cuda", rank)); it != saved.end()) s.cuda = it->second;
  return s;
}

}  // namespace sftctl::trainer
