#include "trainer/checkpoint/hf_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>

#include "common/json_parse.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

Status WriteText(FileSystem* fs, const std::string& path, const std::string& text) {
  SFT_ASSIGN_OR_RETURN(auto f, fs->NewWritableFile(path));
  SFT_RETURN_IF_ERROR(f->Append(text));
  SFT_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

// Where each tensor of a model folder lives: the open shards and, per name, the shard file.
struct WeightFiles {
  std::map<std::string, std::unique_ptr<safetensors::Reader>> readers;  // by file name
  std::map<std::string, std::string> weight_map;                        // tensor -> file name
  std::string index_path;                                               // empty: single file
};

StatusOr<WeightFiles> OpenWeightFiles(const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  WeightFiles w;
  const std::string single = JoinPath(dir, kSingleFile);
  const std::string index = JoinPath(dir, kIndexFile);
  if (fs->Exists(single)) {
    SFT_ASSIGN_OR_RETURN(auto r, safetensors::Reader::Open(single));
    for (const auto& t : r->tensors()) w.weight_map[t.name] = kSingleFile;
    w.readers[kSingleFile] = std::move(r);
    return w;
  }
  if (!fs->Exists(index)) {
    return NotFoundError("'" + dir + "' has neither " + kSingleFile + " nor " + kIndexFile);
  }
  w.index_path = index;
  SFT_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(index));
  StatusOr<json> parsed = ParseJson(text, index);
  if (!parsed.ok()) return DataLossError(parsed.status().message());
  json j = std::move(*parsed);
  if (!j.is_object()) return DataLossError(index + ": expected a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object())
    return DataLossError(index + ": field 'weight_map' is missing or not an object");
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it->is_string())
      return DataLossError(index + ": field 'weight_map." + it.key() + "' must be a file name");
    const std::string file = it->get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return DataLossError(index + ": field 'weight_map." + it.key() + "': '" + file +
                           "' is not a file name in the model folder");
    }
    w.weight_map[it.key()] = file;
    if (w.readers.count(file)) continue;
    const std::string path = JoinPath(dir, file);
    if (!fs->Exists(path)) {
      return NotFoundError(index + ": shard '" + file + "' (holding '" + it.key() + "') does not exist");
    }
    SFT_ASSIGN_OR_RETURN(auto r, safetensors::Reader::Open(path));
    w.readers[file] = std::move(r);
  }
  return w;
}

std::string TorchDtypeName(torch::ScalarType t) {
  switch (t) {
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kFloat16:
      return "float16";
    default:
      return "float32";
  }
}

WeightLayout LayoutOf(const WeightFiles& files) {
  std::vector<std::string> names;
  names.reserve(files.weight_map.size());
  for (const auto& [name, file] : files.weight_map) names.push_back(name);
  return DetectWeightLayout(names);
}

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Every tensor of `files` outside the text tower, as a read-only view of its mapped file (the
// view keeps the file mapped). Errors name the file and the tensor.
Status AddCarriedTensors(WeightFiles& files, WeightLayout layout, NamedTensors* out,
                         std::vector<std::string>* carried) {
  std::map<std::string, std::shared_ptr<safetensors::Reader>> shared;
  for (auto& [file, reader] : files.readers) shared[file] = std::move(reader);
  for (const auto& [name, file] : files.weight_map) {
    if (IsTextTowerTensor(name, layout)) continue;
    std::shared_ptr<safetensors::Reader> reader = shared.at(file);
    const safetensors::TensorInfo* info = reader->Find(name);
    if (info == nullptr) {
      return DataLossError(files.index_path + ": names '" + name + "' in shard '" + file +
                           "', which has no such tensor");
    }
    const torch::ScalarType type = ScalarTypeOf(info->dtype);
    StatusOr<safetensors::DType> back = DTypeOf(type);
    if (!back.ok() || *back != info->dtype) {
      return InvalidArgumentError(reader->path() + ": tensor '" + name + "' has dtype " +
                                  safetensors::DTypeName(info->dtype) + ", which cannot be carried through");
    }
    void* data = const_cast<uint8_t*>(reader->data(*info));
    torch::Tensor view = torch::from_blob(
        data, info->shape, [reader](void*) {}, torch::TensorOptions().dtype(type));
    out->emplace_back(name, view);
    if (carried != nullptr) carried->push_back(name);
  }
  return OkStatus();
}

}  // namespace

WeightLayout DetectWeightLayout(const std::vector<std::string>& names) {
  bool legacy = false;
  for (const std::string& n : names) {
    if (StartsWith(n, "model.language_model.")) return WeightLayout::kModelLanguageModel;
    legacy = legacy || StartsWith(n, "language_model.");
  }
  return legacy ? WeightLayout::kLanguageModelModel : WeightLayout::kCausalLM;
}

std::string FileTensorName(const std::string& name, WeightLayout layout) {
  const bool in_model = StartsWith(name, "model.");
  switch (layout) {
    case WeightLayout::kCausalLM:
      return name;
    case WeightLayout::kLanguageModelModel:
      return "language_model." + name;
    case WeightLayout::kModelLanguageModel:
      return in_model ? "model.language_model." + name.substr(6) : name;
  }
  return name;
}

bool IsTextTowerTensor(const std::string& file_name, WeightLayout layout) {
  switch (layout) {
    case WeightLayout::kCausalLM:
      return true;
    case WeightLayout::kLanguageModelModel:
      return StartsWith(file_name, "language_model.");
    case WeightLayout::kModelLanguageModel:
      return StartsWith(file_name, "model.language_model.") || file_name == "lm_head.weight";
  }
  return true;
}

StatusOr<NamedTensors> HfFileTensors(const ModelConfig& c, const NamedTensors& params,
                                     std::vector<std::string>* carried) {
  if (c.wrapper.empty()) return params;
  if (c.wrapper.source_dir.empty()) {
    return FailedPreconditionError("a " + ArchitectureName(c.wrapper.model_type) +
                                   " checkpoint is saved with its vision tower, which needs the folder it "
                                   "was loaded from (LoadModelConfig)");
  }
  StatusOr<WeightFiles> files = OpenWeightFiles(c.wrapper.source_dir);
  if (!files.ok()) {
    return Status(files.status().code(),
                  "copying the vision tower of '" + c.wrapper.source_dir + "': " + files.status().message());
  }
  const WeightLayout layout = LayoutOf(*files);
  NamedTensors out;
  for (const auto& [name, t] : params) {
    if (c.tie_word_embeddings && name == "lm_head.weight") continue;
    out.emplace_back(FileTensorName(name, layout), t);
  }
  SFT_RETURN_IF_ERROR(AddCarriedTensors(*files, layout, &out, carried));
  return out;
}

Status LoadHfWeights(const std::string& dir, const NamedTensors& params) {
  SFT_ASSIGN_OR_RETURN(WeightFiles files, OpenWeightFiles(dir));
  const WeightLayout layout = LayoutOf(files);
  for (const auto& [model_name, p] : params) {
    const std::string name = FileTensorName(model_name, layout);
    auto it = files.weight_map.find(name);
    if (it == files.weight_map.end()) {
      return DataLossError(
          (files.index_path.empty() ? JoinPath(dir, kSingleFile) : files.index_path + " (weight_map)") +
          ": missing tensor '" + name + "'");
    }
    const safetensors::Reader& reader = *files.readers.at(it->second);
    const safetensors::TensorInfo* info = reader.Find(name);
    if (info == nullptr) {
      return DataLossError(files.index_path + ": names '" + name + "' in shard '" + it->second +
                           "', which has no such tensor");
    }
    SFT_RETURN_IF_ERROR(CopyTensorInto(reader, *info, p));
    // copy_ has returned: the bytes are in `p` (on a GPU too: a blocking copy from pageable memory).
    ReleaseTensorPages(reader, *info);
  }
  return OkStatus();
}

StatusOr<std::vector<std::string>> SaveHfWeights(FileSystem* fs, const std::string& dir,
                                                 const NamedTensors& weights, bool tied,
                                                 const HfSaveOptions& options) {
  // Order by name (as a state dict's keys end up in the index) and size each tensor in the
  // dtype it will be stored in.
  std::vector<std::pair<std::string, torch::Tensor>> sorted;
  for (const auto& [name, t] : weights) {
    if (tied && name == "lm_head.weight") continue;
    sorted.emplace_back(name, t);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::set<std::string> keep(options.keep_dtype.begin(), options.keep_dtype.end());
  auto stored_type = [&](const std::string& name, const torch::Tensor& t) {
    return options.dtype && t.is_floating_point() && !keep.count(name) ? *options.dtype : t.scalar_type();
  };
  std::vector<std::vector<size_t>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int64_t bytes =
        sorted[i].second.numel() *
        static_cast<int64_t>(c10::elementSize(stored_type(sorted[i].first, sorted[i].second)));
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
    total += bytes;
  }
  const size_t n = shards.size();
  std::vector<std::string> written;
  json weight_map = json::object();
  for (size_t s = 0; s < n; ++s) {
    std::string file = kSingleFile;
    if (n > 1) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", s + 1, n);
      file = buf;
    }
    NamedTensors shard;
    for (size_t i : shards[s]) {
      const torch::Tensor& t = sorted[i].second;
      // Converted one shard at a time, so at most one shard's worth of extra memory.
      shard.emplace_back(sorted[i].first, t.detach().to(torch::kCPU, stored_type(sorted[i].first, t)));
      weight_map[sorted[i].first] = file;
    }
    SFT_RETURN_IF_ERROR(SaveTensors(fs, JoinPath(dir, file), shard));
    written.push_back(file);
  }
  if (n > 1) {
    json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    SFT_RETURN_IF_ERROR(WriteText(fs, JoinPath(dir, kIndexFile), index.dump(2) + "\n"));
    written.push_back(kIndexFile);
  }
  return written;
}

json GenerationConfigJson(const ModelConfig& c) {
  json j = {{"_from_model_config", true}};
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  }
  j["transformers_version"] = "4.46.0";
  return j;
}

Status SaveHfModel(FileSystem* fs, const std::string& dir, const ModelConfig& config,
                   const NamedTensors& weights, const HfSaveOptions& options) {
  std::vector<std::string> carried;
  SFT_ASSIGN_OR_RETURN(NamedTensors files, HfFileTensors(config, weights, &carried));
  SFT_RETURN_IF_ERROR(fs->CreateDirs(dir));
  std::string dtype = "float32";
  if (options.dtype) {
    dtype = TorchDtypeName(*options.dtype);
  } else {
    for (const auto& [name, t] : weights) {
      if (t.is_floating_point()) {
        dtype = TorchDtypeName(t.scalar_type());
        break;
      }
    }
  }
  SFT_RETURN_IF_ERROR(
      WriteText(fs, JoinPath(dir, "config.json"), ModelConfigToJson(config, dtype).dump(2) + "\n"));
  if (options.write_generation_config) {
    SFT_RETURN_IF_ERROR(
        WriteText(fs, JoinPath(dir, "generation_config.json"), GenerationConfigJson(config).dump(2) + "\n"));
  }
  HfSaveOptions save = options;
  save.keep_dtype.insert(save.keep_dtype.end(), carried.begin(), carried.end());
  // A wrapper's tied lm_head is already left out (HfFileTensors).
  return SaveHfWeights(fs, dir, files, config.tie_word_embeddings, save).status();
}

}  // namespace sftctl::trainer
