#include "common/formats/gguf_tokenizer.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "common/json_parse.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/unicode_normalize.h"

namespace sftctl::gguf {
namespace {

using json = nlohmann::json;

// The split regexes of tokenizer.json pre-tokenizers llama.cpp knows by name.
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The leaves of a pre_tokenizer (Sequences flattened, in order). tokenizer.json was already
// accepted by BpeTokenizer, so the nesting is well formed.
void Leaves(const json& node, std::vector<const json*>* out) {
  if (node.value("type", "") == "Sequence" && node.contains("pretokenizers")) {
    for (const json& p : node["pretokenizers"]) Leaves(p, out);
    return;
  }
  out->push_back(&node);
}

StatusOr<std::string> PreTokenizerName(const json& root, const std::string& label) {
  std::vector<const json*> leaves;
  if (root.contains("pre_tokenizer") && root["pre_tokenizer"].is_object())
    Leaves(root["pre_tokenizer"], &leaves);
  auto byte_level = [](const json* p, bool use_regex) {
    return p->value("type", "") == "ByteLevel" && p->value("use_regex", true) == use_regex;
  };
  if (leaves.size() == 1 && byte_level(leaves[0], true)) return std::string("gpt-2");
  if (leaves.size() == 2 && leaves[0]->value("type", "") == "Split" && byte_level(leaves[1], false)) {
    const json& pattern = (*leaves[0])["pattern"];
    const std::string regex = pattern.is_object() ? pattern.value("Regex", "") : "";
    if (regex == kQwen2Regex) return std::string("qwen2");
    if (regex == kLlama3Regex) return std::string("llama-bpe");
  }
  return InvalidArgumentError(label +
                              ": pre_tokenizer: not one llama.cpp knows by name (sftctl recognises Qwen2's "
                              "and Llama-3's split regex and GPT-2's byte-level splitting); llama.cpp would "
                              "split text differently from this tokenizer");
}

std::vector<std::string> Merges(const json& root) {
  std::vector<std::string> out;
  for (const json& m : root["model"]["merges"]) {
    out.push_back(m.is_string() ? m.get<std::string>()
                                : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  return out;
}

// Whether tokenizer.json's post_processor starts a single sequence with `bos`.
bool PostProcessorAddsBos(const json& root, const std::string& bos) {
  auto pp = root.find("post_processor");
  if (pp == root.end() || !pp->is_object()) return false;
  std::vector<const json*> nodes = {&*pp};
  if (pp->value("type", "") == "Sequence" && pp->contains("processors") && (*pp)["processors"].is_array()) {
    for (const json& p : (*pp)["processors"]) nodes.push_back(&p);
  }
  for (const json* n : nodes) {
    if (!n->is_object() || n->value("type", "") != "TemplateProcessing") continue;
    auto single = n->find("single");
    if (single == n->end() || !single->is_array() || single->empty()) continue;
    const json& first = (*single)[0];
    if (first.is_object() && first.contains("SpecialToken") && first["SpecialToken"].is_object() &&
        first["SpecialToken"].value("id", "") == bos) {
      return true;
    }
  }
  return false;
}

Status ReadChatTemplates(const json& config, const std::string& config_path, const std::string& dir,
                         FileSystem* fs, TokenizerMetadata* t) {
  auto it = config.find("chat_template");
  if (it != config.end() && it->is_string()) {
    t->chat_templates.emplace_back("", it->get<std::string>());
  } else if (it != config.end() && it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
          !e["template"].is_string()) {
        return FieldError(config_path, "chat_template[" + std::to_string(i) + "]",
                          "expected {\"name\": ..., \"template\": ...}");
      }
      const std::string name = e["name"].get<std::string>();
      t->chat_templates.emplace_back(name == "default" ? "" : name, e["template"].get<std::string>());
    }
  } else if (it != config.end() && !it->is_null()) {
    return FieldError(config_path, "chat_template", "must be a string or a list of named templates");
  } else if (const std::string jinja = JoinPath(dir, "chat_template.jinja"); fs->Exists(jinja)) {
    SFT_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(jinja));
    t->chat_templates.emplace_back("", std::move(text));
  }
  return OkStatus();
}

void FillTokens(const BpeTokenizer& tok, int64_t n_vocab, TokenizerMetadata* t) {
  std::set<int32_t> added;
  for (const AddedToken& a : tok.added_tokens()) added.insert(a.id);
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (!tok.IsValidId(id)) {
      t->tokens.push_back("[PAD" + std::to_string(id) + "]");
      t->token_types.push_back(static_cast<int32_t>(TokenType::kUnused));
      continue;
    }
    t->tokens.push_back(*tok.IdToToken(id));
    TokenType type = TokenType::kNormal;
    if (added.count(id)) type = tok.IsSpecial(id) ? TokenType::kControl : TokenType::kUserDefined;
    t->token_types.push_back(static_cast<int32_t>(type));
  }
}

// ---------------------------------------------------------------------------------------
// SentencePiece-style BPE as llama.cpp's SPM vocabulary (tokenizer.ggml.model "llama").
//
// llama.cpp's SPM tokenizer splits a text into characters and repeatedly merges the adjacent
// pair whose concatenation is a token with the highest score (the leftmost on ties); Hugging
// Face's BPE merges the listed pair with the lowest rank. Each token is scored -(1 + the rank of
// the first merge that forms it), so llama.cpp takes merges in rank order, and a tokenizer where
// llama.cpp could merge a pair Hugging Face has no merge for is refused.

constexpr const char* kSpiece = "\xE2\x96\x81";  // "▁", SentencePiece's space

// The steps of a normalizer / pre-tokenizer / decoder, Sequences flattened (BpeTokenizer accepted
// the nesting).
void Steps(const json& node, const char* list_key, std::vector<const json*>* out) {
  if (!node.is_object()) return;
  if (node.value("type", "") == "Sequence" && node.contains(list_key) && node[list_key].is_array()) {
    for (const json& p : node[list_key]) Steps(p, list_key, out);
    return;
  }
  out->push_back(&node);
}

std::vector<const json*> Steps(const json& root, const char* key, const char* list_key) {
  std::vector<const json*> out;
  if (auto it = root.find(key); it != root.end()) Steps(*it, list_key, &out);
  return out;
}

// A Replace's {"String": ...} pattern ("" for any other).
std::string StringPattern(const json& step) {
  auto p = step.find("pattern");
  if (p == step.end() || !p->is_object() || !p->contains("String") || !(*p)["String"].is_string()) return "";
  return (*p)["String"].get<std::string>();
}

bool IsReplace(const json& step, const std::string& from, const std::string& to) {
  return step.value("type", "") == "Replace" && StringPattern(step) == from &&
         step.value("content", "") == to;
}

// llama.cpp escapes every space as "▁" and, with add_space_prefix, puts one space before the
// text and after each added token: the normalizer must be Replace " " -> "▁", optionally with
// Prepend "▁" (returned: add_space_prefix). The pre-tokenizer must do nothing: none, or a Split
// on " " (Gemma), which finds no space once the normalizer has replaced them.
StatusOr<bool> SpmNormalizer(const json& root, const std::string& label) {
  int replaces = 0;
  bool prepend = false;
  for (const json* n : Steps(root, "normalizer", "normalizers")) {
    if (IsReplace(*n, " ", kSpiece)) {
      ++replaces;
    } else if (n->value("type", "") == "Prepend" && n->value("prepend", "") == kSpiece) {
      prepend = true;
    } else {
      return FieldError(label, "normalizer",
                        "step " + n->dump().substr(0, 80) +
                            ": llama.cpp's SentencePiece tokenizer only replaces spaces by \"▁\" (and "
                            "prepends one: add_space_prefix); it would tokenize differently");
    }
  }
  if (replaces != 1) {
    return FieldError(label, "normalizer",
                      "must replace \" \" by \"▁\" once, as llama.cpp's SentencePiece tokenizer does");
  }
  for (const json* p : Steps(root, "pre_tokenizer", "pretokenizers")) {
    if (p->value("type", "") != "Split" || StringPattern(*p) != " " || p->value("invert", false)) {
      return FieldError(
          label, "pre_tokenizer",
          p->dump().substr(0, 80) +
              ": llama.cpp's SentencePiece tokenizer does not split the text before merging "
              "(only a Split on \" \", which finds no space after the normalizer, is accepted)");
    }
  }
  return prepend;
}

// The decoder llama.cpp's SPM detokenizer reproduces: "▁" -> " ", byte tokens as bytes, and (with
// add_space_prefix) the leading space stripped.
Status SpmDecoder(const json& root, const std::string& label, bool prepend) {
  bool replace = false, byte_fallback = false;
  for (const json* d : Steps(root, "decoder", "decoders")) {
    const std::string type = d->value("type", "");
    replace = replace || IsReplace(*d, kSpiece, " ");
    byte_fallback = byte_fallback || type == "ByteFallback";
    const bool strip = type == "Strip" && prepend && d->value("content", "") == " " &&
                       d->value("start", 0) == 1 && d->value("stop", 0) == 0;
    if (!IsReplace(*d, kSpiece, " ") && type != "ByteFallback" && type != "Fuse" && !strip) {
      return FieldError(label, "decoder",
                        "step " + d->dump().substr(0, 80) +
                            ": llama.cpp's SentencePiece detokenizer would decode differently (it turns "
                            "\"▁\" into spaces and byte tokens into bytes, and strips the prepended space)");
    }
  }
  if (!replace || !byte_fallback) {
    return FieldError(label, "decoder",
                      "must replace \"▁\" by \" \" and decode byte fallback (ByteFallback), as llama.cpp's "
                      "SentencePiece detokenizer does");
  }
  return OkStatus();
}

// tokenizer.json's merges: the rank of the first merge forming each token, and every pair.
struct SpmMerges {
  std::unordered_map<std::string, int64_t> first_rank;
  std::unordered_set<std::string> pairs;  // left + '\0' + right
};

StatusOr<SpmMerges> ReadSpmMerges(const json& root, const std::string& label) {
  const json& model = root["model"];
  if (model.value("ignore_merges", false)) {
    return FieldError(label, "model.ignore_merges",
                      "true: llama.cpp's SentencePiece tokenizer always merges (a whole word in the "
                      "vocabulary is not taken at once)");
  }
  const json& merges = model["merges"];
  if (merges.size() > (size_t{1} << 24)) {
    return FieldError(label, "model.merges", "more merges than float32 scores can rank exactly (2^24)");
  }
  SpmMerges m;
  m.pairs.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    std::string left, right;
    if (merges[i].is_string()) {
      const std::string& s = merges[i].get_ref<const std::string&>();
      left = s.substr(0, s.find(' '));
      right = s.substr(s.find(' ') + 1);
    } else {
      left = merges[i][0].get<std::string>();
      right = merges[i][1].get<std::string>();
    }
    m.first_rank.emplace(left + right, static_cast<int64_t>(i));
    m.pairs.insert(left + '\0' + right);
  }
  return m;
}

// Refuses a token that llama.cpp could form from two adjacent pieces (each a character or a
// merge's result) that tokenizer.json has no merge for: Hugging Face would keep them apart.
Status CheckSplitsHaveMerges(const std::vector<std::string>& tokens, const SpmMerges& m,
                             const std::string& label) {
  auto formable = [&](std::string_view piece) {
    size_t pos = 0;
    if (IsValidUtf8(piece) && (NextCodePoint(piece, &pos), pos == piece.size())) return true;
    return m.first_rank.count(std::string(piece)) > 0;
  };
  for (const std::string& t : tokens) {
    if (!IsValidUtf8(t)) continue;
    size_t pos = 0;
    NextCodePoint(t, &pos);
    for (; pos < t.size(); NextCodePoint(t, &pos)) {
      const std::string_view left(t.data(), pos), right(t.data() + pos, t.size() - pos);
      if (!formable(left) || !formable(right)) continue;
      if (m.pairs.count(std::string(left) + '\0' + std::string(right))) continue;
      return FieldError(label, "model.merges",
                        "has no merge \"" + std::string(left) + " " + std::string(right) +
                            "\" although both " + "pieces can form and make the token '" + t +
                            "': llama.cpp's SentencePiece tokenizer merges any two adjacent pieces that make "
                            "a token, Hugging Face's BPE only the listed pairs");
    }
  }
  return OkStatus();
}

std::string ByteToken(int b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

// Whether tokenizer.json's post_processor ends a single sequence with `eos`.
bool PostProcessorAddsEos(const json& root, const std::string& eos) {
  auto pp = root.find("post_processor");
  if (pp == root.end() || !pp->is_object() || pp->value("type", "") != "TemplateProcessing") return false;
  auto single = pp->find("single");
  if (single == pp->end() || !single->is_array() || single->empty()) return false;
  const json& last = single->back();
  return last.is_object() && last.contains("SpecialToken") && last["SpecialToken"].is_object() &&
         last["SpecialToken"].value("id", "") == eos;
}

// Added tokens llama.cpp matches in the raw text, where Hugging Face matches normalized ones
// after the normalizer: the same only without Prepend and without spaces in the token.
Status CheckAddedTokens(const BpeTokenizer& tok, bool prepend, const std::string& label) {
  for (const AddedToken& a : tok.added_tokens()) {
    if (!a.normalized) continue;
    if (prepend || a.content.find(kSpiece) != std::string::npos || a.content.find(' ') != std::string::npos) {
      return FieldError(label, "added_tokens",
                        "'" + a.content +
                            "' is normalized (matched after the normalizer); llama.cpp matches added tokens "
                            "in the raw text, so it would split the text differently (write normalized: "
                            "false)");
    }
  }
  return OkStatus();
}

// Fills the SPM vocabulary: types (byte tokens BYTE, the unknown token UNKNOWN), scores, flags.
Status FillSpm(const json& root, const json& config, const BpeTokenizer& tok, const std::string& label,
               TokenizerMetadata* t) {
  SFT_ASSIGN_OR_RETURN(bool prepend, SpmNormalizer(root, label));
  SFT_RETURN_IF_ERROR(SpmDecoder(root, label, prepend));
  SFT_RETURN_IF_ERROR(CheckAddedTokens(tok, prepend, label));
  for (int b = 0; b < 256; ++b) {
    if (!tok.TokenToId(ByteToken(b))) {
      return FieldError(label, "model.vocab",
                        "has no token '" + ByteToken(b) +
                            "': llama.cpp looks byte-fallback tokens up by that (upper-case) name");
    }
  }
  SFT_ASSIGN_OR_RETURN(SpmMerges merges, ReadSpmMerges(root, label));
  SFT_RETURN_IF_ERROR(CheckSplitsHaveMerges(t->tokens, merges, label));
  t->model = "llama";
  t->add_space_prefix = prepend;
  if (auto unk = root["model"].find("unk_token"); unk != root["model"].end() && unk->is_string()) {
    t->unk = tok.TokenToId(unk->get<std::string>());
  }
  t->scores.assign(t->tokens.size(), 0.0f);
  for (size_t id = 0; id < t->tokens.size(); ++id) {
    if (auto r = merges.first_rank.find(t->tokens[id]); r != merges.first_rank.end())
      t->scores[id] = -1.0f - static_cast<float>(r->second);
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t id = *tok.TokenToId(ByteToken(b));
    if (t->token_types[id] == static_cast<int32_t>(TokenType::kNormal))
      t->token_types[id] = static_cast<int32_t>(TokenType::kByte);
  }
  if (t->unk) t->token_types[*t->unk] = static_cast<int32_t>(TokenType::kUnknown);
  if (auto a = config.find("add_eos_token"); a != config.end() && a->is_boolean()) {
    t->add_eos = a->get<bool>();
  } else if (t->eos) {
    t->add_eos = PostProcessorAddsEos(root, tok.IdToToken(*t->eos).value_or(""));
  }
  return OkStatus();
}

}  // namespace

StatusOr<TokenizerMetadata> ReadTokenizerMetadata(const std::string& dir, int64_t n_vocab,
                                                  std::optional<int32_t> bos, std::optional<int32_t> eos,
                                                  FileSystem* fs) {
  if (fs == nullptr) fs = FileSystem::Default();
  const std::string json_path = JoinPath(dir, "tokenizer.json");
  const std::string config_path = JoinPath(dir, "tokenizer_config.json");
  if (!fs->Exists(json_path)) {
    if (fs->Exists(JoinPath(dir, "sftctl_tokenizer.json"))) {
      return FailedPreconditionError(
          dir +
          ": the model uses sftctl's built-in byte tokenizer (sftctl_tokenizer.json), which has no GGUF "
          "form; GGUF export needs a Hugging Face tokenizer.json (byte-level BPE)");
    }
    return NotFoundError(json_path + ": not found (GGUF export needs the model's Hugging Face tokenizer)");
  }
  SFT_ASSIGN_OR_RETURN(std::string json_text, fs->ReadFile(json_path));
  std::string config_text;
  if (fs->Exists(config_path)) {
    SFT_ASSIGN_OR_RETURN(config_text, fs->ReadFile(config_path));
  }
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tok,
                       BpeTokenizer::FromJson(json_text, config_text, json_path, config_path, "bpe:" + dir));
  if (tok->vocab_size() > n_vocab) {
    return InvalidArgumentError(json_path + ": has " + std::to_string(tok->vocab_size()) +
                                " token ids but the model's vocab_size (embedding rows) is " +
                                std::to_string(n_vocab));
  }
  SFT_ASSIGN_OR_RETURN(json root, ParseJson(json_text, json_path));
  json config = json::object();
  if (!config_text.empty()) {
    SFT_ASSIGN_OR_RETURN(config, ParseJson(config_text, config_path));
  }

  TokenizerMetadata t;
  if (tok->byte_level()) {
    SFT_ASSIGN_OR_RETURN(t.pre, PreTokenizerName(root, json_path));
    t.merges = Merges(root);
  }
  FillTokens(*tok, n_vocab, &t);
  t.bos = tok->bos_id() ? tok->bos_id() : bos;
  t.eos = tok->eos_id() ? tok->eos_id() : eos;
  t.pad = tok->pad_id();
  if (auto a = config.find("add_bos_token"); a != config.end() && a->is_boolean()) {
    t.add_bos = a->get<bool>();
  } else if (t.bos) {
    t.add_bos = PostProcessorAddsBos(root, tok->IdToToken(*t.bos).value_or(""));
  }
  if (!tok->byte_level()) SFT_RETURN_IF_ERROR(FillSpm(root, config, *tok, json_path, &t));
  SFT_RETURN_IF_ERROR(ReadChatTemplates(config, config_path, dir, fs, &t));
  return t;
}

void SetTokenizerMetadata(const TokenizerMetadata& t, GgufWriter* w) {
  const bool spm = t.model == "llama";
  w->SetString("tokenizer.ggml.model", t.model);
  if (!spm) w->SetString("tokenizer.ggml.pre", t.pre);
  w->SetStringArray("tokenizer.ggml.tokens", t.tokens);
  if (spm) w->SetFloat32Array("tokenizer.ggml.scores", t.scores);
  w->SetInt32Array("tokenizer.ggml.token_type", t.token_types);
  if (!spm) w->SetStringArray("tokenizer.ggml.merges", t.merges);
  if (t.unk) w->SetUint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(*t.unk));
  if (t.bos) w->SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*t.bos));
  if (t.eos) w->SetUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*t.eos));
  if (t.pad) w->SetUint32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*t.pad));
  w->SetBool("tokenizer.ggml.add_bos_token", t.add_bos);
  if (spm) {
    w->SetBool("tokenizer.ggml.add_eos_token", t.add_eos);
    w->SetBool("tokenizer.ggml.add_space_prefix", t.add_space_prefix);
  }
  for (const auto& [name, text] : t.chat_templates) {
    w->SetString(name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name, text);
  }
}

}  // namespace sftctl::gguf
