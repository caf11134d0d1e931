#include "common/hub/hub_spec.h"

#include <sys/stat.h>

namespace sftctl {

std::vector<HubSpecField> HubSpecFields(const nlohmann::json& spec) {
  std::vector<HubSpecField> out;
  auto add = [&](const nlohmann::json::json_pointer& ptr, const std::string& field) {
    if (!spec.contains(ptr)) return;
    const nlohmann::json& v = spec.at(ptr);
    if (v.is_string() && IsHubPath(v.get<std::string>()))
      out.push_back({ptr.to_string(), field, v.get<std::string>()});
  };
  if (!spec.is_object()) return out;
  add(nlohmann::json::json_pointer("/model/path"), "model.path");
  add(nlohmann::json::json_pointer("/tokenizer"), "tokenizer");
  for (const char* list : {"train", "eval"}) {
    auto data = spec.find("data");
    if (data == spec.end() || !data->is_object()) break;
    auto files = data->find(list);
    if (files == data->end() || !files->is_array()) continue;
    for (size_t i = 0; i < files->size(); ++i) {
      add(nlohmann::json::json_pointer("/data/" + std::string(list) + "/" + std::to_string(i)),
          "data." + std::string(list));
    }
  }
  return out;
}

const std::vector<std::string>& HubTokenizerPatterns() {
  static const std::vector<std::string> kPatterns = {"tokenizer*",
                                                     "*/tokenizer*",
                                                     "special_tokens_map.json",
                                                     "*/special_tokens_map.json",
                                                     "vocab.json",
                                                     "*/vocab.json",
                                                     "merges.txt",
                                                     "*/merges.txt",
                                                     "config.json",
                                                     "*/config.json",
                                                     "chat_template.jinja",
                                                     "*/chat_template.jinja",
                                                     "generation_config.json",
                                                     "*/generation_config.json"};
  return kPatterns;
}

Status ResolveHubSpec(nlohmann::json* spec, HubDownloader* downloader, bool tokenizer_only) {
  for (const HubSpecField& f : HubSpecFields(*spec)) {
    StatusOr<HubRef> ref = ParseHubRef(f.value);
    if (!ref.ok()) return ref.status().WithContext("field '" + f.field + "'");
    const bool is_model = f.json_pointer == "/model/path";
    const bool is_folder = is_model || f.json_pointer == "/tokenizer";
    const bool tokenizer_files = f.json_pointer == "/tokenizer" || (is_model && tokenizer_only);
    StatusOr<HubSnapshot> snap =
        downloader->Download(*ref, tokenizer_files ? HubTokenizerPatterns() : std::vector<std::string>{});
    if (!snap.ok()) return snap.status().WithContext("field '" + f.field + "'");
    struct stat st;
    if (!is_folder && (::stat(snap->path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))) {
      return InvalidArgumentError("field '" + f.field + "': " + f.value +
                                  " is not a file of the data set (name one JSONL file)");
    }
    (*spec)[nlohmann::json::json_pointer(f.json_pointer)] = snap->path;
  }
  return OkStatus();
}

}  // namespace sftctl
