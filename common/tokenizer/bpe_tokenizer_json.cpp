// BpeTokenizer::FromJson: loads tokenizer.json (and tokenizer_config.json) into the tokenizer's
// components (bpe_vocab.h, bpe_merges.h, bpe_normalizer.h, bpe_pre_tokenizer.h,
// bpe_added_tokens.h, bpe_byte_fallback.h, bpe_decoder.h), checking everything the encoder relies on and
// naming the offending field in every error ("<file>: <field>: <message>").
#include <algorithm>
#include <climits>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/json_parse.h"
#include "common/tokenizer/bpe_added_tokens.h"
#include "common/tokenizer/bpe_byte_fallback.h"
#include "common/tokenizer/bpe_decoder.h"
#include "common/tokenizer/bpe_merges.h"
#include "common/tokenizer/bpe_normalizer.h"
#include "common/tokenizer/bpe_post_processor.h"
#include "common/tokenizer/bpe_pre_tokenizer.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/bpe_vocab.h"
#include "common/tokenizer/unicode_normalize.h"

namespace sftctl {
namespace bpe_internal {
namespace {

using json = nlohmann::json;

// Unused ids tolerated below the largest id (reserved slots) before a vocab counts as corrupt.
constexpr int64_t kMaxUnusedIds = 1 << 16;
// Sequences nested in Sequences are walked recursively. ParseJson already refuses JSON nested
// deeper than kMaxJsonDepth (and each Sequence level takes two: an object and an array), so this
// bound is never the first one reached; it keeps the walker bounded on its own.
constexpr int kMaxSequenceDepth = kMaxJsonDepth;

std::string Truncated(std::string s) {
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Error builder for one JSON file: "<label>: <field>: <message>".
struct JsonErrors {
  std::string label;
  Status Field(const std::string& field, const std::string& message) const {
    return InvalidArgumentError(label + ": " + field + ": " + message);
  }
  Status Missing(const std::string& field) const {
    return InvalidArgumentError(label + ": field '" + field + "' is missing");
  }
  // "<label>: <path>.type '<type>' is not supported (<supported>)".
  Status Unsupported(const std::string& path, const std::string& type, const char* supported) const {
    return InvalidArgumentError(label + ": " + path + ".type '" + type + "' is not supported (" + supported +
                                ")");
  }
};

std::string TypeName(const json& j) { return j.type_name(); }

StatusOr<bool> OptionalBool(const json& obj, const char* key, bool def, const JsonErrors& err,
                            const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_boolean()) return err.Field(path + "." + key, "expected a boolean, got " + TypeName(*it));
  return it->get<bool>();
}

StatusOr<NormalizationForm> ParseNormalizerForm(const std::string& type) {
  if (type == "NFC") return NormalizationForm::kNFC;
  if (type == "NFD") return NormalizationForm::kNFD;
  if (type == "NFKC") return NormalizationForm::kNFKC;
  if (type == "NFKD") return NormalizationForm::kNFKD;
  return NotFoundError(type);
}

// Reads a token entry of tokenizer_config.json (eos_token etc.): a string, an
// {"content": ...} object, or null.
StatusOr<std::optional<std::string>> ConfigToken(const json& config, const char* key, const JsonErrors& err) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return std::optional<std::string>(c->get<std::string>());
  }
  return err.Field(key, "expected a token string or an object with \"content\", got " + TypeName(*it));
}

StatusOr<AddedToken> ParseAddedToken(const json& j, const JsonErrors& err, const std::string& path,
                                     std::optional<int32_t> id_from_key) {
  if (!j.is_object()) return err.Field(path, "expected an object, got " + TypeName(j));
  AddedToken tok;
  auto content = j.find("content");
  if (content == j.end() || !content->is_string()) return err.Field(path + ".content", "expected a string");
  tok.content = content->get<std::string>();
  if (id_from_key) {
    tok.id = *id_from_key;
  } else {
    auto id = j.find("id");
    if (id == j.end() || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() > INT32_MAX) {
      return err.Field(path + ".id", "expected a non-negative integer");
    }
    tok.id = id->get<int32_t>();
  }
  SFT_ASSIGN_OR_RETURN(tok.special, OptionalBool(j, "special", false, err, path));
  SFT_ASSIGN_OR_RETURN(tok.lstrip, OptionalBool(j, "lstrip", false, err, path));
  SFT_ASSIGN_OR_RETURN(tok.rstrip, OptionalBool(j, "rstrip", false, err, path));
  SFT_ASSIGN_OR_RETURN(tok.normalized, OptionalBool(j, "normalized", !tok.special, err, path));
  SFT_ASSIGN_OR_RETURN(tok.single_word, OptionalBool(j, "single_word", false, err, path));
  return tok;
}

// The id an added_tokens_decoder key ("151643") names, or -1 when it is not a whole integer.
int64_t IdOfKey(const std::string& key) {
  try {
    size_t used = 0;
    const int64_t id = std::stoll(key, &used);
    return used == key.size() ? id : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// ---------------------------------------------------------------------------------------
// Sequence: the normalizer, the pre-tokenizer and the decoder are each one component
// {"type": ..., ...} or a {"type": "Sequence", <list key>: [component, ...]} of them, nested.

struct SequenceSyntax {
  const char* list_key;  // "normalizers", "pretokenizers", "decoders"
  // A Sequence without that array is refused as "<path>.<list key>: expected an array" (false),
  // or handed to the visitor like any other component, for it to refuse (true).
  bool listless_is_component;
};
constexpr SequenceSyntax kNormalizerSequence{"normalizers", false};
constexpr SequenceSyntax kPreTokenizerSequence{"pretokenizers", false};
constexpr SequenceSyntax kDecoderSequence{"decoders", true};

// Called with each component that is not a Sequence, its path ("normalizer.normalizers[1]") and
// its type.
using ComponentVisitor =
    std::function<Status(const json& node, const std::string& path, const std::string& type)>;

// Walks the component tree at `node` depth-first, in order, calling `visit` on its leaves; stops
// at the first error. Every node must be an object with a string "type".
Status WalkSequence(const json& node, const std::string& path, const SequenceSyntax& syntax,
                    const JsonErrors& err, const ComponentVisitor& visit, int depth = 0) {
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    return err.Field(path, "expected an object with a \"type\"");
  }
  const std::string type = node["type"].get<std::string>();
  if (type == "Sequence") {
    auto list = node.find(syntax.list_key);
    if (list != node.end() && list->is_array()) {
      if (depth >= kMaxSequenceDepth) {
        return err.Field(path, "Sequences nested more than " + std::to_string(kMaxSequenceDepth) + " deep");
      }
      for (size_t i = 0; i < list->size(); ++i) {
        const std::string item = path + "." + syntax.list_key + "[" + std::to_string(i) + "]";
        SFT_RETURN_IF_ERROR(WalkSequence((*list)[i], item, syntax, err, visit, depth + 1));
      }
      return OkStatus();
    }
    if (!syntax.listless_is_component) return err.Field(path + "." + syntax.list_key, "expected an array");
  }
  return visit(node, path, type);
}

// ---------------------------------------------------------------------------------------
// Pre-tokenizer components

StatusOr<PreTokenizerStep> ParseByteLevel(const json& p, const std::string& path, const JsonErrors& err) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  SFT_ASSIGN_OR_RETURN(step.add_prefix_space, OptionalBool(p, "add_prefix_space", true, err, path));
  SFT_ASSIGN_OR_RETURN(bool use_regex, OptionalBool(p, "use_regex", true, err, path));
  if (use_regex) {
    std::string regex_error;
    step.regex = Regex::Compile(kGpt2Pattern, false, &regex_error);
    if (!step.regex) return InternalError("GPT-2 pattern: " + regex_error);
  }
  return step;
}

StatusOr<SplitBehavior> ParseSplitBehavior(const json& p, const std::string& path, const JsonErrors& err) {
  auto behavior = p.find("behavior");
  const std::string b = behavior != p.end() && behavior->is_string() ? behavior->get<std::string>() : "";
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return err.Field(path + ".behavior", "'" + b + "' is not a known split behavior");
}

StatusOr<PreTokenizerStep> ParseSplit(const json& p, const std::string& path, const JsonErrors& err) {
  PreTokenizerStep step;
  step.kind = PreTokenizerStep::Kind::kSplit;
  auto pattern = p.find("pattern");
  if (pattern == p.end() || !pattern->is_object()) return err.Field(path + ".pattern", "expected an object");
  std::string regex_error;
  if (auto r = pattern->find("Regex"); r != pattern->end() && r->is_string()) {
    step.regex = Regex::Compile(r->get<std::string>(), false, &regex_error);
    if (!step.regex) return err.Field(path + ".pattern.Regex", regex_error);
  } else if (auto s = pattern->find("String"); s != pattern->end() && s->is_string()) {
    step.regex = Regex::Compile(s->get<std::string>(), true, &regex_error);
    if (!step.regex) return err.Field(path + ".pattern.String", regex_error);
  } else {
    return err.Field(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
  }
  SFT_ASSIGN_OR_RETURN(step.invert, OptionalBool(p, "invert", false, err, path));
  SFT_ASSIGN_OR_RETURN(step.behavior, ParseSplitBehavior(p, path, err));
  return step;
}

// ---------------------------------------------------------------------------------------
// SentencePiece-style components: Replace and Prepend normalizers, Replace, ByteFallback, Fuse
// and Strip decoders.

// A Replace's {"String": ...} pattern (not empty); a Regex one is refused.
StatusOr<std::string> ParseStringPattern(const json& p, const std::string& path, const JsonErrors& err) {
  auto pattern = p.find("pattern");
  if (pattern == p.end() || !pattern->is_object()) return err.Field(path + ".pattern", "expected an object");
  if (pattern->contains("Regex")) {
    return err.Field(path + ".pattern.Regex", "is not supported (only {\"String\": ...})");
  }
  auto str = pattern->find("String");
  if (str == pattern->end() || !str->is_string() || str->get<std::string>().empty()) {
    return err.Field(path + ".pattern", "expected {\"String\": <non-empty string>}");
  }
  return str->get<std::string>();
}

StatusOr<std::string> RequiredString(const json& p, const char* key, const std::string& path,
                                     const JsonErrors& err) {
  auto it = p.find(key);
  if (it == p.end() || !it->is_string()) return err.Field(path + "." + key, "expected a string");
  return it->get<std::string>();
}

StatusOr<NormalizerStep> ParseNormalizerStep(const json& n, const std::string& path, const std::string& type,
                                             const JsonErrors& err) {
  NormalizerStep step;
  if (auto form = ParseNormalizerForm(type); form.ok()) {
    step.form = *form;
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    SFT_ASSIGN_OR_RETURN(step.pattern, ParseStringPattern(n, path, err));
    SFT_ASSIGN_OR_RETURN(step.content, RequiredString(n, "content", path, err));
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    SFT_ASSIGN_OR_RETURN(step.content, RequiredString(n, "prepend", path, err));
  } else {
    return err.Unsupported(path, type, "NFC, NFD, NFKC, NFKD, Replace, Prepend, Sequence");
  }
  return step;
}

StatusOr<size_t> StripCount(const json& d, const char* key, const std::string& path, const JsonErrors& err) {
  auto it = d.find(key);
  if (it == d.end() || !it->is_number_unsigned() || it->get<uint64_t>() > (1u << 20)) {
    return err.Field(path + "." + key, "expected a non-negative integer");
  }
  return static_cast<size_t>(it->get<uint64_t>());
}

StatusOr<DecoderStep> ParseStrip(const json& d, const std::string& path, const JsonErrors& err) {
  DecoderStep step;
  step.kind = DecoderStep::Kind::kStrip;
  SFT_ASSIGN_OR_RETURN(step.content, RequiredString(d, "content", path, err));
  size_t end = 0;
  if (!step.content.empty() && IsValidUtf8(step.content)) NextCodePoint(step.content, &end);
  if (step.content.empty() || end != step.content.size()) {
    return err.Field(path + ".content", "expected one character");
  }
  SFT_ASSIGN_OR_RETURN(step.start, StripCount(d, "start", path, err));
  SFT_ASSIGN_OR_RETURN(step.stop, StripCount(d, "stop", path, err));
  return step;
}

// A decoder of a SentencePiece-style tokenizer.
StatusOr<DecoderStep> ParseDecoderStep(const json& d, const std::string& path, const std::string& type,
                                       const JsonErrors& err) {
  DecoderStep step;
  if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    SFT_ASSIGN_OR_RETURN(step.pattern, ParseStringPattern(d, path, err));
    SFT_ASSIGN_OR_RETURN(step.content, RequiredString(d, "content", path, err));
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    return ParseStrip(d, path, err);
  } else if (type == "ByteLevel") {
    return err.Field(path, "a ByteLevel decoder needs a byte-level vocabulary (a ByteLevel pre_tokenizer)");
  } else {
    return err.Unsupported(path, type, "Replace, ByteFallback, Fuse, Strip, Sequence");
  }
  return step;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The loader: one method per part of tokenizer.json, called in a fixed order (the first
// error found is the one reported), filling the tokenizer's tables.

class TokenizerJsonLoader {
 public:
  TokenizerJsonLoader(const std::string& json_label, const std::string& config_label)
      : err_{json_label}, cfg_err_{config_label} {}

  StatusOr<std::unique_ptr<BpeTokenizer>> Load(std::string_view tokenizer_json,
                                               std::string_view tokenizer_config_json, std::string name);

 private:
  StatusOr<const json*> ReadModel(const json& root);
  Status CheckVocabularyKind() const;
  StatusOr<const json*> ReadVocab(const json& model, int64_t* max_id) const;
  StatusOr<std::vector<AddedToken>> ReadAddedTokens(const json& root) const;
  Status ReadConfig(std::string_view config_text, json* config, std::vector<AddedToken>* added) const;
  Status ReadAddedTokensDecoder(const json& atd, std::vector<AddedToken>* added) const;
  StatusOr<size_t> CountIds(int64_t max_id, const json& vocab, const std::vector<AddedToken>& added) const;
  Status BuildIdTables(const json& vocab, const std::vector<AddedToken>& added, size_t n_ids);
  Status FindByteIds();
  Status BuildCharVocab();
  Status ReadMerges(const json& model);
  Status ReadNormalizer(const json& root);
  Status ReadPreTokenizer(const json& root);
  Status ReadDecoder(const json& root);
  void BuildAddedTokenMatchers(std::vector<AddedToken> added);
  Status ResolveSpecialIds(const json& config);
  Status ReadPostProcessor(const json& root, const json& config);

  const JsonErrors err_;      // tokenizer.json
  const JsonErrors cfg_err_;  // tokenizer_config.json
  std::unique_ptr<BpeTokenizer> tok_;
  bool byte_fallback_ = false;  // model.byte_fallback
  bool byte_level_ = true;      // a byte-level vocabulary (else SentencePiece-style)
};

StatusOr<std::unique_ptr<BpeTokenizer>> TokenizerJsonLoader::Load(std::string_view tokenizer_json,
                                                                  std::string_view tokenizer_config_json,
                                                                  std::string name) {
  // Bounded nesting: the normalizer/pre-tokenizer/decoder Sequences are walked recursively.
  SFT_ASSIGN_OR_RETURN(json root, ParseJson(tokenizer_json, err_.label));
  if (!root.is_object())
    return InvalidArgumentError(err_.label + ": expected a JSON object at the top level");
  tok_.reset(new BpeTokenizer());
  tok_->name_ = std::move(name);

  SFT_ASSIGN_OR_RETURN(const json* model, ReadModel(root));
  SFT_RETURN_IF_ERROR(ReadPreTokenizer(root));  // which tells the kind of vocabulary
  SFT_RETURN_IF_ERROR(CheckVocabularyKind());
  int64_t max_id = -1;
  SFT_ASSIGN_OR_RETURN(const json* vocab, ReadVocab(*model, &max_id));
  // Added tokens: tokenizer.json, then tokenizer_config.json's added_tokens_decoder.
  SFT_ASSIGN_OR_RETURN(std::vector<AddedToken> added, ReadAddedTokens(root));
  json config = json::object();
  SFT_RETURN_IF_ERROR(ReadConfig(tokenizer_config_json, &config, &added));
  SFT_ASSIGN_OR_RETURN(size_t n_ids, CountIds(max_id, *vocab, added));
  SFT_RETURN_IF_ERROR(BuildIdTables(*vocab, added, n_ids));
  SFT_RETURN_IF_ERROR(ReadMerges(*model));
  SFT_RETURN_IF_ERROR(ReadNormalizer(root));
  SFT_RETURN_IF_ERROR(ReadDecoder(root));
  BuildAddedTokenMatchers(std::move(added));
  SFT_RETURN_IF_ERROR(ResolveSpecialIds(config));
  SFT_RETURN_IF_ERROR(ReadPostProcessor(root, config));
  return std::move(tok_);
}

// Checks "model" is a plain BPE model and reads its options; returns it.
StatusOr<const json*> TokenizerJsonLoader::ReadModel(const json& root) {
  auto model_it = root.find("model");
  if (model_it == root.end() || model_it->is_null()) return err_.Missing("model");
  const json& model = *model_it;
  if (!model.is_object()) return err_.Field("model", "expected an object, got " + TypeName(model));
  auto type_it = model.find("type");
  if (type_it != model.end() && !type_it->is_string()) return err_.Field("model.type", "expected a string");
  const std::string model_type = type_it == model.end() ? "BPE" : type_it->get<std::string>();
  if (model_type != "BPE") return err_.Unsupported("model", model_type, "BPE only");
  auto d = model.find("dropout");
  if (d != model.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0.0)) {
    return err_.Field("model.dropout", "BPE dropout is not supported (must be null)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto s = model.find(key);
    if (s != model.end() && !s->is_null() && !(s->is_string() && s->get<std::string>().empty())) {
      return err_.Field(std::string("model.") + key, "is not supported (must be empty)");
    }
  }
  SFT_ASSIGN_OR_RETURN(byte_fallback_, OptionalBool(model, "byte_fallback", false, err_, "model"));
  SFT_ASSIGN_OR_RETURN(tok_->ignore_merges_, OptionalBool(model, "ignore_merges", false, err_, "model"));
  return &model;
}

// A ByteLevel pre-tokenizer step makes a byte-level vocabulary; without one the vocabulary is
// SentencePiece-style, which needs byte fallback (transformers.js and Hugging Face would write
// characters missing from the vocabulary as <unk>, fused differently: not supported).
Status TokenizerJsonLoader::CheckVocabularyKind() const {
  if (byte_level_ && byte_fallback_) {
    return err_.Field("model.byte_fallback", "is not supported by byte-level BPE");
  }
  if (!byte_level_ && !byte_fallback_) {
    return err_.Field("pre_tokenizer",
                      "has no ByteLevel step and model.byte_fallback is not true: only byte-level BPE and "
                      "SentencePiece-style BPE with byte fallback are supported");
  }
  return OkStatus();
}

// Checks the ids of "model.vocab" and raises *max_id to the largest; returns the vocab.
StatusOr<const json*> TokenizerJsonLoader::ReadVocab(const json& model, int64_t* max_id) const {
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end()) return err_.Missing("model.vocab");
  if (!vocab_it->is_object()) return err_.Field("model.vocab", "expected an object of token -> id");
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= INT32_MAX) {
      return err_.Field("model.vocab", "id of '" + Truncated(it.key()) + "' is not a non-negative integer");
    }
    *max_id = std::max<int64_t>(*max_id, it.value().get<int64_t>());
  }
  return &*vocab_it;
}

StatusOr<std::vector<AddedToken>> TokenizerJsonLoader::ReadAddedTokens(const json& root) const {
  std::vector<AddedToken> added;
  if (auto at = root.find("added_tokens"); at != root.end() && !at->is_null()) {
    if (!at->is_array()) return err_.Field("added_tokens", "expected an array");
    for (size_t i = 0; i < at->size(); ++i) {
      SFT_ASSIGN_OR_RETURN(
          AddedToken t,
          ParseAddedToken((*at)[i], err_, "added_tokens[" + std::to_string(i) + "]", std::nullopt));
      added.push_back(std::move(t));
    }
  }
  return added;
}

// Parses tokenizer_config.json (when given) into *config, adds its added_tokens_decoder entries
// to *added and flags its additional_special_tokens special.
Status TokenizerJsonLoader::ReadConfig(std::string_view config_text, json* config,
                                       std::vector<AddedToken>* added) const {
  if (config_text.empty()) return OkStatus();
  SFT_ASSIGN_OR_RETURN(*config, ParseJson(config_text, cfg_err_.label));
  if (!config->is_object())
    return InvalidArgumentError(cfg_err_.label + ": expected a JSON object at the top level");
  if (auto atd = config->find("added_tokens_decoder"); atd != config->end() && !atd->is_null()) {
    SFT_RETURN_IF_ERROR(ReadAddedTokensDecoder(*atd, added));
  }
  if (auto ast = config->find("additional_special_tokens"); ast != config->end() && ast->is_array()) {
    for (const json& s : *ast) {
      const std::string content = s.is_string() ? s.get<std::string>()
                                  : (s.is_object() && s.contains("content") && s["content"].is_string())
                                      ? s["content"].get<std::string>()
                                      : std::string();
      for (AddedToken& a : *added) {
        if (a.content == content) a.special = true;
      }
    }
  }
  return OkStatus();
}

Status TokenizerJsonLoader::ReadAddedTokensDecoder(const json& atd, std::vector<AddedToken>* added) const {
  if (!atd.is_object()) return cfg_err_.Field("added_tokens_decoder", "expected an object of id -> token");
  for (auto it = atd.begin(); it != atd.end(); ++it) {
    const int64_t id = IdOfKey(it.key());
    if (id < 0 || id >= INT32_MAX) {
      return cfg_err_.Field("added_tokens_decoder", "key '" + Truncated(it.key()) + "' is not a token id");
    }
    const bool known =
        std::any_of(added->begin(), added->end(), [&](const AddedToken& a) { return a.id == id; });
    if (known) continue;  // tokenizer.json is authoritative
    SFT_ASSIGN_OR_RETURN(
        AddedToken t,
        ParseAddedToken(it.value(), cfg_err_, "added_tokens_decoder." + it.key(), static_cast<int32_t>(id)));
    added->push_back(std::move(t));
  }
  return OkStatus();
}

// The number of ids (the largest + 1). Id tables are sized by the largest id: a few unused ids
// are normal (reserved slots), but an id far past the number of tokens defined would size them
// to gigabytes.
StatusOr<size_t> TokenizerJsonLoader::CountIds(int64_t max_id, const json& vocab,
                                               const std::vector<AddedToken>& added) const {
  for (const AddedToken& a : added) max_id = std::max<int64_t>(max_id, a.id);
  const int64_t defined = static_cast<int64_t>(vocab.size() + added.size());
  if (max_id >= defined + kMaxUnusedIds) {
    return err_.Field("model.vocab", "the largest token id, " + std::to_string(max_id) +
                                         ", is far beyond the " + std::to_string(defined) +
                                         " tokens defined (a corrupt or sparse vocab)");
  }
  return static_cast<size_t>(max_id + 1);
}

Status TokenizerJsonLoader::BuildIdTables(const json& vocab, const std::vector<AddedToken>& added,
                                          size_t n_ids) {
  BpeTokenizer& t = *tok_;
  t.vocab_size_ = static_cast<int32_t>(n_ids);
  t.id_to_token_.assign(n_ids, std::string());
  t.id_to_bytes_.assign(n_ids, std::string());
  t.id_flags_.assign(n_ids, 0);
  std::vector<uint8_t> byte_level(n_ids, 0);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    if (t.id_flags_[id] & kFlagValid) {
      return err_.Field("model.vocab", "id " + std::to_string(id) + " is used by both '" +
                                           Truncated(t.id_to_token_[id]) + "' and '" + Truncated(it.key()) +
                                           "'");
    }
    t.id_flags_[id] = kFlagValid;
    t.id_to_token_[id] = it.key();
    if (byte_level_) byte_level[id] = ByteLevelToBytes(it.key(), &t.id_to_bytes_[id]) ? 1 : 0;
  }
  for (const AddedToken& a : added) {
    const auto id = static_cast<size_t>(a.id);
    if ((t.id_flags_[id] & kFlagValid) && !(t.id_flags_[id] & kFlagAdded) &&
        t.id_to_token_[id] != a.content) {
      return err_.Field("added_tokens", "token '" + Truncated(a.content) + "' has id " + std::to_string(id) +
                                            ", which model.vocab gives to '" + Truncated(t.id_to_token_[id]) +
                                            "'");
    }
    t.id_flags_[id] = kFlagValid | kFlagAdded | (a.special ? kFlagSpecial : 0);
    t.id_to_token_[id] = a.content;
    t.id_to_bytes_[id] = a.content;
    byte_level[id] = 0;
  }
  t.token_to_id_.reserve(n_ids);
  t.bytes_to_id_.reserve(n_ids);
  for (size_t id = 0; id < n_ids; ++id) {
    if (!(t.id_flags_[id] & kFlagValid)) continue;
    t.token_to_id_.emplace(t.id_to_token_[id], static_cast<int32_t>(id));
    if (byte_level[id]) t.bytes_to_id_.emplace(t.id_to_bytes_[id], static_cast<int32_t>(id));
  }
  // Added tokens also resolve by their content (already in token_to_id_ as id_to_token_).
  return byte_level_ ? FindByteIds() : BuildCharVocab();
}

// SentencePiece-style: the one-character tokens and the 256 byte-fallback tokens "<0xNN>".
Status TokenizerJsonLoader::BuildCharVocab() {
  tok_->char_vocab_ = std::make_unique<CharVocab>();
  int missing = 0;
  if (!tok_->char_vocab_->Build(tok_->token_to_id_, &missing)) {
    return err_.Field("model.vocab", "has no byte-fallback token '" +
                                         ByteFallbackToken(static_cast<unsigned char>(missing)) +
                                         "' (model.byte_fallback is true)");
  }
  return OkStatus();
}

// The token of each single byte; every byte that occurs in well-formed UTF-8 must have one.
Status TokenizerJsonLoader::FindByteIds() {
  BpeTokenizer& t = *tok_;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    auto it = t.bytes_to_id_.find(one);
    t.byte_ids_[b] = it == t.bytes_to_id_.end() ? -1 : it->second;
    const bool needed = b < 0xC0 || (b >= 0xC2 && b <= 0xF4);
    if (t.byte_ids_[b] < 0 && needed) {
      return err_.Field("model.vocab", "has no token for byte 0x" +
                                           std::string(1, "0123456789ABCDEF"[b >> 4]) +
                                           std::string(1, "0123456789ABCDEF"[b & 15]) + " ('" +
                                           BytesToByteLevel(one) + "'): not a byte-level BPE vocabulary");
    }
  }
  return OkStatus();
}

Status TokenizerJsonLoader::ReadMerges(const json& model) {
  auto merges_it = model.find("merges");
  if (merges_it == model.end()) return err_.Missing("model.merges");
  if (!merges_it->is_array()) return err_.Field("model.merges", "expected an array");
  tok_->merges_ = std::make_unique<MergeTable>(merges_it->size());
  const auto& token_to_id = tok_->token_to_id_;
  std::string left, right, both;
  for (size_t i = 0; i < merges_it->size(); ++i) {
    const json& m = (*merges_it)[i];
    auto path = [i] { return "model.merges[" + std::to_string(i) + "]"; };
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
          s.find(' ', sp + 1) != std::string::npos) {
        return err_.Field(path(), "expected \"left right\" (one space), got \"" + Truncated(s) + "\"");
      }
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get_ref<const std::string&>();
      right = m[1].get_ref<const std::string&>();
    } else {
      return err_.Field(path(),
                        "expected \"left right\" or [\"left\", \"right\"], got " + Truncated(m.dump()));
    }
    auto a = token_to_id.find(left);
    if (a == token_to_id.end())
      return err_.Field(path(), "token '" + Truncated(left) + "' is not in model.vocab");
    auto b = token_to_id.find(right);
    if (b == token_to_id.end())
      return err_.Field(path(), "token '" + Truncated(right) + "' is not in model.vocab");
    both.assign(left).append(right);
    auto merged = token_to_id.find(both);
    if (merged == token_to_id.end()) {
      return err_.Field(path(), "merged token '" + Truncated(both) + "' is not in model.vocab");
    }
    tok_->merges_->Insert(a->second, b->second, static_cast<int32_t>(i), merged->second);
  }
  return OkStatus();
}

Status TokenizerJsonLoader::ReadNormalizer(const json& root) {
  auto nit = root.find("normalizer");
  if (nit == root.end() || nit->is_null()) return OkStatus();
  return WalkSequence(*nit, "normalizer", kNormalizerSequence, err_,
                      [&](const json& n, const std::string& path, const std::string& type) -> Status {
                        SFT_ASSIGN_OR_RETURN(NormalizerStep step, ParseNormalizerStep(n, path, type, err_));
                        tok_->normalizers_.push_back(std::move(step));
                        return OkStatus();
                      });
}

// Reads the pre-tokenizer steps, and sets byte_level_ when one of them is ByteLevel.
Status TokenizerJsonLoader::ReadPreTokenizer(const json& root) {
  byte_level_ = false;
  auto pit = root.find("pre_tokenizer");
  if (pit == root.end() || pit->is_null()) return OkStatus();  // SentencePiece-style (Llama-2): none
  auto& steps = tok_->pre_tokenizers_;
  SFT_RETURN_IF_ERROR(WalkSequence(
      *pit, "pre_tokenizer", kPreTokenizerSequence, err_,
      [&](const json& p, const std::string& path, const std::string& type) -> Status {
        if (type != "ByteLevel" && type != "Split") {
          return err_.Unsupported(path, type, "Split, ByteLevel, Sequence");
        }
        byte_level_ = byte_level_ || type == "ByteLevel";
        SFT_ASSIGN_OR_RETURN(PreTokenizerStep step,
                             type == "ByteLevel" ? ParseByteLevel(p, path, err_) : ParseSplit(p, path, err_));
        steps.push_back(std::move(step));
        return OkStatus();
      }));
  // A ByteLevel step without prefix space or regex only maps bytes, which the model does
  // implicitly: drop it from the pipeline.
  steps.erase(std::remove_if(steps.begin(), steps.end(),
                             [](const PreTokenizerStep& s) {
                               return s.kind == PreTokenizerStep::Kind::kByteLevel && !s.add_prefix_space &&
                                      !s.regex;
                             }),
              steps.end());
  return OkStatus();
}

// Byte-level: the decoder is checked only (byte-level decoding is the id -> bytes table).
// SentencePiece-style: its steps are read, and each token's DecodeBytes form is tabled.
Status TokenizerJsonLoader::ReadDecoder(const json& root) {
  auto dit = root.find("decoder");
  if (dit == root.end() || dit->is_null()) return err_.Missing("decoder");
  BpeTokenizer& t = *tok_;
  SFT_RETURN_IF_ERROR(
      WalkSequence(*dit, "decoder", kDecoderSequence, err_,
                   [&](const json& d, const std::string& path, const std::string& type) -> Status {
                     if (byte_level_) {
                       if (type == "ByteLevel") return OkStatus();
                       return err_.Unsupported(path, type, "ByteLevel, Sequence");
                     }
                     SFT_ASSIGN_OR_RETURN(DecoderStep step, ParseDecoderStep(d, path, type, err_));
                     t.decoders_.push_back(std::move(step));
                     return OkStatus();
                   }));
  if (!byte_level_) {
    for (size_t id = 0; id < t.id_to_token_.size(); ++id) {
      if (t.id_flags_[id] & kFlagValid)
        t.id_to_bytes_[id] = DecodeTokenBytes(t.id_to_token_[id], t.decoders_);
    }
  }
  return OkStatus();
}

void TokenizerJsonLoader::BuildAddedTokenMatchers(std::vector<AddedToken> added) {
  BpeTokenizer& t = *tok_;
  for (auto& m : t.raw_matchers_) m = std::make_unique<AddedTokenMatcher>();
  for (auto& m : t.normalized_matchers_) m = std::make_unique<AddedTokenMatcher>();
  for (const AddedToken& a : added) {
    // Without a normalizer "normalized" makes no difference: match everything on raw text.
    const bool on_normalized = a.normalized && !t.normalizers_.empty();
    auto* matchers = on_normalized ? t.normalized_matchers_ : t.raw_matchers_;
    matchers[0]->Add(a);
    if (!a.special) matchers[1]->Add(a);
  }
  t.added_tokens_ = std::move(added);
}

// Special token ids from tokenizer_config.json.
Status TokenizerJsonLoader::ResolveSpecialIds(const json& config) {
  auto resolve = [&](const char* key, std::optional<int32_t>* out) -> Status {
    SFT_ASSIGN_OR_RETURN(std::optional<std::string> content, ConfigToken(config, key, cfg_err_));
    if (!content) return OkStatus();
    auto id = tok_->TokenToId(*content);
    if (!id) return cfg_err_.Field(key, "token '" + Truncated(*content) + "' is not in the vocabulary");
    *out = *id;
    return OkStatus();
  };
  SFT_RETURN_IF_ERROR(resolve("eos_token", &tok_->eos_id_));
  SFT_RETURN_IF_ERROR(resolve("pad_token", &tok_->pad_id_));
  SFT_RETURN_IF_ERROR(resolve("bos_token", &tok_->bos_id_));
  return OkStatus();
}

// The special tokens around a single sequence: tokenizer.json's post_processor, except that, as
// transformers' LlamaTokenizerFast and GemmaTokenizerFast rebuild it from tokenizer_config.json's
// add_bos_token / add_eos_token (update_post_processor), those flags decide for these classes
// when the config sets them.
Status TokenizerJsonLoader::ReadPostProcessor(const json& root, const json& config) {
  BpeTokenizer& t = *tok_;
  auto token_of = [&t](int64_t id) -> std::optional<std::string> {
    if (id < 0 || id > INT32_MAX) return std::nullopt;
    return t.IdToToken(static_cast<int32_t>(id));
  };
  SFT_ASSIGN_OR_RETURN(t.special_, ParsePostProcessor(root, err_.label, token_of));
  auto cls = config.find("tokenizer_class");
  std::string name = cls != config.end() && cls->is_string() ? cls->get<std::string>() : "";
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Fast") == 0) name.resize(name.size() - 4);
  if (name != "LlamaTokenizer" && name != "CodeLlamaTokenizer" && name != "GemmaTokenizer") return OkStatus();
  auto flag = [&](const char* key, bool is_bos) -> Status {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return OkStatus();
    if (!it->is_boolean()) return cfg_err_.Field(key, "expected a boolean");
    std::vector<int32_t>& ids = is_bos ? t.special_.prefix : t.special_.suffix;
    std::string& text = is_bos ? t.special_.prefix_text : t.special_.suffix_text;
    ids.clear();
    text.clear();
    if (!it->get<bool>()) return OkStatus();
    const std::optional<int32_t> id = is_bos ? t.bos_id_ : t.eos_id_;
    if (!id)
      return cfg_err_.Field(key,
                            std::string("is true but there is no ") + (is_bos ? "bos_token" : "eos_token"));
    ids.push_back(*id);
    text = *t.IdToToken(*id);
    return OkStatus();
  };
  SFT_RETURN_IF_ERROR(flag("add_bos_token", true));
  return flag("add_eos_token", false);
}

}  // namespace bpe_internal

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view tokenizer_config_json,
                                                               const std::string& json_label,
                                                               const std::string& config_label,
                                                               std::string name) {
  return bpe_internal::TokenizerJsonLoader(json_label, config_label)
      .Load(tokenizer_json, tokenizer_config_json, std::move(name));
}

}  // namespace sftctl
