#include "common/hub/hub_spec.h"

#include <sys/stat.h>

#include <algorithm>

#include "common/spec/hub_path.h"
#include "common/spec/spec_fields.h"
#include "common/spec/spec_paths.h"

namespace sftctl {

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

Status ResolveHubSpec(JobSpec* spec, HubDownloader* downloader, bool tokenizer_only) {
  for (const SpecHubPath& p : HubPaths(*spec)) {
    StatusOr<HubRef> ref = ParseHubRef(p.value);
    if (!ref.ok()) return ref.status().WithContext("field '" + p.field + "'");
    const bool is_folder = p.what == SpecHub::kModel || p.what == SpecHub::kTokenizer;
    const bool tokenizer_files =
        p.what == SpecHub::kTokenizer || (p.what == SpecHub::kModel && tokenizer_only);
    StatusOr<HubSnapshot> snap =
        downloader->Download(*ref, tokenizer_files ? HubTokenizerPatterns() : std::vector<std::string>{});
    if (!snap.ok()) return snap.status().WithContext("field '" + p.field + "'");
    struct stat st;
    if (!is_folder && (::stat(snap->path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))) {
      return InvalidArgumentError("field '" + p.field + "': " + p.value +
                                  " is not a file of the data set (name one JSONL file)");
    }
    SFT_RETURN_IF_ERROR(ReplaceHubPath(spec, p, snap->path));
  }
  return OkStatus();
}

}  // namespace sftctl
