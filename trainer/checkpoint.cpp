#include "trainer/checkpoint.h"

#include <cstdio>

#include "trainer/hf_checkpoint.h"

namespace sftctl::trainer {
namespace {

constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kPrefix = "checkpoint-";

bool ParseStep(const std::string& name, int64_t* step) {
  const std::string p = kPrefix;
  if (name.compare(0, p.size(), p) != 0 || name.size() == p.size()) return false;
  for (size_t i = p.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  *step = std::stoll(name.substr(p.size()));
  return true;
}

}  // namespace

nlohmann::json TrainerState::ToJson() const {
  nlohmann::json j = {{"step", step},
                      {"epoch", epoch},
                      {"position", position},
                      {"tokens_seen", tokens_seen},
                      {"bad_steps", bad_steps},
                      {"elapsed_s", elapsed_s},
                      {"rng_format", rng_format}};
  if (loss_scale > 0) {
    j["loss_scale"] = loss_scale;
    j["loss_scale_good_steps"] = loss_scale_good_steps;
  }
  return j;
}

StatusOr<TrainerState> TrainerState::FromJson(const nlohmann::json& j, const std::string& source) {
  TrainerState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.position = j.at("position").get<int64_t>();
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    s.bad_steps = j.at("bad_steps").get<int64_t>();
    s.elapsed_s = j.at("elapsed_s").get<double>();
    s.loss_scale = j.value("loss_scale", 0.0);
    s.loss_scale_good_steps = j.value("loss_scale_good_steps", int64_t{0});
    s.rng_format = j.value("rng_format", int64_t{1});
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(source + ": " + e.what());
  }
  if (s.rng_format < 1 || s.rng_format > kRngFormat) {
    return DataLossError(source + ": field 'rng_format': " + std::to_string(s.rng_format) +
                         " is not a format this trainer reads (1 to " + std::to_string(kRngFormat) +
                         "; written by a newer sftctl?)");
  }
  return s;
}

std::string CheckpointName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%06lld", kPrefix, static_cast<long long>(step));
  return buf;
}

bool IsComplete(FileSystem* fs, const std::string& dir) { return fs->Exists(JoinPath(dir, "DONE")); }

StatusOr<TrainerState> ReadTrainerState(const std::string& dir) {
  const std::string path = JoinPath(dir, "trainer_state.json");
  SFT_ASSIGN_OR_RETURN(std::string text, FileSystem::Default()->ReadFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLossError(path + ": invalid JSON");
  return TrainerState::FromJson(j, path);
}

CheckpointManager::CheckpointManager(FileSystem* fs, std::string run_dir, int64_t keep)
    : fs_(fs), run_dir_(std::move(run_dir)), keep_(keep) {}

Status CheckpointManager::WriteFile(const std::string& path, const std::string& data) {
  SFT_ASSIGN_OR_RETURN(auto f, fs_->NewWritableFile(path));
  SFT_RETURN_IF_ERROR(f->Append(data));
  SFT_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

StatusOr<std::string> CheckpointManager::Save(const CheckpointContents& c) {
  const std::string name = CheckpointName(c.state.step);
  const std::string tmp = JoinPath(run_dir_, kTmpPrefix + name);
  const std::string final_dir = JoinPath(run_dir_, name);
  SFT_RETURN_IF_ERROR(fs_->CreateDirs(run_dir_));
  SFT_RETURN_IF_ERROR(fs_->RemoveAll(tmp));
  SFT_RETURN_IF_ERROR(fs_->CreateDirs(tmp));

  SFT_RETURN_IF_ERROR(WriteFile(JoinPath(tmp, "config.json"), c.config.dump(2) + "\n"));
  if (!c.weights.empty()) {
    HfSaveOptions save;
    save.max_shard_bytes = c.max_shard_bytes;
    const bool tied = c.config.is_object() && c.config.value("tie_word_embeddings", false);
    SFT_RETURN_IF_ERROR(SaveHfWeights(fs_, tmp, c.weights, tied, save).status());
  }
  if (!c.generation_config.is_null()) {
    SFT_RETURN_IF_ERROR(
        WriteFile(JoinPath(tmp, "generation_config.json"), c.generation_config.dump(2) + "\n"));
  }
  if (!c.adapter_config.is_null()) {
    SFT_RETURN_IF_ERROR(SaveTensors(fs_, JoinPath(tmp, "adapter_model.safetensors"), c.adapter));
    SFT_RETURN_IF_ERROR(WriteFile(JoinPath(tmp, "adapter_config.json"), c.adapter_config.dump(2) + "\n"));
  }
  SFT_RETURN_IF_ERROR(SaveTensors(fs_, JoinPath(tmp, "optimizer.safetensors"), c.optimizer));
  SFT_RETURN_IF_ERROR(WriteFile(JoinPath(tmp, "trainer_state.json"), c.state.ToJson().dump(2) + "\n"));
  if (c.tokenizer_source == "byte") {
    SFT_RETURN_IF_ERROR(WriteFile(JoinPath(tmp, "sftctl_tokenizer.json"), "{\"type\": \"byte\"}\n"));
  } else if (!c.tokenizer_source.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                          "generation_config.json", "vocab.json", "merges.txt"}) {
      const std::string src = JoinPath(c.tokenizer_source, f);
      if (!fs_->Exists(src)) continue;
      SFT_ASSIGN_OR_RETURN(std::string data, fs_->ReadFile(src));
      SFT_RETURN_IF_ERROR(WriteFile(JoinPath(tmp, f), data));
    }
  }
  SFT_RETURN_IF_ERROR(fs_->SyncDir(tmp));

  // A folder of the same name (an earlier, possibly incomplete, attempt) is replaced.
  SFT_RETURN_IF_ERROR(fs_->RemoveAll(final_dir));
  SFT_RETURN_IF_ERROR(fs_->Rename(tmp, final_dir));
  SFT_RETURN_IF_ERROR(fs_->SyncDir(run_dir_));
  SFT_RETURN_IF_ERROR(WriteFile(JoinPath(final_dir, "DONE"), name + "\n"));
  SFT_RETURN_IF_ERROR(fs_->SyncDir(final_dir));
  SFT_RETURN_IF_ERROR(Prune());
  return final_dir;
}

Status CheckpointManager::Prune() {
  SFT_ASSIGN_OR_RETURN(auto names, fs_->ListDir(run_dir_));
  std::vector<std::pair<int64_t, std::string>> complete;
  for (const auto& n : names) {
    int64_t step;
    if (n.rfind(kTmpPrefix, 0) == 0) {
      SFT_RETURN_IF_ERROR(fs_->RemoveAll(JoinPath(run_dir_, n)));
    } else if (ParseStep(n, &step) && IsComplete(fs_, JoinPath(run_dir_, n))) {
      complete.emplace_back(step, n);
    }
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + keep_ < complete.size(); ++i) {
    SFT_RETURN_IF_ERROR(fs_->RemoveAll(JoinPath(run_dir_, complete[i].second)));
  }
  return OkStatus();
}

StatusOr<std::optional<std::string>> CheckpointManager::Latest(std::vector<std::string>* incomplete) const {
  if (!fs_->IsDirectory(run_dir_)) return std::optional<std::string>();
  SFT_ASSIGN_OR_RETURN(auto names, fs_->ListDir(run_dir_));
  int64_t best_step = -1;
  std::optional<std::string> best;
  for (const auto& n : names) {
    int64_t step;
    const std::string dir = JoinPath(run_dir_, n);
    if (n.rfind(kTmpPrefix, 0) == 0) {
      if (incomplete) incomplete->push_back(dir);
      continue;
    }
    if (!ParseStep(n, &step)) continue;
    if (!IsComplete(fs_, dir)) {
      if (incomplete) incomplete->push_back(dir);
      continue;
    }
    if (step > best_step) best_step = step, best = dir;
  }
  return best;
}

}  // namespace sftctl::trainer
