#include "agent/state/job_spec.h"

#include <unistd.h>

#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/json_parse.h"
#include "common/os/file_system.h"
#include "common/safe_path.h"
#include "common/sha256.h"
#include "common/spec/spec.h"
#include "common/spec/spec_fields.h"

namespace sftctl::agent {

namespace {

StatusOr<nlohmann::json> ApplyBlobRefs(
    nlohmann::json spec, const std::vector<SpecBlobRef>& refs,
    const std::function<StatusOr<std::string>(const std::string&)>& blob_path,
    std::vector<SpecFolder>* folders) {
  if (!spec.is_object()) return InvalidArgumentError("spec_json: not a JSON object");
  if (spec.contains("output_dir") && !spec["output_dir"].is_string()) {
    return InvalidArgumentError("spec_json.output_dir: must be a string");
  }
  // Per json_pointer: the first reference using it, and whether it is a folder.
  struct Use {
    size_t first;
    bool folder;
    std::set<std::string> entries;
    size_t folder_index = 0;
  };
  std::map<std::string, Use> uses;
  std::vector<SpecFolder> found;
  for (size_t i = 0; i < refs.size(); ++i) {
    const std::string field = "blobs[" + std::to_string(i) + "]";
    const SpecBlobRef& ref = refs[i];
    if (!IsSha256Hex(ref.sha256))
      return InvalidArgumentError(field + ".sha256: must be 64 lowercase hex digits");
    nlohmann::json::json_pointer ptr;
    try {
      ptr = nlohmann::json::json_pointer(ref.json_pointer);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgumentError(field + ".json_pointer: '" + ref.json_pointer + "' is not a JSON pointer");
    }
    if (ptr.empty())
      return InvalidArgumentError(field + ".json_pointer: must name a field, not the whole spec");
    // The reference names a field of an object ("/model/path") or an existing element of a
    // list ("/data/train/0"); appending to lists is not allowed.
    nlohmann::json::json_pointer parent = ptr.parent_pointer();
    const bool in_object = spec.contains(parent) && spec[parent].is_object();
    const bool in_list = spec.contains(parent) && spec[parent].is_array() && spec.contains(ptr);
    if (!in_object && !in_list) {
      return InvalidArgumentError(
          field + ".json_pointer: '" + ref.json_pointer +
          "' names neither a field of an object nor an existing list element in spec_json");
    }
    const bool folder = !ref.dir_entry.empty();
    auto [it, fresh] = uses.try_emplace(ref.json_pointer, Use{i, folder, {}, 0});
    Use& use = it->second;
    if (!fresh && (use.folder != folder || !folder)) {
      return InvalidArgumentError(
          field + (folder ? ".dir_entry" : ".json_pointer") + ": '" + ref.json_pointer +
          "' is already set by blobs[" + std::to_string(use.first) + "]" +
          (use.folder != folder ? (use.folder ? " as a folder (give every reference a dir_entry)"
                                              : " as a single file (it has no dir_entry)")
                                : ""));
    }
    if (fresh && spec.contains(ptr) && !spec[ptr].is_string() && !spec[ptr].is_null()) {
      return InvalidArgumentError(field + ".json_pointer: spec_json" + ref.json_pointer +
                                  " must be a string (a file reference)");
    }
    SFT_ASSIGN_OR_RETURN(std::string path, blob_path(ref.sha256));
    if (!folder) {
      spec[ptr] = path;
      continue;
    }
    if (Status why = CheckRelativePath(ref.dir_entry); !why.ok())
      return why.WithContext(field + ".dir_entry");
    if (!use.entries.insert(ref.dir_entry).second) {
      return InvalidArgumentError(field + ".dir_entry: '" + ref.dir_entry +
                                  "' appears twice in the folder for '" + ref.json_pointer + "'");
    }
    if (fresh) {
      use.folder_index = found.size();
      found.push_back({ref.json_pointer, {}});
    }
    found[use.folder_index].entries.emplace_back(ref.dir_entry, path);
  }
  // An entry may not be both a file and the folder of another entry ("a" and "a/b").
  for (const SpecFolder& f : found) {
    const std::set<std::string>& names = uses[f.json_pointer].entries;
    for (const auto& [entry, path] : f.entries) {
      for (size_t slash = entry.find('/'); slash != std::string::npos; slash = entry.find('/', slash + 1)) {
        if (names.count(entry.substr(0, slash))) {
          size_t idx = 0;
          for (size_t i = 0; i < refs.size(); ++i) {
            if (refs[i].json_pointer == f.json_pointer && refs[i].dir_entry == entry) idx = i;
          }
          return InvalidArgumentError("blobs[" + std::to_string(idx) + "].dir_entry: '" + entry +
                                      "' is inside '" + entry.substr(0, slash) +
                                      "', which is a file of the same folder");
        }
      }
    }
  }
  if (folders != nullptr) {
    for (SpecFolder& f : found) folders->push_back(std::move(f));
  }
  return spec;
}

// The one place the agent turns a spec's text into JSON (`parsed` is told of it).
StatusOr<nlohmann::json> ParseSpecText(const std::string& spec_json, const std::string& where,
                                       const SpecParseObserver& parsed) {
  if (parsed) parsed(where);
  return ParseJson(spec_json, where);
}

// A folder's field must be a string of the typed spec (where MaterializeFolders puts the folder).
Status CheckFolderFields(const std::vector<SpecBlobRef>& refs, const std::vector<SpecFolder>& folders,
                         JobSpec spec) {
  for (const SpecFolder& f : folders) {
    if (SpecStringAt(&spec, f.json_pointer) != nullptr) continue;
    size_t first = 0;
    while (first < refs.size() && refs[first].json_pointer != f.json_pointer) ++first;
    return InvalidArgumentError("blobs[" + std::to_string(first) + "].json_pointer: '" + f.json_pointer +
                                "' is not a path field of the job spec (a folder goes into a string)");
  }
  return OkStatus();
}

}  // namespace

StatusOr<JobSpec> ValidateSpec(const std::string& spec_json, const std::vector<SpecBlobRef>& refs,
                               const std::function<StatusOr<std::string>(const std::string&)>& blob_path,
                               std::vector<SpecFolder>* folders, const SpecParseObserver& parsed) {
  SFT_ASSIGN_OR_RETURN(nlohmann::json json, ParseSpecText(spec_json, "spec_json", parsed));
  std::vector<SpecFolder> found;
  // A client is trusted no further than its token: whatever its spec holds (a list index past
  // 2^63 in a JSON pointer, a type nobody expected), the answer is INVALID_ARGUMENT, never a throw.
  try {
    SFT_ASSIGN_OR_RETURN(json, ApplyBlobRefs(std::move(json), refs, blob_path, &found));
    SFT_ASSIGN_OR_RETURN(JobSpec spec,
                         ParseSpec(json, "", [](const std::string&) { return std::string("spec_json"); }));
    SFT_RETURN_IF_ERROR(CheckFolderFields(refs, found, spec));
    if (folders != nullptr) {
      for (SpecFolder& f : found) folders->push_back(std::move(f));
    }
    return spec;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("spec_json: ") + e.what());
  }
}

StatusOr<std::shared_ptr<const JobSpec>> ParseStoredSpec(const std::string& spec_json,
                                                         const std::string& where,
                                                         const SpecParseObserver& parsed) {
  SFT_ASSIGN_OR_RETURN(nlohmann::json json, ParseSpecText(spec_json, where, parsed));
  try {
    SFT_ASSIGN_OR_RETURN(JobSpec spec, ParseSpec(json, "", [&where](const std::string&) { return where; }));
    return std::make_shared<const JobSpec>(std::move(spec));
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(where + ": " + e.what());
  }
}

std::string CanonicalSpecJson(const JobSpec& spec) {
  return ToJson(spec).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string* SpecStringAt(JobSpec* spec, const std::string& json_pointer) {
  std::vector<std::string> tokens;  // "/data/train/0" -> data, train, 0
  try {
    for (nlohmann::json::json_pointer p(json_pointer); !p.empty(); p.pop_back())
      tokens.insert(tokens.begin(), p.back());
  } catch (const nlohmann::json::exception&) {
    return nullptr;
  }
  std::string path;
  for (size_t i = 0; i < tokens.size(); ++i) {
    path += (i == 0 ? "" : ".") + tokens[i];
    const SpecField* f = FindSpecField(path);
    if (f == nullptr) return nullptr;
    if (f->kind == SpecKind::kSection) {
      if (f->present != nullptr && !f->present(*spec)) return nullptr;
      continue;
    }
    const SpecValue value = f->value(*spec);
    const size_t rest = tokens.size() - i - 1;
    if (f->kind == SpecKind::kString) return rest == 0 ? std::get<std::string*>(value) : nullptr;
    if (f->kind == SpecKind::kList) {
      std::vector<std::string>* list = std::get<std::vector<std::string>*>(value);
      if (rest == 0) return f->one_string_ok && list->size() == 1 ? &list->front() : nullptr;  // "a.jsonl"
      const std::string& index = tokens.back();
      if (rest != 1 || index.empty() || index.size() > 9 ||
          index.find_first_not_of("0123456789") != std::string::npos || (index.size() > 1 && index[0] == '0'))
        return nullptr;
      const size_t n = std::stoul(index);
      return n < list->size() ? &(*list)[n] : nullptr;
    }
    if (f->kind != SpecKind::kJson || rest == 0) return nullptr;
    nlohmann::json* node = std::get<nlohmann::json*>(value);
    for (size_t k = i + 1; k < tokens.size() && node != nullptr; ++k) {
      if (!node->is_object() || !node->contains(tokens[k])) return nullptr;
      node = &(*node)[tokens[k]];
    }
    return node->get_ptr<std::string*>();
  }
  return nullptr;
}

Status MaterializeFolders(const std::string& job_dir, const std::vector<SpecFolder>& folders, JobSpec* spec) {
  FileSystem* fs = FileSystem::Default();
  for (size_t n = 0; n < folders.size(); ++n) {
    std::string* field = SpecStringAt(spec, folders[n].json_pointer);
    if (field == nullptr)
      return InvalidArgumentError("'" + folders[n].json_pointer + "' is not a path field of the job spec");
    const std::string dir = job_dir + "/inputs/" + std::to_string(n);
    for (const auto& [entry, blob] : folders[n].entries) {
      const std::string dst = dir + "/" + entry;
      SFT_RETURN_IF_ERROR(fs->CreateDirs(dst.substr(0, dst.rfind('/'))));
      if (::unlink(dst.c_str()) != 0 && errno != ENOENT) return ErrnoError("cannot replace", dst, errno);
      // A hard link keeps the entry's own name and survives the blob being garbage-collected; a
      // symlink where the blob store is on another file system (or links are not allowed).
      if (::link(blob.c_str(), dst.c_str()) != 0 && ::symlink(blob.c_str(), dst.c_str()) != 0) {
        return ErrnoError("cannot link blob " + blob + " to", dst, errno);
      }
    }
    *field = dir;
  }
  return OkStatus();
}

}  // namespace sftctl::agent
