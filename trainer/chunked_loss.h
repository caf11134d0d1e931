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
// trainer/projection.h's LinearComputeDtype); the softmax and the loss are fp32. Gradients for
// W are accumulated in fp32 across chunks and returned in W's dtype; none are computed when W
// needs no gradient (a frozen LoRA base).
//
// Policy: train.loss_chunk_tokens (0: automatic, see LossChunkTokens). A batch with no more
// labelled positions than one chunk takes the plain path, which skips the recompute.
//
// Thread safety: pure functions.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace sftctl::trainer {

// With train.loss_chunk_tokens 0, a chunk's fp32 logits take about this many bytes.
inline constexpr int64_t kLossChunkLogitBytes = int64_t{64} << 20;
// Vocabularies below this size never chunk automatically (their logits are small and the
// plain path avoids the recompute).
inline constexpr int64_t kLossChunkMinVocab = 32000;

// Rows per chunk for train.loss_chunk_tokens `requested` (> 0: that many) and a vocabulary of
// `vocab_size`. 0 means "do not chunk": automatic (requested 0) and vocab_size below
// kLossChunkMinVocab. Automatic otherwise: kLossChunkLogitBytes / (4 * vocab_size), at least 64
// (Qwen's 151,936: 110 rows; Llama-2's 32,000: 524).
int64_t LossChunkTokens(int64_t requested, int64_t vocab_size);

// The summed cross-entropy above as an fp32 scalar. hidden [N, C] (any float dtype), weight
// [V, C], targets [N] int64 in [0, V) (no ignore index: pass only labelled rows). chunk_tokens
// 0 or >= N: the plain path (logits of all rows at once); else chunks of chunk_tokens rows.
// Differentiable in hidden and weight.
torch::Tensor LinearCrossEntropySum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                    const torch::Tensor& targets, int64_t chunk_tokens);

}  // namespace sftctl::trainer
