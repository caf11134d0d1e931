#include "trainer/model/lora.h"

#include <algorithm>
#include <cmath>

#include "common/json_parse.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;

const std::vector<std::string>& KnownModules() {
  static const std::vector<std::string> kModules = {"q_proj",    "k_proj",    "v_proj",
                                                    "o_proj",    "gate_proj", "up_proj",
                                                    "down_proj", "qkv_proj",  "gate_up_proj"};
  return kModules;
}

// The module of a model with fused projections (phi3) that `name` names: q/k/v_proj are parts of
// qkv_proj, gate/up_proj of gate_up_proj.
std::string FusedModuleName(const std::string& name) {
  if (name == "q_proj" || name == "k_proj" || name == "v_proj") return "qkv_proj";
  if (name == "gate_proj" || name == "up_proj") return "gate_up_proj";
  return name;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsLoraParam(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

}  // namespace

double LoraScale(const LoraSpec& spec) {
  return spec.use_rslora ? spec.alpha / std::sqrt(static_cast<double>(spec.r))
                         : spec.alpha / static_cast<double>(spec.r);
}

json AdapterConfigJson(const LoraSpec& spec, const std::string& base_model) {
  const bool integral_alpha = spec.alpha == std::floor(spec.alpha) && std::abs(spec.alpha) < 1e15;
  return {{"alpha_pattern", json::object()},
          {"auto_mapping", nullptr},
          {"base_model_name_or_path", base_model.empty() ? json(nullptr) : json(base_model)},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"layers_pattern", nullptr},
          {"layers_to_transform", nullptr},
          {"lora_alpha", integral_alpha ? json(static_cast<int64_t>(spec.alpha)) : json(spec.alpha)},
          {"lora_dropout", spec.dropout},
          {"modules_to_save", nullptr},
          {"peft_type", "LORA"},
          {"r", spec.r},
          {"rank_pattern", json::object()},
          {"revision", nullptr},
          {"target_modules", spec.target_modules},
          {"task_type", "CAUSAL_LM"},
          {"use_dora", false},
          {"use_rslora", spec.use_rslora}};
}

StatusOr<LoraSpec> ParseAdapterConfig(const json& j, const std::string& source, std::string* base_model) {
  if (!j.is_object()) return InvalidArgumentError(source + ": adapter_config.json must be a JSON object");
  LoraSpec s;
  auto get = [&](const char* key) -> const json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  const json* v = get("peft_type");
  if (v == nullptr || !v->is_string() || *v != "LORA")
    return FieldError(source, "peft_type",
                      "must be \"LORA\", got " + (v ? v->dump() : std::string("nothing")));
  v = get("r");
  if (v == nullptr || !v->is_number_integer() || v->get<int64_t>() < 1)
    return FieldError(source, "r",
                      "must be an integer >= 1, got " + (v ? v->dump() : std::string("nothing")));
  s.r = v->get<int64_t>();
  v = get("lora_alpha");
  if (v == nullptr || !v->is_number() || !(v->get<double>() > 0))
    return FieldError(source, "lora_alpha",
                      "must be a number > 0, got " + (v ? v->dump() : std::string("nothing")));
  s.alpha = v->get<double>();
  if ((v = get("lora_dropout"))) {
    if (!v->is_number()) return FieldError(source, "lora_dropout", "must be a number, got " + v->dump());
    s.dropout = v->get<double>();
  }
  if ((v = get("use_rslora"))) {
    if (!v->is_boolean()) return FieldError(source, "use_rslora", "must be true or false, got " + v->dump());
    s.use_rslora = v->get<bool>();
  }
  v = get("target_modules");
  if (v == nullptr) return FieldError(source, "target_modules", "is required");
  s.target_modules.clear();
  if (v->is_string() && *v == "all-linear") {
    s.target_modules = KnownModules();
  } else if (v->is_array() && !v->empty()) {
    for (const auto& e : *v) {
      if (!e.is_string())
        return FieldError(source, "target_modules", "must list module names, found " + e.dump());
      const std::string m = e.get<std::string>();
      if (std::find(KnownModules().begin(), KnownModules().end(), m) == KnownModules().end())
        return FieldError(
            source, "target_modules",
            "'" + m + "' is not a projection of llama/qwen2/qwen3/mistral/gemma2/gemma3_text/phi3");
      s.target_modules.push_back(m);
    }
  } else {
    return FieldError(source, "target_modules", "must be a non-empty list of module names, got " + v->dump());
  }
  if ((v = get("use_dora")) && !(v->is_boolean() && !v->get<bool>()))
    return FieldError(source, "use_dora", "DoRA adapters are not supported");
  if ((v = get("modules_to_save")) && !(v->is_array() && v->empty()))
    return FieldError(source, "modules_to_save",
                      "must be null (full modules in an adapter are not supported)");
  if ((v = get("bias")) && !(v->is_string() && *v == "none"))
    return FieldError(source, "bias", "must be \"none\", got " + v->dump());
  if ((v = get("fan_in_fan_out")) && !(v->is_boolean() && !v->get<bool>()))
    return FieldError(source, "fan_in_fan_out",
                      "must be false for llama/qwen2/qwen3/mistral/gemma2/gemma3_text/phi3");
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if ((v = get(key)) && !(v->is_object() && v->empty()))
      return FieldError(source, key, "per-module ranks/alphas are not supported");
  }
  if (base_model != nullptr) {
    v = get("base_model_name_or_path");
    *base_model = v != nullptr && v->is_string() ? v->get<std::string>() : std::string();
  }
  return s;
}

std::vector<std::string> LoraTargetsFor(const std::vector<std::string>& requested, const ModelConfig& c) {
  if (!c.fused_projections) return requested;
  std::vector<std::string> out;
  for (const std::string& name : requested) {
    const std::string module = FusedModuleName(name);
    if (std::find(out.begin(), out.end(), module) == out.end()) out.push_back(module);
  }
  return out;
}

LoraSpec LoraSpecFor(const LoraSpec& spec, const ModelConfig& c) {
  LoraSpec out = spec;
  out.target_modules = LoraTargetsFor(spec.target_modules, c);
  return out;
}

Status ApplyLora(CausalLM& model, const LoraSpec& spec) {
  const std::vector<std::string> targets = LoraTargetsFor(spec.target_modules, model->config());
  int64_t adapted = 0;
  for (const auto& item : model->named_modules()) {
    auto* proj = item.value()->as<ProjectionImpl>();
    if (proj == nullptr) continue;
    const std::string& path = item.key();
    const std::string leaf = path.substr(path.rfind('.') + 1);
    if (std::find(targets.begin(), targets.end(), leaf) == targets.end()) continue;
    proj->EnableLora(spec.r, LoraScale(spec), spec.dropout);
    ++adapted;
  }
  if (adapted == 0)
    return InvalidArgumentError("field 'lora.target_modules': no projection of the model matches");
  for (auto& p : model->named_parameters()) p.value().set_requires_grad(IsLoraParam(p.key()));
  return OkStatus();
}

torch::ScalarType LoraBaseDtype(const std::string& requested, const torch::Device& device, bool fp16) {
  if (requested == "bf16") return torch::kBFloat16;
  if (requested == "fp32") return torch::kFloat32;
  if (device.is_cuda()) return fp16 ? torch::kHalf : torch::kBFloat16;
  return device.is_mps() ? torch::kBFloat16 : torch::kFloat32;
}

int64_t StoreFrozenBase(CausalLM& model, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  int64_t saved = 0;
  for (auto& p : model->parameters()) {
    if (p.requires_grad() || p.dim() < 2 || p.scalar_type() == dtype) continue;
    const int64_t before = p.numel() * static_cast<int64_t>(p.element_size());
    p.set_data(p.data().to(dtype));
    saved += before - p.numel() * static_cast<int64_t>(p.element_size());
  }
  return saved;
}

std::string PeftKey(const std::string& name, const ModelConfig& c) {
  // transformers' Gemma3ForConditionalGeneration (>= 4.52) holds the text tower at model.language_model.
  if (!c.wrapper.empty() && name.rfind("model.", 0) == 0)
    return kPeftPrefix + ("model.language_model." + name.substr(6));
  return kPeftPrefix + name;
}

NamedTensors AdapterTensors(CausalLM& model) {
  NamedTensors out;
  for (const auto& p : model->named_parameters()) {
    if (IsLoraParam(p.key())) out.emplace_back(PeftKey(p.key(), model->config()), p.value());
  }
  return out;
}

Status SaveAdapter(FileSystem* fs, const std::string& dir, CausalLM& model, const LoraSpec& spec,
                   const std::string& base_model) {
  SFT_RETURN_IF_ERROR(SaveTensors(fs, JoinPath(dir, "adapter_model.safetensors"), AdapterTensors(model)));
  return WriteFileAtomic(fs, JoinPath(dir, "adapter_config.json"),
                         AdapterConfigJson(LoraSpecFor(spec, model->config()), base_model).dump(2) + "\n");
}

StatusOr<Adapter> LoadAdapter(const std::string& dir) {
  const std::string config_path = JoinPath(dir, "adapter_config.json");
  SFT_ASSIGN_OR_RETURN(std::string text, FileSystem::Default()->ReadFile(config_path));
  SFT_ASSIGN_OR_RETURN(json j, ParseJson(text, config_path));
  Adapter a;
  SFT_ASSIGN_OR_RETURN(a.spec, ParseAdapterConfig(j, config_path, &a.base_model));
  const std::string path = JoinPath(dir, "adapter_model.safetensors");
  SFT_ASSIGN_OR_RETURN(auto tensors, LoadTensors(path));
  const std::string prefix = kPeftPrefix;
  for (auto& [key, t] : tensors) {
    std::string name = key;
    if (name.compare(0, prefix.size(), prefix) != 0) {
      return DataLossError(path + ": key '" + key + "' does not start with '" + prefix + "'");
    }
    name = name.substr(prefix.size());
    // A Gemma3ForConditionalGeneration text tower: transformers >= 4.52's model.language_model.X
    // and 4.x's language_model.model.X are the model's model.X.
    for (const char* tower : {"model.language_model.", "language_model.model."}) {
      const std::string t = tower;
      if (name.compare(0, t.size(), t) == 0) name = "model." + name.substr(t.size());
    }
    for (const char* ab : {".lora_A", ".lora_B"}) {
      const std::string with_name = std::string(ab) + ".default.weight";
      if (EndsWith(name, with_name)) name = name.substr(0, name.size() - with_name.size()) + ab + ".weight";
    }
    if (!EndsWith(name, ".lora_A.weight") && !EndsWith(name, ".lora_B.weight")) {
      return DataLossError(path + ": key '" + key +
                           "' is not a LoRA weight (<module>.lora_A.weight / .lora_B.weight)");
    }
    if (t.dim() != 2) return DataLossError(path + ": tensor '" + key + "' must be 2-D");
    const bool is_a = EndsWith(name, ".lora_A.weight");
    if ((is_a ? t.size(0) : t.size(1)) != a.spec.r) {
      return DataLossError(path + ": tensor '" + key + "' has shape " + c10::str(t.sizes()) + " but r is " +
                           std::to_string(a.spec.r) + " (" + config_path + ")");
    }
    a.tensors[name] = t.to(torch::kFloat32);
  }
  for (const auto& [name, t] : a.tensors) {
    std::string other = name;
    const bool is_a = EndsWith(name, ".lora_A.weight");
    other.replace(other.size() - std::string(".lora_A.weight").size(), 7, is_a ? ".lora_B" : ".lora_A");
    if (!a.tensors.count(other)) {
      return DataLossError(path + ": '" + prefix + name + "' has no matching '" + prefix + other + "'");
    }
  }
  if (a.tensors.empty()) return DataLossError(path + ": holds no LoRA weights");
  return a;
}

Status LoadAdapterInto(CausalLM& model, const Adapter& adapter, const std::string& source) {
  NamedTensors dst;
  for (const auto& p : model->named_parameters()) {
    if (IsLoraParam(p.key())) dst.emplace_back(p.key(), p.value());
  }
  if (dst.size() != adapter.tensors.size()) {
    return DataLossError(source + ": the adapter has " + std::to_string(adapter.tensors.size()) +
                         " LoRA tensors, the model expects " + std::to_string(dst.size()) +
                         " (target_modules differ?)");
  }
  return CopyIntoParameters(adapter.tensors, dst, source);
}

Status MergeAdapter(const Adapter& adapter, const NamedTensors& params) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> by_name(params.begin(), params.end());
  const double scale = LoraScale(adapter.spec);
  const std::string suffix = ".lora_A.weight";
  for (const auto& [name, a] : adapter.tensors) {
    if (!EndsWith(name, suffix)) continue;
    const std::string module = name.substr(0, name.size() - suffix.size());
    const torch::Tensor& b = adapter.tensors.at(module + ".lora_B.weight");
    auto it = by_name.find(module + ".weight");
    if (it == by_name.end())
      return InvalidArgumentError("adapter key '" + std::string(kPeftPrefix) + name +
                                  "': the model has no '" + module + ".weight'");
    torch::Tensor& w = it->second;
    if (w.dim() != 2 || b.size(0) != w.size(0) || a.size(1) != w.size(1)) {
      return InvalidArgumentError("adapter key '" + std::string(kPeftPrefix) + name + "': B " +
                                  c10::str(b.sizes()) + " x A " + c10::str(a.sizes()) + " does not fit " +
                                  module + ".weight " + c10::str(w.sizes()));
    }
    torch::Tensor delta = torch::matmul(b.to(torch::kFloat32), a.to(torch::kFloat32)) * scale;
    w.copy_((w.to(torch::kFloat32) + delta.to(w.device())).to(w.scalar_type()));
  }
  return OkStatus();
}

}  // namespace sftctl::trainer
