#include "trainer/tools/hf_tools.h"

#include <stdlib.h>
#include <unistd.h>  // mkdtemp on macOS

#include <cmath>
#include <filesystem>

#include "trainer/checkpoint/hf_checkpoint.h"
#include "trainer/model/generate.h"
#include "trainer/model/lora.h"
#include "trainer/runtime/device.h"
#include "trainer/training/data.h"
#include "trainer/training/evaluate.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

NamedTensors BaseParams(CausalLM& model) {
  NamedTensors out;
  for (const auto& p : model->named_parameters()) {
    const std::string& n = p.key();
    if (n.find(".lora_A.") == std::string::npos && n.find(".lora_B.") == std::string::npos)
      out.emplace_back(n, p.value());
  }
  return out;
}

bool HasWeights(const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  return fs->Exists(JoinPath(dir, "model.safetensors")) ||
         fs->Exists(JoinPath(dir, "model.safetensors.index.json"));
}

}  // namespace

StatusOr<CausalLM> LoadModelMaybeAdapter(const std::string& model_dir, const std::string& adapter_dir,
                                         torch::Device device) {
  FileSystem* fs = FileSystem::Default();
  std::string adapter = adapter_dir;
  if (adapter.empty() && fs->Exists(JoinPath(model_dir, "adapter_config.json"))) adapter = model_dir;
  if (adapter.empty()) return LoadModelDir(model_dir, {device});
  SFT_ASSIGN_OR_RETURN(Adapter a, LoadAdapter(adapter));
  std::string base = model_dir;
  if (!HasWeights(base) && fs->Exists(JoinPath(model_dir, "adapter_config.json"))) base = a.base_model;
  if (base.empty() || !HasWeights(base)) {
    return NotFoundError("'" + model_dir + "' has no weights and the adapter's base_model_name_or_path ('" +
                         a.base_model + "') is not a model folder; pass --model BASE --adapter DIR");
  }
  SFT_ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(base));
  CausalLM model(c, CausalLMImpl::Init::kLoaded);  // every base weight is loaded
  model->AllocateUninitialised(device);
  SFT_RETURN_IF_ERROR(LoadHfWeights(base, BaseParams(model)));
  SFT_RETURN_IF_ERROR(ApplyLora(model, a.spec));
  SFT_RETURN_IF_ERROR(LoadAdapterInto(model, a, JoinPath(adapter, "adapter_model.safetensors")));
  return model;
}

StatusOr<EvalModelReport> EvalModel(const EvalModelOptions& o) {
  SFT_ASSIGN_OR_RETURN(DevicePlan plan, InferencePlan(o.device, o.precision));  // trainer/model/generate.h
  SFT_ASSIGN_OR_RETURN(CausalLM model, LoadModelMaybeAdapter(o.model_dir, o.adapter_dir, plan.device));
  JobSpec spec;
  spec.model.path = o.model_dir;
  spec.tokenizer = o.tokenizer;
  if (spec.tokenizer == "auto" && !FileSystem::Default()->Exists(JoinPath(o.model_dir, "tokenizer.json")))
    spec.tokenizer = "byte";
  spec.data.train = {o.data_file};
  spec.data.format = o.format;
  spec.data.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : model->config().max_position_embeddings;
  // The token cache lives in a private temporary folder, removed afterwards.
  std::string tmpl = std::filesystem::temp_directory_path().string() + "/sftctl-eval-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return ErrnoError("cannot create temporary folder", tmpl, errno);
  spec.output_dir = tmpl;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { (void)FileSystem::Default()->RemoveAll(dir); }
  } cleanup{tmpl};
  std::string source;
  SFT_ASSIGN_OR_RETURN(auto tok, OpenTokenizer(spec, &source));
  if (tok->vocab_size() > model->config().vocab_size) {
    return InvalidArgumentError("tokenizer " + tok->name() + " has " + std::to_string(tok->vocab_size()) +
                                " tokens but '" + o.model_dir + "/config.json' has vocab_size " +
                                std::to_string(model->config().vocab_size) + " (pass --tokenizer)");
  }
  const int32_t eos = *tok->eos_id();
  const int32_t pad = tok->pad_id().value_or(eos);
  SFT_ASSIGN_OR_RETURN(Dataset data, LoadDataset(spec, *tok));
  if (data.train.empty()) return InvalidArgumentError(o.data_file + ": no sample with a trained token");
  model->ToDevice(plan.device);
  model->eval();
  EvalSpec es;
  es.batch_size = o.batch_size;
  es.exact_match = false;
  EvalResult r = Evaluate(model, data.train, es, plan, pad, eos);
  EvalModelReport report;
  report.loss = r.loss;
  report.perplexity = std::exp(r.loss);
  report.targets = r.targets;
  report.samples = static_cast<int64_t>(data.train.size());
  report.truncated = data.train_stats.truncated;
  report.dropped = data.train_stats.dropped;
  if (!o.dump_logits.empty()) {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < std::min<int64_t>(o.batch_size, report.samples); ++i) idx.push_back(i);
    Batch b = Collate(data.train, idx, pad);
    torch::Tensor logits = model->Logits(model->Hidden(b.input_ids.to(plan.device))).to(torch::kFloat32);
    SFT_RETURN_IF_ERROR(SaveTensors(FileSystem::Default(), o.dump_logits,
                                    {{"logits", logits}, {"input_ids", b.input_ids}, {"labels", b.labels}}));
  }
  return report;
}

StatusOr<ExportWeights> LoadExportWeights(const std::string& model_dir, const std::string& adapter_dir,
                                          bool merge) {
  if (!adapter_dir.empty() && !merge)
    return InvalidArgumentError("--adapter needs --merge (an adapter folder is already in PEFT format)");
  ExportWeights w;
  w.base_dir = model_dir;
  std::optional<Adapter> adapter;
  if (merge) {
    w.adapter_dir = adapter_dir.empty() ? model_dir : adapter_dir;
    SFT_ASSIGN_OR_RETURN(adapter, LoadAdapter(w.adapter_dir));
    if (!HasWeights(w.base_dir) && !adapter->base_model.empty()) w.base_dir = adapter->base_model;
  }
  SFT_ASSIGN_OR_RETURN(w.config, LoadModelConfig(w.base_dir));
  w.model = CausalLM(w.config, CausalLMImpl::Init::kLoaded);  // every weight is loaded
  w.params = BaseParams(w.model);
  SFT_RETURN_IF_ERROR(LoadHfWeights(w.base_dir, w.params));
  if (adapter) SFT_RETURN_IF_ERROR(MergeAdapter(*adapter, w.params));
  return w;
}

Status ExportModel(const ExportOptions& o) {
  FileSystem* fs = FileSystem::Default();
  if (fs->Exists(o.out_dir)) return AlreadyExistsError("output folder '" + o.out_dir + "' already exists");
  HfSaveOptions save;
  save.max_shard_bytes = o.max_shard_bytes;
  if (o.dtype == "bf16") {
    save.dtype = torch::kBFloat16;
  } else if (o.dtype == "fp16") {
    save.dtype = torch::kFloat16;
  } else if (o.dtype == "fp32") {
    save.dtype = torch::kFloat32;
  } else if (!o.dtype.empty()) {
    return InvalidArgumentError("--dtype must be fp32, bf16 or fp16, got '" + o.dtype + "'");
  }
  SFT_ASSIGN_OR_RETURN(ExportWeights w, LoadExportWeights(o.model_dir, o.adapter_dir, o.merge));
  const std::string tmp = o.out_dir + ".tmp-export";
  SFT_RETURN_IF_ERROR(fs->RemoveAll(tmp));
  SFT_RETURN_IF_ERROR(SaveHfModel(fs, tmp, w.config, w.params, save));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "generation_config.json", "vocab.json", "merges.txt", "sftctl_tokenizer.json"}) {
    const std::string src = JoinPath(w.base_dir, f);
    if (!fs->Exists(src)) continue;
    SFT_ASSIGN_OR_RETURN(std::string data, fs->ReadFile(src));
    SFT_RETURN_IF_ERROR(WriteFileAtomic(fs, JoinPath(tmp, f), data));
  }
  SFT_RETURN_IF_ERROR(fs->SyncDir(tmp));
  return fs->Rename(tmp, o.out_dir);
}

}  // namespace sftctl::trainer
