#include "trainer/checkpoint/optimizer_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "common/json_parse.h"
#include "common/os/file_system.h"

namespace sftctl::trainer {
namespace {

constexpr int64_t kManifestFormat = 1;

// A required field through the one reader of outside JSON, its error as DATA_LOSS.
template <typename T>
Status Field(const nlohmann::json& j, const char* key, const std::string& where, T* out) {
  StatusOr<T> v = JsonField<T>(j, key, where);
  if (!v.ok()) return DataLossError(v.status().message());
  *out = *v;
  return OkStatus();
}

// The elements of `array` (a JSON array at `where`), or DATA_LOSS.
StatusOr<std::vector<nlohmann::json>> Items(const nlohmann::json& j, const char* key,
                                            const std::string& where) {
  nlohmann::json array;
  SFT_RETURN_IF_ERROR(Field(j, key, where, &array));
  if (!array.is_array()) return DataLossError(where + ": field '" + key + "': expected an array");
  return std::vector<nlohmann::json>(array.begin(), array.end());
}

Status ReadGroups(const nlohmann::json& j, const std::string& source, OptimizerShardManifest* m) {
  SFT_ASSIGN_OR_RETURN(auto groups, Items(j, "groups", source));
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string where = fmt::format("{}: groups[{}]", source, i);
    OptimizerShardManifest::Group g;
    SFT_RETURN_IF_ERROR(Field(groups[i], "numel", where, &g.numel));
    SFT_RETURN_IF_ERROR(Field(groups[i], "weight_decay", where, &g.weight_decay));
    if (g.numel < 0) return DataLossError(where + ": field 'numel': negative");
    m->groups.push_back(g);
  }
  return OkStatus();
}

Status ReadParams(const nlohmann::json& j, const std::string& source, OptimizerShardManifest* m) {
  SFT_ASSIGN_OR_RETURN(auto params, Items(j, "params", source));
  std::set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string where = fmt::format("{}: params[{}]", source, i);
    OptimizerShardManifest::Param p;
    int64_t group = 0;
    SFT_RETURN_IF_ERROR(Field(params[i], "name", where, &p.name));
    SFT_RETURN_IF_ERROR(Field(params[i], "group", where, &group));
    SFT_RETURN_IF_ERROR(Field(params[i], "offset", where, &p.offset));
    SFT_RETURN_IF_ERROR(Field(params[i], "numel", where, &p.numel));
    if (group < 0 || group >= static_cast<int64_t>(m->groups.size()))
      return DataLossError(where + ": field 'group': no such group");
    p.group = static_cast<int>(group);
    // (offset + numel could wrap: compared as numel - offset, both checked non-negative first)
    if (p.offset < 0 || p.numel < 0 || p.offset > m->groups[p.group].numel ||
        p.numel > m->groups[p.group].numel - p.offset)
      return DataLossError(where + ": the parameter lies outside its group");
    if (!names.insert(p.name).second) return DataLossError(where + ": parameter '" + p.name + "' repeats");
    m->params.push_back(std::move(p));
  }
  return OkStatus();
}

// Each group's ranges, sorted, must follow one another with neither a gap nor an overlap from 0 to
// the group's size: every element is in exactly one file.
Status CheckCoverage(std::vector<std::vector<std::pair<int64_t, int64_t>>>& cover, const std::string& source,
                     const OptimizerShardManifest& m) {
  for (size_t g = 0; g < cover.size(); ++g) {
    std::sort(cover[g].begin(), cover[g].end());
    int64_t at = 0;
    for (const auto& [b, e] : cover[g]) {
      if (b != at) {
        return DataLossError(
            fmt::format("{}: the files do not cover group {} exactly once ({} at element {})", source, g,
                        b < at ? "an overlap" : "a gap", std::min(b, at)));
      }
      at = e;
    }
    if (at != m.groups[g].numel)
      return DataLossError(fmt::format("{}: the files do not cover group {} exactly once", source, g));
  }
  return OkStatus();
}

Status ReadFiles(const nlohmann::json& j, const std::string& source, OptimizerShardManifest* m) {
  SFT_ASSIGN_OR_RETURN(auto files, Items(j, "files", source));
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cover(m->groups.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = fmt::format("{}: files[{}]", source, i);
    OptimizerShardManifest::File f;
    int64_t rank = 0;
    SFT_RETURN_IF_ERROR(Field(files[i], "file", where, &f.file));
    SFT_RETURN_IF_ERROR(Field(files[i], "rank", where, &rank));
    f.rank = static_cast<int>(rank);
    if (f.file.empty() || f.file.find('/') != std::string::npos || f.file[0] == '.')
      return DataLossError(where + ": field 'file': '" + f.file + "' is not a plain file name");
    SFT_ASSIGN_OR_RETURN(auto ranges, Items(files[i], "ranges", where));
    for (size_t k = 0; k < ranges.size(); ++k) {
      const std::string rw = fmt::format("{}.ranges[{}]", where, k);
      OptimizerShardManifest::Range r;
      int64_t group = 0;
      SFT_RETURN_IF_ERROR(Field(ranges[k], "group", rw, &group));
      SFT_RETURN_IF_ERROR(Field(ranges[k], "begin", rw, &r.begin));
      SFT_RETURN_IF_ERROR(Field(ranges[k], "end", rw, &r.end));
      if (group < 0 || group >= static_cast<int64_t>(m->groups.size()))
        return DataLossError(rw + ": field 'group': no such group");
      r.group = static_cast<int>(group);
      if (r.begin < 0 || r.end < r.begin || r.end > m->groups[r.group].numel)
        return DataLossError(rw + ": the range lies outside its group");
      cover[r.group].emplace_back(r.begin, r.end);
      f.ranges.push_back(r);
    }
    m->files.push_back(std::move(f));
  }
  return CheckCoverage(cover, source, *m);
}

}  // namespace

std::string OptimizerShardFileName(int rank, int world_size) {
  return fmt::format("optimizer-shard-{:05d}-of-{:05d}.safetensors", rank, world_size);
}

nlohmann::json OptimizerShardManifest::ToJson() const {
  nlohmann::json j = {{"format", kManifestFormat}, {"world_size", world_size}};
  j["groups"] = nlohmann::json::array();
  for (const auto& g : groups) j["groups"].push_back({{"numel", g.numel}, {"weight_decay", g.weight_decay}});
  j["params"] = nlohmann::json::array();
  for (const auto& p : params)
    j["params"].push_back({{"name", p.name}, {"group", p.group}, {"offset", p.offset}, {"numel", p.numel}});
  j["files"] = nlohmann::json::array();
  for (const auto& f : files) {
    nlohmann::json ranges = nlohmann::json::array();
    for (const auto& r : f.ranges) ranges.push_back({{"group", r.group}, {"begin", r.begin}, {"end", r.end}});
    j["files"].push_back({{"file", f.file}, {"rank", f.rank}, {"ranges", ranges}});
  }
  return j;
}

StatusOr<OptimizerShardManifest> OptimizerShardManifest::FromJson(const nlohmann::json& j,
                                                                  const std::string& source) {
  if (Status st = CheckJsonObject(j, source); !st.ok()) return DataLossError(st.message());
  int64_t format = 0, world = 0;
  SFT_RETURN_IF_ERROR(Field(j, "format", source, &format));
  if (format != kManifestFormat) {
    return DataLossError(
        fmt::format("{}: field 'format': {} is not a format this trainer reads ({}; written "
                    "by a newer sftctl?)",
                    source, format, kManifestFormat));
  }
  SFT_RETURN_IF_ERROR(Field(j, "world_size", source, &world));
  if (world < 1) return DataLossError(source + ": field 'world_size': must be >= 1");
  OptimizerShardManifest m;
  m.world_size = static_cast<int>(world);
  SFT_RETURN_IF_ERROR(ReadGroups(j, source, &m));
  SFT_RETURN_IF_ERROR(ReadParams(j, source, &m));
  SFT_RETURN_IF_ERROR(ReadFiles(j, source, &m));
  return m;
}

MomentReader PerParameterMoments(const std::map<std::string, torch::Tensor>* saved) {
  return [saved](const std::string& kind, const std::string& name, int64_t numel, int64_t begin,
                 int64_t count, const torch::Tensor& out) -> Status {
    const std::string key = kind + "." + name;
    auto it = saved->find(key);
    if (it == saved->end()) return DataLossError("optimizer state has no tensor '" + key + "'");
    if (it->second.numel() != numel) {
      return DataLossError(fmt::format("optimizer state tensor '{}' has {} elements, expected {}", key,
                                       it->second.numel(), numel));
    }
    torch::NoGradGuard no_grad;
    out.copy_(it->second.reshape({-1}).narrow(0, begin, count));
    return OkStatus();
  };
}

bool HasShardedMoments(const std::string& dir) {
  return FileSystem::Default()->Exists(JoinPath(dir, kOptimizerShardManifest));
}

StatusOr<std::unique_ptr<ShardedMoments>> ShardedMoments::Open(const std::string& dir) {
  const std::string path = JoinPath(dir, kOptimizerShardManifest);
  SFT_ASSIGN_OR_RETURN(std::string text, FileSystem::Default()->ReadFile(path));
  StatusOr<nlohmann::json> j = ParseJson(text, path);
  if (!j.ok()) return DataLossError(j.status().message());
  std::unique_ptr<ShardedMoments> s(new ShardedMoments());
  s->dir_ = dir;
  SFT_ASSIGN_OR_RETURN(s->manifest_, OptimizerShardManifest::FromJson(*j, path));
  for (size_t i = 0; i < s->manifest_.params.size(); ++i) s->param_index_[s->manifest_.params[i].name] = i;
  return s;
}

MomentReader ShardedMoments::Reader() {
  return [this](const std::string& kind, const std::string& name, int64_t numel, int64_t begin, int64_t count,
                const torch::Tensor& out) { return Read(kind, name, numel, begin, count, out); };
}

Status ShardedMoments::Read(const std::string& kind, const std::string& name, int64_t numel, int64_t begin,
                            int64_t count, const torch::Tensor& out) {
  const std::string where = JoinPath(dir_, kOptimizerShardManifest);
  auto it = param_index_.find(name);
  if (it == param_index_.end()) return DataLossError(where + ": no parameter '" + name + "'");
  const OptimizerShardManifest::Param& p = manifest_.params[it->second];
  if (p.numel != numel) {
    return DataLossError(
        fmt::format("{}: parameter '{}' has {} elements, this run's has {}", where, name, p.numel, numel));
  }
  if (begin < 0 || count < 0 || begin > numel || count > numel - begin) {
    return DataLossError(fmt::format("{}: elements [{}, +{}) of parameter '{}' lie outside its {}", where,
                                     begin, count, name, numel));
  }
  torch::Tensor host = torch::empty({count}, torch::kFloat32);
  SFT_RETURN_IF_ERROR(
      ReadGroupRange(kind, p.group, p.offset + begin, p.offset + begin + count, host.data_ptr<float>()));
  torch::NoGradGuard no_grad;
  out.copy_(host);
  return OkStatus();
}

Status ShardedMoments::ReadGroupRange(const std::string& kind, int group, int64_t begin, int64_t end,
                                      float* out) {
  const std::string key = fmt::format("{}.{}", kind, group);
  int64_t copied = 0;  // the manifest's ranges do not overlap (FromJson): each element is copied once
  for (const auto& f : manifest_.files) {
    for (const auto& r : f.ranges) {
      if (r.group != group || r.end <= begin || r.begin >= end) continue;
      SFT_ASSIGN_OR_RETURN(const safetensors::Reader* file, File(f.file));
      const safetensors::TensorInfo* info = file->Find(key);
      const std::string path = JoinPath(dir_, f.file);
      if (info == nullptr) return DataLossError(path + ": no tensor '" + key + "'");
      if (info->dtype != safetensors::DType::kF32 || info->numel() != r.end - r.begin) {
        return DataLossError(
            fmt::format("{}: tensor '{}' is not {} fp32 values", path, key, r.end - r.begin));
      }
      const int64_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
      std::memcpy(out + (lo - begin), file->data(*info) + (lo - r.begin) * sizeof(float),
                  static_cast<size_t>(hi - lo) * sizeof(float));
      copied += hi - lo;
    }
  }
  if (copied != end - begin) {
    return DataLossError(fmt::format("{}: the shard files hold {} of elements [{}, {}) of '{}'",
                                     JoinPath(dir_, kOptimizerShardManifest), copied, begin, end, key));
  }
  return OkStatus();
}

StatusOr<const safetensors::Reader*> ShardedMoments::File(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return it->second.get();
  SFT_ASSIGN_OR_RETURN(auto reader, safetensors::Reader::Open(JoinPath(dir_, name)));
  const safetensors::Reader* r = reader.get();
  files_[name] = std::move(reader);
  return r;
}

}  // namespace sftctl::trainer
