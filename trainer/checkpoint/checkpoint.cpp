#include "trainer/checkpoint/checkpoint.h"

#include <cmath>
#include <utility>

#include "common/json_parse.h"
#include "trainer/checkpoint/hf_checkpoint.h"

namespace sftctl::trainer {
namespace {

constexpr const char* kTmpPrefix = ".tmp-";

// The last component of `path` ("a/b/" -> "b").
std::string LastComponent(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
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
  if (train_samples > 0) j["train_samples"] = train_samples;
  if (loss_scale > 0) {
    j["loss_scale"] = loss_scale;
    j["loss_scale_good_steps"] = loss_scale_good_steps;
  }
  return j;
}

namespace {

// Field `key` of `j` into `*out` through the one reader of outside JSON (common/json_parse.h);
// absent is an error unless `optional`, which leaves *out as it is. Errors: DATA_LOSS naming the field.
template <typename T>
Status ReadField(const nlohmann::json& j, const char* key, bool optional, const std::string& source, T* out) {
  StatusOr<std::optional<T>> v = OptionalJsonField<T>(j, key, source);
  if (!v.ok()) return DataLossError(v.status().message());
  if (v->has_value()) {
    *out = **v;
  } else if (!optional) {
    return DataLossError(source + ": field '" + key + "' is missing");
  }
  return OkStatus();
}

}  // namespace

StatusOr<TrainerState> TrainerState::FromJson(const nlohmann::json& j, const std::string& source) {
  if (Status st = CheckJsonObject(j, source); !st.ok()) return DataLossError(st.message());
  TrainerState s;
  s.rng_format = 1;  // absent: a checkpoint from before the CUDA streams were saved
  SFT_RETURN_IF_ERROR(ReadField(j, "step", false, source, &s.step));
  SFT_RETURN_IF_ERROR(ReadField(j, "epoch", false, source, &s.epoch));
  SFT_RETURN_IF_ERROR(ReadField(j, "position", false, source, &s.position));
  SFT_RETURN_IF_ERROR(ReadField(j, "tokens_seen", false, source, &s.tokens_seen));
  SFT_RETURN_IF_ERROR(ReadField(j, "bad_steps", false, source, &s.bad_steps));
  SFT_RETURN_IF_ERROR(ReadField(j, "elapsed_s", false, source, &s.elapsed_s));
  SFT_RETURN_IF_ERROR(ReadField(j, "loss_scale", true, source, &s.loss_scale));
  SFT_RETURN_IF_ERROR(ReadField(j, "loss_scale_good_steps", true, source, &s.loss_scale_good_steps));
  SFT_RETURN_IF_ERROR(ReadField(j, "rng_format", true, source, &s.rng_format));
  SFT_RETURN_IF_ERROR(ReadField(j, "train_samples", true, source, &s.train_samples));
  if (s.rng_format < 1 || s.rng_format > kRngFormat) {
    return DataLossError(source + ": field 'rng_format': " + std::to_string(s.rng_format) +
                         " is not a format this trainer reads (1 to " + std::to_string(kRngFormat) +
                         "; written by a newer sftctl?)");
  }
  return s;
}

Status ValidateResumeState(const TrainerState& s, const std::string& dir, int64_t train_samples) {
  const std::string source = JoinPath(dir, "trainer_state.json");
  auto bad = [&](const char* field, const std::string& why) {
    return DataLossError(source + ": field '" + field + "': " + why);
  };
  const std::pair<const char*, int64_t> counters[] = {{"step", s.step},
                                                      {"epoch", s.epoch},
                                                      {"tokens_seen", s.tokens_seen},
                                                      {"bad_steps", s.bad_steps},
                                                      {"position", s.position},
                                                      {"loss_scale_good_steps", s.loss_scale_good_steps},
                                                      {"train_samples", s.train_samples}};
  for (const auto& [field, v] : counters) {
    if (v < 0) return bad(field, std::to_string(v) + " is negative");
  }
  if (!std::isfinite(s.elapsed_s) || s.elapsed_s < 0) return bad("elapsed_s", "must be a finite number >= 0");
  if (!std::isfinite(s.loss_scale) || s.loss_scale < 0)
    return bad("loss_scale", "must be a finite number >= 0");
  const int64_t named = CheckpointStep(LastComponent(dir));
  if (named >= 0 && named != s.step) {
    return bad("step", std::to_string(s.step) + " in a folder named for step " + std::to_string(named) +
                           " (a copied or planted checkpoint?)");
  }
  if (s.train_samples > 0 && s.train_samples != train_samples) {
    return FailedPreconditionError(source + ": field 'train_samples': the checkpoint was written over " +
                                   std::to_string(s.train_samples) + " training samples, this run has " +
                                   std::to_string(train_samples) +
                                   " (the data changed: resume with the same data, or start afresh)");
  }
  if (s.position > train_samples) {
    return bad("position", std::to_string(s.position) + " is past the end of the training set (" +
                               std::to_string(train_samples) + " samples)");
  }
  return OkStatus();
}

bool IsComplete(FileSystem* fs, const std::string& dir) { return fs->Exists(JoinPath(dir, "DONE")); }

StatusOr<TrainerState> ReadTrainerState(const std::string& dir) {
  const std::string path = JoinPath(dir, "trainer_state.json");
  SFT_ASSIGN_OR_RETURN(std::string text, FileSystem::Default()->ReadFile(path));
  StatusOr<nlohmann::json> j = ParseJson(text, path);
  if (!j.ok()) return DataLossError(j.status().message());
  return TrainerState::FromJson(*j, path);
}

CheckpointManager::CheckpointManager(FileSystem* fs, std::string run_dir, int64_t keep)
    : fs_(fs), run_dir_(std::move(run_dir)), keep_(keep) {}

Status CheckpointManager::WriteFile(const std::string& path, const std::string& data) {
  SFT_ASSIGN_OR_RETURN(auto f, fs_->NewWritableFile(path));
  SFT_RETURN_IF_ERROR(f->Append(data));
  SFT_RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

StatusOr<std::string> CheckpointManager::Stage(int64_t step) {
  const std::string tmp = JoinPath(run_dir_, kTmpPrefix + CheckpointName(step));
  SFT_RETURN_IF_ERROR(fs_->CreateDirs(run_dir_));
  SFT_RETURN_IF_ERROR(fs_->RemoveAll(tmp));
  SFT_RETURN_IF_ERROR(fs_->CreateDirs(tmp));
  return tmp;
}

StatusOr<std::string> CheckpointManager::Save(const CheckpointContents& c) {
  SFT_ASSIGN_OR_RETURN(std::string tmp, Stage(c.state.step));
  return Write(c, tmp);
}

StatusOr<std::string> CheckpointManager::SaveStaged(const CheckpointContents& c) {
  const std::string tmp = JoinPath(run_dir_, kTmpPrefix + CheckpointName(c.state.step));
  if (!fs_->IsDirectory(tmp)) return FailedPreconditionError(tmp + ": not staged (CheckpointManager::Stage)");
  return Write(c, tmp);
}

StatusOr<std::string> CheckpointManager::Write(const CheckpointContents& c, const std::string& tmp) {
  const std::string name = CheckpointName(c.state.step);
  const std::string final_dir = JoinPath(run_dir_, name);
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
  if (!c.optimizer_shards.is_null()) {
    SFT_RETURN_IF_ERROR(WriteFile(JoinPath(tmp, "optimizer_shards.json"), c.optimizer_shards.dump(2) + "\n"));
  }
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
    const int64_t step = CheckpointStep(n);
    if (n.rfind(kTmpPrefix, 0) == 0) {
      SFT_RETURN_IF_ERROR(fs_->RemoveAll(JoinPath(run_dir_, n)));
    } else if (step >= 0 && IsComplete(fs_, JoinPath(run_dir_, n))) {
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
    const int64_t step = CheckpointStep(n);
    const std::string dir = JoinPath(run_dir_, n);
    if (n.rfind(kTmpPrefix, 0) == 0) {
      if (incomplete) incomplete->push_back(dir);
      continue;
    }
    if (step < 0) continue;
    if (!IsComplete(fs_, dir)) {
      if (incomplete) incomplete->push_back(dir);
      continue;
    }
    if (step > best_step) best_step = step, best = dir;
  }
  return best;
}

}  // namespace sftctl::trainer
