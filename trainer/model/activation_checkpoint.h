// Activation (gradient) checkpointing: run a function without keeping its intermediate
// activations, and recompute them during backward.
//
// LibTorch's C++ API has no torch.utils.checkpoint. CheckpointedCall runs `fn(x)` under no-grad
// (so autograd keeps nothing of its inside) and attaches one autograd node to the output that,
// in backward, recomputes `fn` on a detached copy of `x` with grad enabled and returns the
// gradients of `x` and of `params`. The recompute sees the forward's CPU (and CUDA) RNG state
// and autocast settings, so dropout masks and casts are the same and the gradients equal those
// of the plain call: bit for bit when `fn` is deterministic (the fused CPU kernels are). Neither
// the forward nor the recompute uses autocast's (global) cast cache: no casts of the layers'
// weights outlive the call or its backward.
//
// Ownership: the node keeps `fn` (and what it captures), `x` and `params` alive until backward
// has run once or the graph is freed. `fn` must not capture anything that dies sooner.
// REQUIRES: `fn` reads only `x`, `params` and tensors that need no gradient; it returns one
// fresh floating-point tensor. The graph is backpropagated at most once (no retain_graph).
// Thread safety: like any autograd call; backward may run `fn` on the autograd engine's thread.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace sftctl::trainer {

// `fn(x)`, recording a checkpoint node when autograd is on and `x` or any of `params` needs a
// gradient; a plain call otherwise (evaluation, generation).
torch::Tensor CheckpointedCall(std::function<torch::Tensor(const torch::Tensor&)> fn, const torch::Tensor& x,
                               const std::vector<torch::Tensor>& params);

}  // namespace sftctl::trainer
