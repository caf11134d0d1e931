// Cross-entropy over a large vocabulary without forming the logits of every token at once.
//
// The loss head computes, for hidden states h [N, C] of the N labelled positions, an lm_head
// weight W [V, C] and targets t [N],  sum_i ( logsumexp(h_i W^T) - (h_i W^T)[t_i] )  in fp32.
// Formed at once the fp32 logits are N x V floats: 1.2 GB for one 2048-token sequence of a
// Qwen model (V = 151,936), held from forward to backward together with their gradient.
//
// The chunked path runs the same arithmetic over chunks of rows. Forward keeps per row only its
// log-sum-exp; backward recomputes each chunk's logits, turns them into the softmax gradient and
// multiplies back into dh and dW, so peak memory holds one chunk's logits, not N x V. The
// matmul runs in the dtype the plain path would use (autocast's, else W's: see
// trainer/model/projection.h's LinearComputeDtype); the softmax and the loss are fp32. Gradients for
// W are accumulated in fp32 across chunks and returned in W's dtype; none are computed when W
// needs no gradient (a frozen LoRA base).
//
// Policy: train.loss_chunk_tokens (0: automatic, per device, see LossChunkTokens). A batch with no more
// labelled positions than one chunk takes the plain path, which skips the recompute.
//
// Thread safety: pure functions (LossChunkDeviceFor asks the CUDA driver, from any thread).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "trainer/model/working_weights.h"

namespace sftctl::trainer {

// Where the loss head runs, as far as the automatic chunk size cares.
struct LossChunkDevice {
  at::DeviceType type = at::kCPU;
  int64_t memory_bytes = 0;  // the device's memory (CUDA: its total, from the driver); 0 unknown
};
// The device of `device`: its type, and on CUDA its total memory (trainer/runtime/cuda_capability.h).
LossChunkDevice LossChunkDeviceFor(const torch::Device& device);

// With train.loss_chunk_tokens 0 on the CPU (and MPS), a chunk's fp32 logits take about this many
// bytes: small enough to stay near the caches, and the lm_head re-reads are cheap there.
inline constexpr int64_t kLossChunkLogitBytes = int64_t{64} << 20;
// On CUDA every chunk re-reads lm_head's weight three times and the fp32 dW twice, so chunks are
// as large as memory allows: 1/kCudaLossChunkMemoryShare of the device's memory, between these
// bounds (the lower one when the memory is unknown). An 80 GiB GPU takes 2.5 GiB of logits per
// chunk (4,416 rows of Qwen's 151,936 vocabulary: two chunks for a 4 x 2048 micro-batch).
inline constexpr int64_t kCudaLossChunkMemoryShare = 32;
inline constexpr int64_t kCudaLossChunkMinBytes = int64_t{512} << 20;
inline constexpr int64_t kCudaLossChunkMaxBytes = int64_t{4} << 30;
// Vocabularies below this size never chunk automatically (their logits are small and the
// plain path avoids the recompute).
inline constexpr int64_t kLossChunkMinVocab = 32000;

// Rows per chunk for train.loss_chunk_tokens `requested` (> 0: that many) and a vocabulary of
// `vocab_size` on `device`. 0 means "do not chunk": automatic (requested 0) and vocab_size below
// kLossChunkMinVocab. Automatic otherwise: a logit budget / (4 * vocab_size), at least 64 rows;
// the budget is kLossChunkLogitBytes off CUDA (Qwen's 151,936: 110 rows; Llama-2's 32,000: 524)
// and the CUDA share above on CUDA. Pure.
int64_t LossChunkTokens(int64_t requested, int64_t vocab_size, const LossChunkDevice& device);

// The summed cross-entropy above as an fp32 scalar. hidden [N, C] (any float dtype), weight
// [V, C], targets [N] int64 in [0, V) (no ignore index: pass only labelled rows). chunk_tokens
// 0 or >= N: the plain path (logits of all rows at once); else chunks of chunk_tokens rows.
// Differentiable in hidden and weight. `softcap` > 0 (Gemma's final_logit_softcapping): the
// logits are tanh(z / softcap) * softcap in fp32 before the softmax, on every path (on CUDA the
// fused loss, which cannot cap, gives way to the composite plain or chunked path). `working`
// bound (trainer/model/working_weights.h): the fused CUDA loss reads the weight's working copy
// when it is in the matmul dtype and adds the weight's gradient into weight.grad() itself.
torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t chunk_tokens, double softcap = 0,
                                    const WorkingWeight& working = {});

}  // namespace sftctl::trainer
