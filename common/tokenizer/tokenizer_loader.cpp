#include "common/tokenizer/tokenizer_loader.h"

#include "common/tokenizer/bpe_tokenizer.h"

namespace sftctl {

StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& dir_or_name, FileSystem* fs) {
  if (dir_or_name == "byte") return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  if (fs == nullptr) fs = FileSystem::Default();
  if (dir_or_name.empty())
    return InvalidArgumentError("tokenizer: empty name (expected \"byte\" or a directory)");
  if (!fs->IsDirectory(dir_or_name)) {
    return NotFoundError("tokenizer '" + dir_or_name +
                         "': not a directory with tokenizer.json (and not the built-in \"byte\")");
  }
  const std::string json_path = JoinPath(dir_or_name, "tokenizer.json");
  const std::string config_path = JoinPath(dir_or_name, "tokenizer_config.json");
  if (!fs->Exists(json_path)) {
    // A from-scratch checkpoint of sftctl's own (trainer/checkpoint/checkpoint.h) says so in
    // sftctl_tokenizer.json.
    const std::string byte_marker = JoinPath(dir_or_name, "sftctl_tokenizer.json");
    if (fs->Exists(byte_marker)) {
      return NotFoundError(json_path + ": not found: this model uses sftctl's built-in byte tokenizer (" +
                           byte_marker + "); use the tokenizer \"byte\" (--tokenizer byte)");
    }
    return NotFoundError(json_path + ": not found (only tokenizer.json / fast tokenizers are supported)");
  }
  SFT_ASSIGN_OR_RETURN(std::string json_text, fs->ReadFile(json_path));
  std::string config_text;
  if (fs->Exists(config_path)) {
    SFT_ASSIGN_OR_RETURN(config_text, fs->ReadFile(config_path));
  }
  SFT_ASSIGN_OR_RETURN(
      std::unique_ptr<BpeTokenizer> tok,
      BpeTokenizer::FromJson(json_text, config_text, json_path, config_path, "bpe:" + dir_or_name));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

}  // namespace sftctl
