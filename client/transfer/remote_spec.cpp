#include "client/transfer/remote_spec.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <type_traits>

#include "common/hub/hub_spec.h"
#include "common/object_store/s3_location.h"
#include "common/sha256.h"
#include "common/spec/spec_paths.h"
#include "common/spec/spec_yaml.h"

namespace sftctl::client {
namespace {

namespace fs = std::filesystem;

// The spec's `hosts` list when JobSpec has one (the multi-node field), else nothing.
template <typename T, typename = void>
struct HasHosts : std::false_type {};
template <typename T>
struct HasHosts<T, std::void_t<decltype(std::declval<const T&>().hosts)>> : std::true_type {};

template <typename T>
std::vector<std::string> SpecHosts(const T& s) {
  if constexpr (HasHosts<T>::value) {
    return std::vector<std::string>(s.hosts.begin(), s.hosts.end());
  } else {
    return {};
  }
}

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Every regular file under `dir` (symlinks followed), relative paths sorted; dot entries skipped.
StatusOr<std::vector<std::string>> ListFolder(const std::string& dir, const std::string& field) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::follow_directory_symlink, ec), end;
  if (ec) return NotFoundError("field '" + field + "': cannot read folder '" + dir + "': " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) return InternalError("field '" + field + "': cannot read folder '" + dir + "': " + ec.message());
    const std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec)) out.push_back(fs::relative(it->path(), dir).generic_string());
  }
  std::sort(out.begin(), out.end());
  if (out.empty()) return InvalidArgumentError("field '" + field + "': folder '" + dir + "' holds no files");
  return out;
}

Status AddFolder(const std::string& pointer, const std::string& field, const std::string& dir,
                 std::vector<SpecFile>* files) {
  SFT_ASSIGN_OR_RETURN(std::vector<std::string> entries, ListFolder(dir, field));
  for (const auto& e : entries) {
    SpecFile f;
    f.json_pointer = pointer;
    f.local_path = (fs::path(dir) / e).string();
    f.dir_entry = e;
    files->push_back(f);
  }
  return OkStatus();
}

Status AddFile(const std::string& pointer, const std::string& field, const std::string& path,
               std::vector<SpecFile>* files) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return NotFoundError("field '" + field + "': file '" + path + "' does not exist");
  }
  if (!S_ISREG(st.st_mode))
    return InvalidArgumentError("field '" + field + "': '" + path + "' is not a regular file");
  SpecFile f;
  f.json_pointer = pointer;
  f.local_path = path;
  files->push_back(f);
  return OkStatus();
}

// The spec's hf:// references must parse; they are not uploaded: the agent downloads them.
Status CheckHubPaths(const JobSpec& spec, std::vector<std::string>* notes) {
  for (const SpecHubPath& f : HubPaths(spec)) {
    StatusOr<HubRef> ref = ParseHubRef(f.value);
    if (!ref.ok()) return ref.status().WithContext("field '" + f.field + "'");
    notes->push_back(f.field + " " + f.value + " is downloaded by the agent from the Hugging Face Hub");
  }
  return OkStatus();
}

}  // namespace

StatusOr<RemoteSpec> LoadRemoteSpec(const std::string& path, const std::vector<std::string>& overrides) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return NotFoundError("spec file '" + path + "' does not exist");
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError("spec file '" + path + "' is not a regular file");
  SFT_ASSIGN_OR_RETURN(JobSpec loaded, LoadSpecFile(path, overrides));

  RemoteSpec r;
  r.spec = std::move(loaded);
  r.json = ToJson(r.spec);
  r.hosts = SpecHosts(r.spec);
  const JobSpec& s = r.spec;
  SFT_RETURN_IF_ERROR(CheckHubPaths(r.spec, &r.notes));
  for (size_t i = 0; i < s.data.train.size(); ++i) {
    if (IsHubPath(s.data.train[i])) continue;
    SFT_RETURN_IF_ERROR(AddFile("/data/train/" + std::to_string(i), "data.train", s.data.train[i], &r.files));
  }
  for (size_t i = 0; i < s.data.eval.size(); ++i) {
    if (IsHubPath(s.data.eval[i])) continue;
    SFT_RETURN_IF_ERROR(AddFile("/data/eval/" + std::to_string(i), "data.eval", s.data.eval[i], &r.files));
  }
  const std::string& ct = s.data.chat_template;
  if (ct != "auto" && ct != "chatml" && ct != "qwen3" && ct != "llama3") {
    SFT_RETURN_IF_ERROR(AddFile("/data/chat_template", "data.chat_template", ct, &r.files));
  }
  if (!s.model.path.empty() && !IsHubPath(s.model.path)) {
    if (IsDir(s.model.path)) {
      SFT_RETURN_IF_ERROR(AddFolder("/model/path", "model.path", s.model.path, &r.files));
    } else {
      r.notes.push_back("model.path '" + s.model.path +
                        "' is not a folder here: it is used as a path on the host");
    }
  }
  if (s.tokenizer != "auto" && s.tokenizer != "byte" && !IsHubPath(s.tokenizer)) {
    if (IsDir(s.tokenizer)) {
      SFT_RETURN_IF_ERROR(AddFolder("/tokenizer", "tokenizer", s.tokenizer, &r.files));
    } else {
      r.notes.push_back("tokenizer '" + s.tokenizer +
                        "' is not a folder here: it is used as a path on the host");
    }
  }
  if (s.resume != "auto" && s.resume != "never" && !IsS3Url(s.resume)) {  // s3://: the agent downloads it
    if (IsDir(s.resume)) {
      SFT_RETURN_IF_ERROR(AddFolder("/resume", "resume", s.resume, &r.files));
    } else {
      r.notes.push_back("resume '" + s.resume + "' is not a folder here: it is used as a path on the host");
    }
  }
  return r;
}

Status HashSpecFiles(std::vector<SpecFile>* files) {
  std::map<std::string, std::pair<uint64_t, std::string>> done;
  for (auto& f : *files) {
    auto it = done.find(f.local_path);
    if (it == done.end()) {
      struct stat st;
      if (::stat(f.local_path.c_str(), &st) != 0)
        return NotFoundError("file '" + f.local_path + "' disappeared");
      SFT_ASSIGN_OR_RETURN(std::string sha, Sha256File(f.local_path));
      it = done.emplace(f.local_path, std::make_pair(static_cast<uint64_t>(st.st_size), sha)).first;
    }
    f.size = it->second.first;
    f.sha256 = it->second.second;
  }
  return OkStatus();
}

::sftctl::v1::SubmitJobRequest SpecSubmitRequest(const RemoteSpec& spec) {
  ::sftctl::v1::SubmitJobRequest req;
  req.set_spec_json(spec.json.dump());
  for (const auto& f : spec.files) {
    auto* ref = req.add_blobs();
    ref->set_json_pointer(f.json_pointer);
    ref->set_sha256(f.sha256);
    ref->set_dir_entry(f.dir_entry);
  }
  req.set_name(spec.spec.name);
  return req;
}

}  // namespace sftctl::client
