// `sftctl export --gguf OUT.gguf [--type f16|q8_0|f32]` (run inside sftctl-trainer): writes a model
// folder (a checkpoint, an HF folder, or a LoRA adapter merged into its base) as one GGUF file
// that llama.cpp and ollama load (common/formats/gguf_writer.h, common/formats/gguf_tokenizer.h).
//
// Architectures: model_type llama -> "llama", qwen2 -> "qwen2", qwen3 -> "qwen3", mistral -> "llama"
// (as llama.cpp converts Mistral), gemma2 -> "gemma2", gemma3_text -> "gemma3", phi3 -> "phi3";
// what llama.cpp would compute differently is refused naming the config field (docs/gguf.md lists
// the cases). Metadata: general.architecture, general.name (the model folder's name),
// general.file_type (0 F32, 1 F16, 7 Q8_0), general.quantization_version 2, <arch>.vocab_size,
// .context_length (max_position_embeddings; a mistral's or phi3's shorter sliding_window, which
// llama.cpp does not apply: up to that length its full attention is the window's, and a warning
// says so),
// .embedding_length, .block_count, .feed_forward_length, .attention.head_count, .attention.head_count_kv,
// .attention.layer_norm_rms_epsilon, .rope.freq_base, .rope.dimension_count (the rotary dimension),
// .attention.key_length / .value_length (when head_dim is not hidden_size / heads, and always for
// qwen3 and Gemma); Gemma: .attention.sliding_window, .attention.sliding_window_pattern (period),
// .rope.freq_base_swa (gemma3), .attn_logit_softcapping / .final_logit_softcapping (gemma2); phi3:
// .rope.scaling.original_context_length, .attention.sliding_window, longrope's
// .rope.scaling.attn_factor and rope_factors_long / rope_factors_short tensors; .rope.scaling.type "linear" +
// .rope.scaling.factor for linear RoPE scaling; Llama-3 RoPE scaling becomes the "rope_freqs.weight" tensor
// (per frequency, the divisor llama.cpp applies: unscaled / scaled inverse frequency), llama only. The
// tokenizer: common/formats/gguf_tokenizer.h, read from the first of model_dir, the adapter folder and the
// base folder that has tokenizer.json.
//
// Tensors (HF -> GGUF): embed_tokens -> token_embd, layers.N.input_layernorm -> blk.N.attn_norm,
// self_attn.{q,k,v,o}_proj -> blk.N.attn_{q,k,v,output} (weights and biases), self_attn.{q,k}_norm
// -> blk.N.attn_{q,k}_norm, post_attention_layernorm -> blk.N.ffn_norm, mlp.{gate,up,down}_proj
// -> blk.N.ffn_{gate,up,down}, norm -> output_norm, lm_head -> output (absent when tied: llama.cpp
// then reuses token_embd). Gemma: post_attention_layernorm -> post_attention_norm,
// pre_feedforward_layernorm -> ffn_norm, post_feedforward_layernorm -> post_ffw_norm, and every norm
// written as 1 + weight (Gemma's RMSNorm scales by 1 + w, llama.cpp's by w). phi3: qkv_proj ->
// attn_qkv, gate_up_proj -> ffn_up (gate rows, then up rows), as they are. For "llama", llama.cpp applies
// RoPE to adjacent pairs (2i, 2i+1) of each head while HF rotates halves (i, i + head_dim/2), so the rows of
// attn_q (per query head) and attn_k (per KV head), weights and biases, are reordered: new row 2i + j of a
// head = old row j·head_dim/2 + i. qwen2 / qwen3 use llama.cpp's NEOX RoPE (halves, like HF) and keep HF's
// order.
//
// Types: 1-D tensors (norms, biases, rope_freqs) F32; 2-D weights F16 with --type f16, Q8_0 with
// --type q8_0 except those whose rows are not a multiple of 32 values, which stay F16; all F32 with
// --type f32.
//
// OUT must not exist; it is written through "OUT.tmp-gguf" and renamed, so an error leaves no
// OUT. Errors: INVALID_ARGUMENT for --type, the architecture, the tokenizer; ALREADY_EXISTS for OUT.
#pragma once

#include <string>

#include "common/status.h"

namespace sftctl::trainer {

struct GgufExportOptions {
  std::string model_dir;
  std::string adapter_dir;  // with merge; empty: model_dir's adapter
  bool merge = false;
  std::string out_path;
  std::string type = "f16";  // f16 | q8_0 | f32
};

Status ExportGguf(const GgufExportOptions& o);

}  // namespace sftctl::trainer
