#include "common/tokenizer/bpe_post_processor.h"

#include <vector>

#include "common/json_parse.h"

namespace sftctl {
namespace bpe_internal {
namespace {

using json = nlohmann::json;

// The special tokens of one template item's "SpecialToken" id, from "special_tokens".
struct Piece {
  std::vector<int32_t> ids;
  std::string text;
};

class PostProcessorParser {
 public:
  PostProcessorParser(const std::string& label, const TokenOfId& token_of)
      : label_(label), token_of_(token_of) {}

  Status Parse(const json& node, const std::string& path, int depth, SequenceSpecialTokens* out) const;

 private:
  Status Error(const std::string& field, const std::string& problem) const {
    return FieldError(label_, field, problem);
  }
  Status ParseTemplate(const json& node, const std::string& path, SequenceSpecialTokens* out) const;
  StatusOr<Piece> SpecialPiece(const json& special_tokens, const json& item, const std::string& path) const;
  Status CheckTemplate(const json& items, const json& special_tokens, const std::string& path,
                       size_t sequences, std::vector<Piece>* before, std::vector<Piece>* after) const;

  const std::string& label_;
  const TokenOfId& token_of_;
};

Status PostProcessorParser::Parse(const json& node, const std::string& path, int depth,
                                  SequenceSpecialTokens* out) const {
  if (!node.is_object()) return Error(path, "expected an object with a \"type\"");
  auto type_it = node.find("type");
  if (type_it == node.end() || !type_it->is_string()) return Error(path + ".type", "expected a string");
  const std::string type = type_it->get<std::string>();
  if (type == "ByteLevel") return OkStatus();  // trims offsets; adds no token
  if (type == "TemplateProcessing") return ParseTemplate(node, path, out);
  if (type == "Sequence") {
    auto list = node.find("processors");
    if (list == node.end() || !list->is_array()) return Error(path + ".processors", "expected an array");
    if (depth >= kMaxJsonDepth) return Error(path, "Sequences nested too deep");
    for (size_t i = 0; i < list->size(); ++i) {
      SFT_RETURN_IF_ERROR(Parse((*list)[i], path + ".processors[" + std::to_string(i) + "]", depth + 1, out));
    }
    return OkStatus();
  }
  return Error(path + ".type",
               "'" + type + "' is not supported (TemplateProcessing, ByteLevel, Sequence or null)");
}

StatusOr<Piece> PostProcessorParser::SpecialPiece(const json& special_tokens, const json& item,
                                                  const std::string& path) const {
  auto name = item.find("id");
  if (name == item.end() || !name->is_string()) return Error(path + ".id", "expected a string");
  auto entry = special_tokens.find(name->get<std::string>());
  if (entry == special_tokens.end()) {
    return Error(path + ".id", "'" + name->get<std::string>() + "' is not in special_tokens");
  }
  const std::string entry_path = "special_tokens." + name->get<std::string>() + ".ids";
  auto ids = entry->is_object() ? entry->find("ids") : entry->end();
  if (!entry->is_object() || ids == entry->end() || !ids->is_array()) {
    return Error(entry_path, "expected an array of token ids");
  }
  Piece piece;
  for (const json& id : *ids) {
    std::optional<std::string> token =
        id.is_number_integer() ? token_of_(id.get<int64_t>()) : std::optional<std::string>();
    if (!token) return Error(entry_path, id.dump() + " is not a token id");
    piece.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    piece.text += *token;
  }
  return piece;
}

// Checks a template (an array of {"SpecialToken": ...} and {"Sequence": ...} items) holding
// `sequences` Sequence items; with `before`/`after`, collects the special tokens around the
// (single) sequence.
Status PostProcessorParser::CheckTemplate(const json& items, const json& special_tokens,
                                          const std::string& path, size_t sequences,
                                          std::vector<Piece>* before, std::vector<Piece>* after) const {
  if (!items.is_array()) return Error(path, "expected an array of SpecialToken and Sequence items");
  size_t seen = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    const json& item = items[i];
    if (!item.is_object() || item.size() != 1)
      return Error(at, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    if (auto s = item.find("Sequence"); s != item.end()) {
      auto id = s->is_object() ? s->find("id") : s->end();
      if (!s->is_object() || id == s->end() || !id->is_string() || (*id != "A" && *id != "B")) {
        return Error(at + ".Sequence.id", "expected \"A\" or \"B\"");
      }
      if (sequences == 1 && *id != "A")
        return Error(at + ".Sequence.id", "a single template holds sequence \"A\"");
      ++seen;
      continue;
    }
    auto t = item.find("SpecialToken");
    if (t == item.end() || !t->is_object())
      return Error(at, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    SFT_ASSIGN_OR_RETURN(Piece piece, SpecialPiece(special_tokens, *t, at + ".SpecialToken"));
    if (before != nullptr) (seen == 0 ? before : after)->push_back(std::move(piece));
  }
  if (seen != sequences) {
    return Error(
        path, "expected " + std::to_string(sequences) + " Sequence item(s), found " + std::to_string(seen));
  }
  return OkStatus();
}

Status PostProcessorParser::ParseTemplate(const json& node, const std::string& path,
                                          SequenceSpecialTokens* out) const {
  static const json kNone = json::object();
  auto special = node.find("special_tokens");
  if (special != node.end() && !special->is_object())
    return Error(path + ".special_tokens", "expected an object");
  const json& special_tokens = special == node.end() ? kNone : *special;
  auto single = node.find("single");
  if (single == node.end()) return Error(path + ".single", "is missing");
  std::vector<Piece> before, after;
  SFT_RETURN_IF_ERROR(CheckTemplate(*single, special_tokens, path + ".single", 1, &before, &after));
  if (auto pair = node.find("pair"); pair != node.end() && !pair->is_null()) {
    SFT_RETURN_IF_ERROR(CheckTemplate(*pair, special_tokens, path + ".pair", 2, nullptr, nullptr));
  }
  // Each processor wraps what the ones before it produced.
  std::vector<int32_t> prefix;
  std::string prefix_text;
  for (const Piece& p : before) {
    prefix.insert(prefix.end(), p.ids.begin(), p.ids.end());
    prefix_text += p.text;
  }
  out->prefix.insert(out->prefix.begin(), prefix.begin(), prefix.end());
  out->prefix_text.insert(0, prefix_text);
  for (const Piece& p : after) {
    out->suffix.insert(out->suffix.end(), p.ids.begin(), p.ids.end());
    out->suffix_text += p.text;
  }
  return OkStatus();
}

}  // namespace

StatusOr<SequenceSpecialTokens> ParsePostProcessor(const json& root, const std::string& label,
                                                   const TokenOfId& token_of) {
  SequenceSpecialTokens out;
  auto it = root.find("post_processor");
  if (it == root.end() || it->is_null()) return out;
  SFT_RETURN_IF_ERROR(PostProcessorParser(label, token_of).Parse(*it, "post_processor", 0, &out));
  return out;
}

}  // namespace bpe_internal
}  // namespace sftctl
