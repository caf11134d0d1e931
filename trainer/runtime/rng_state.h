// The random-number streams a checkpoint carries, so that a resumed run draws what an
// uninterrupted one would have (dropout masks: LoRA's lora.dropout).
//
// Per rank: the CPU generator's state always, and the default generator of the rank's CUDA device
// when it trains on CUDA. Stored in optimizer.safetensors as
//   rng.cpu,  rng.cpu.rank<r>     every run (rank 0 unsuffixed; r >= 1 in multi-rank runs)
//   rng.cuda, rng.cuda.rank<r>    CUDA runs only
// and versioned by trainer_state.json's "rng_format": 2 since the CUDA streams are saved; absent
// means 1 (CPU streams only). A CPU run's checkpoint has no rng.cuda keys; a checkpoint without
// them resumes on CUDA with a fresh CUDA stream (and says so), one with them resumes on the CPU
// ignoring them.
//
// Thread safety: CaptureRng/RestoreRng lock each generator; the rest are pure.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "trainer/runtime/tensor_io.h"

namespace sftctl::trainer {

// The newest "rng_format" this trainer writes and reads.
constexpr int64_t kRngFormat = 2;

struct RngState {
  torch::Tensor cpu;   // the CPU generator's state (uint8)
  torch::Tensor cuda;  // the CUDA device's generator state; undefined off CUDA
};

// This process's streams for training on `device`.
RngState CaptureRng(const torch::Device& device);
// Sets the streams that `state` holds: the CPU one when defined, the CUDA one when defined and
// `device` is CUDA.
void RestoreRng(const RngState& state, const torch::Device& device);

// "rng.<kind>" for rank 0, "rng.<kind>.rank<r>" after it; kind "cpu" or "cuda".
std::string RngKey(const std::string& kind, int rank);
// The checkpoint entries of every rank's streams (`ranks[r]` is rank r's); undefined tensors are
// left out.
NamedTensors RngTensors(const std::vector<RngState>& ranks);
// Rank `rank`'s streams among loaded checkpoint tensors (undefined where absent).
RngState FindRng(const std::map<std::string, torch::Tensor>& saved, int rank);

}  // namespace sftctl::trainer
