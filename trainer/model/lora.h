// LoRA adapters in PEFT's format: training on frozen base weights, adapter files, merging.
//
// A LoRA-adapted projection computes  y = W x + b + s * B (A dropout(x)),  with A [r, in]
// initialised like PEFT (kaiming-uniform, a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))), B [out, r]
// zero-initialised (so the adapted model starts equal to the base), and s = alpha / r
// (alpha / sqrt(r) with use_rslora). In the model the adapter weights are parameters named
// "<module path>.lora_A.weight" / ".lora_B.weight" (e.g. model.layers.0.self_attn.q_proj.lora_A.weight).
//
// Files (what PEFT's save_pretrained writes and vLLM / PEFT load):
//   adapter_model.safetensors  keys "base_model.model.<module path>.lora_A.weight" [r, in] and
//                              ".lora_B.weight" [out, r]; {"format": "pt"} metadata
//   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
//                              target_modules, use_rslora, bias "none", fan_in_fan_out false,
//                              modules_to_save null, use_dora false, ... (see AdapterConfigJson)
//
// Thread safety: functions are reentrant; a model must not be used concurrently.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/os/file_system.h"
#include "common/spec/spec.h"
#include "trainer/model/model.h"
#include "trainer/model/projection.h"
#include "trainer/runtime/tensor_io.h"

namespace sftctl::trainer {

inline constexpr const char* kPeftPrefix = "base_model.model.";

// The scale s applied to B A x.
double LoraScale(const LoraSpec& spec);

// adapter_config.json for `spec`; `base_model` is base_model_name_or_path (may be empty).
nlohmann::json AdapterConfigJson(const LoraSpec& spec, const std::string& base_model);

// Parses adapter_config.json. Rejects what sftctl (and vLLM) cannot apply: peft_type other
// than LORA, use_dora, modules_to_save, bias other than "none", fan_in_fan_out, rank/alpha
// patterns, unknown target modules. Errors: INVALID_ARGUMENT "<source>: field '<key>': ...".
StatusOr<LoraSpec> ParseAdapterConfig(const nlohmann::json& j, const std::string& source,
                                      std::string* base_model = nullptr);

// The model's module names for the target_modules `requested` (the spec's names, PEFT's
// names for llama): unchanged, except with fused projections (phi3) q_proj / k_proj / v_proj
// become qkv_proj and gate_proj / up_proj become gate_up_proj (each once, in first-named order),
// PEFT's modules for phi3 (one A [r, C] and one B over the whole fused output). So the spec's
// default (q_proj, v_proj) adapts phi3's qkv_proj, which is PEFT's default for phi3.
std::vector<std::string> LoraTargetsFor(const std::vector<std::string>& requested, const ModelConfig& c);
// `spec` with LoraTargetsFor's target_modules: what adapter_config.json must name for `c`.
LoraSpec LoraSpecFor(const LoraSpec& spec, const ModelConfig& c);

// Adds adapters to every projection named in LoraTargetsFor(spec.target_modules), freezes all other
// parameters (requires_grad false) and initialises A and B as PEFT does (uses the global
// torch RNG). INVALID_ARGUMENT if no projection matches.
Status ApplyLora(CausalLM& model, const LoraSpec& spec);

// The storage dtype of the frozen base for lora.base_dtype `requested` ("auto", "fp32", "bf16")
// on `device` with fp16 autocast (`fp16`, DevicePlan::fp16) or not: auto is bf16 on CUDA and MPS
// (half the memory of the weights that do not train), fp16 on CUDA under fp16 autocast (GPUs
// before Ampere have no bf16 arithmetic: a bf16 base would be cast at every use), and fp32 on CPU.
torch::ScalarType LoraBaseDtype(const std::string& requested, const torch::Device& device, bool fp16);

// Stores every frozen matrix of the model (2-D parameters that need no gradient: projection,
// embedding and lm_head weights) in `dtype` (bf16, fp16 or fp32), one tensor at a time. Norm weights, biases
// and the adapters stay fp32, as does the residual stream. Matmuls with a 16-bit weight run in 16 bits
// (trainer/model/projection.h's MixedLinear): under autocast their results stay in autocast's dtype, without
// it they return in their input's dtype; the adapter's output is added in that dtype, and the adapter files
// keep their fp32 format. Returns the bytes saved. REQUIRES: ApplyLora ran (the base is frozen).
int64_t StoreFrozenBase(CausalLM& model, torch::ScalarType dtype);

// The adapter_model.safetensors key of the model's LoRA parameter `name`: kPeftPrefix + name, and
// for the text tower of a Gemma3ForConditionalGeneration (c.wrapper) transformers' module path
// "base_model.model.model.language_model.layers.N...".
std::string PeftKey(const std::string& name, const ModelConfig& c);
// The adapter parameters of a LoRA model, keyed as in adapter_model.safetensors (PeftKey).
NamedTensors AdapterTensors(CausalLM& model);

// Writes adapter_model.safetensors + adapter_config.json into `dir` (which must exist); the
// config names the model's modules (LoraSpecFor).
Status SaveAdapter(FileSystem* fs, const std::string& dir, CausalLM& model, const LoraSpec& spec,
                   const std::string& base_model);

struct Adapter {
  LoraSpec spec;
  std::string base_model;
  // Keyed by the model's parameter names ("model.layers.0.self_attn.q_proj.lora_A.weight").
  std::map<std::string, torch::Tensor> tensors;
};

// Reads a PEFT adapter folder. Keys must be "base_model.model.<path>.lora_{A,B}[.default].weight";
// a Gemma3ForConditionalGeneration's "model.language_model.X" and "language_model.model.X" paths
// become the model's "model.X". Errors name the file and the key.
StatusOr<Adapter> LoadAdapter(const std::string& dir);

// Copies an adapter's tensors into a model that ApplyLora prepared with the same spec.
// Errors name `source` and the missing / mis-shaped tensor.
Status LoadAdapterInto(CausalLM& model, const Adapter& adapter, const std::string& source);

// W += s * B @ A (computed in fp32, stored in W's dtype) for every adapted module of `params`
// (named "<path>.weight"). Errors name the adapter key whose module is missing or whose
// shapes do not fit.
Status MergeAdapter(const Adapter& adapter, const NamedTensors& params);

}  // namespace sftctl::trainer
