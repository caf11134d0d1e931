// The memory a training plan needs, estimated before any weight is loaded, and the check that
// refuses a plan that cannot fit (train.skip_memory_check turns the refusal off).
//
// The estimate adds up, in bytes:
//   weights      parameters in their storage dtype (a LoRA run's frozen matrices in
//                lora.base_dtype, everything else fp32)
//   gradients    4 per trainable parameter (the flat fp32 gradient buffers, trainer/distributed/optimizer.h);
//                with distributed.shard: gradients over W ranks (ZeRO-2) 4 / W, plus the buckets
//                in flight: the largest trainable parameter's (the embedding of a full fine-tune,
//                a bucket of its own) and GradBuckets::kMaxBucketsInFlight - 1 more of
//                distributed.bucket_mb plus one layer's largest parameter
//   optimizer    8 per trainable parameter (AdamW's two moments); 8 / W with distributed.shard:
//                optimizer or gradients (ZeRO-1/2)
//   step         the optimizer step's temporaries: 8 per trainable parameter off CUDA (FlatAdamW's
//                full-size temporaries), none on CUDA (PyTorch's fused AdamW); sharded, 8 / W (the
//                all-gather of the updated parameters is in place, on NCCL and Gloo alike)
//   activations  what autograd keeps between forward and backward, per decoder layer (every
//                layer, or with train.gradient_checkpointing each layer's input plus one layer
//                recomputed), plus the working set of the layer being computed. Per token and
//                layer, with a = 4 (fp32) or 2 (bf16 autocast) bytes and the residual in fp32:
//                  8C + 2aC + a(2H + 2Hkv)D + 3aI  [+ aHT on CPU, whose attention keeps the
//                  softmax of every head's T x T scores]
//                (residual and normed inputs of the two norms, q/k/v and the attention output,
//                gate/up and SwiGLU's output), counted from what the model's ops save. On top,
//                per layer, the weight copies those ops save: the bf16 casts autocast makes of
//                fp32 weights, and on CPU the concatenated q/k/v and gate/up weights of
//                projections without an adapter (one GEMM each). LoRA adapters keep their
//                input's autocast cast (2 x in per token), their rank-r output, and with
//                lora.dropout the dropped input and its mask (5 x in). With data.packing, the
//                block-causal mask: one boolean and one additive [B, T, T] mask for all layers.
//   logits       the loss head: rows x V x (8 + a) bytes for rows = all labelled positions
//                (worst case: every position), or one chunk of train.loss_chunk_tokens rows
//                (trainer/model/chunked_loss.h), plus a cast copy of lm_head's weight when it is
//                stored in another dtype than the matmul's
//   eval         an evaluation between steps (no autograd): the hidden states and one layer's
//                working set of one loss batch (EvalBatchTokens, trainer/training/evaluate.h), its loss
//                head, and with eval.exact_match the decode batch's KV cache
//   runtime      kRuntimeBytes for LibTorch itself (code, thread pools, allocator slack)
// The step and the evaluation run after backward has freed the activations and logits, so the
// total is weights + gradients + optimizer + max(activations + logits, step, eval) + runtime,
// multiplied by the processes sharing the memory (ranks of one host on CPU). The weights are
// whole on every rank at every stage (there is no ZeRO-3).
// bench/memory compares it with measured peaks (bench/README.md).
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/spec/spec.h"
#include "common/status.h"
#include "trainer/model/chunked_loss.h"
#include "trainer/model/model_config.h"

namespace sftctl::trainer {

inline constexpr int64_t kRuntimeBytes = int64_t{512} << 20;

// distributed.shard (ZeRO): what each of several ranks keeps only its 1/W of.
enum class ShardStage { kNone, kOptimizer, kGradients };
// "none", "optimizer", "gradients" (anything else: kNone).
ShardStage ParseShardStage(const std::string& s);
const char* ShardStageName(ShardStage s);

struct MemoryPlan {
  ModelConfig config;
  int64_t batch_size = 1;
  int64_t seq_len = 512;  // the longest row of a batch (data.max_seq_len)
  bool gradient_checkpointing = false;
  int64_t loss_chunk_tokens = 0;         // rows per loss chunk, resolved (CausalLM::LossChunkRows)
  LossChunkDevice loss_device;           // the training device (its type decides the step and eval terms)
  bool packing = false;                  // data.packing: a block-causal mask per micro-batch
  std::optional<EvalSpec> eval;          // absent: no evaluation (no eval data)
  std::optional<LoraSpec> lora;          // absent: full fine-tune
  int64_t base_bytes = 4;                // bytes per element of a LoRA run's frozen matrices (2: bf16)
  int64_t activation_bytes = 4;          // 2 under bf16 or fp16 autocast
  bool cpu_kernels = true;               // CPU path: T x T attention scores, fused q/k/v and gate/up GEMMs
  int64_t processes = 1;                 // processes sharing this memory
  int64_t ranks = 1;                     // ranks of the job (WORLD_SIZE): what a sharded stage divides by
  ShardStage shard = ShardStage::kNone;  // distributed.shard; ignored with one rank
  int64_t bucket_bytes = int64_t{25} << 20;  // distributed.bucket_mb
};

struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, optimizer = 0, activations = 0, logits = 0, step = 0, eval = 0,
          runtime = 0;
  int64_t processes = 1;
  int64_t ranks = 1;
  ShardStage shard = ShardStage::kNone;  // kNone with one rank
  int64_t total() const;
  // "9.1 GiB (weights 3.1 GiB, gradients 0.0 GiB, optimizer 0.1 GiB, activations 4.2 GiB,
  // logits 1.2 GiB, step 0.1 GiB, eval 0.3 GiB, runtime 0.5 GiB)", with " for N processes" when
  // more than one, and ", per rank with distributed.shard: optimizer over W ranks" when sharded.
  std::string Describe() const;
};

MemoryEstimate EstimateMemory(const MemoryPlan& plan);

// The plan's parameters: all of them, and those that train (LoRA: the adapters only).
struct ParameterCount {
  int64_t total = 0, trainable = 0;
  int64_t frozen_matrices = 0;  // frozen 2-D weights (what lora.base_dtype stores)
};
ParameterCount CountParameters(const ModelConfig& c, const std::optional<LoraSpec>& lora);

// OK when the estimate fits in `available_bytes`. Otherwise FAILED_PRECONDITION:
//   "memory: this plan needs about <estimate breakdown> but <available> is available (<source>).
//    To fit: <suggestion> (about N GiB); ...; or set train.skip_memory_check: true to train anyway"
// where the suggestions are the changes not yet made (with several ranks first the sharded
// stages beyond the plan's, "distributed.shard: optimizer (...) (about N GiB, fits)" when that
// stage alone fits; then lora, train.gradient_checkpointing, lora.base_dtype: bf16,
// train.loss_chunk_tokens: 0, a smaller train.batch_size or data.max_seq_len), each with the
// estimate it would give.
Status CheckMemoryFits(const MemoryPlan& plan, int64_t available_bytes, const std::string& source);

// "1.5 GiB"
std::string FormatGiB(int64_t bytes);

}  // namespace sftctl::trainer
