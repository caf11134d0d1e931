#include "common/formats/gguf_tokenizer.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "common/json_parse.h"
#include "common/tokenizer/bpe_tokenizer.h"

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
  SFT_ASSIGN_OR_RETURN(t.pre, PreTokenizerName(root, json_path));
  FillTokens(*tok, n_vocab, &t);
  t.merges = Merges(root);
  t.bos = tok->bos_id() ? tok->bos_id() : bos;
  t.eos = tok->eos_id() ? tok->eos_id() : eos;
  t.pad = tok->pad_id();
  if (auto a = config.find("add_bos_token"); a != config.end() && a->is_boolean()) {
    t.add_bos = a->get<bool>();
  } else if (t.bos) {
    t.add_bos = PostProcessorAddsBos(root, tok->IdToToken(*t.bos).value_or(""));
  }
  SFT_RETURN_IF_ERROR(ReadChatTemplates(config, config_path, dir, fs, &t));
  return t;
}

void SetTokenizerMetadata(const TokenizerMetadata& t, GgufWriter* w) {
  w->SetString("tokenizer.ggml.model", "gpt2");
  w->SetString("tokenizer.ggml.pre", t.pre);
  w->SetStringArray("tokenizer.ggml.tokens", t.tokens);
  w->SetInt32Array("tokenizer.ggml.token_type", t.token_types);
  w->SetStringArray("tokenizer.ggml.merges", t.merges);
  if (t.bos) w->SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*t.bos));
  if (t.eos) w->SetUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*t.eos));
  if (t.pad) w->SetUint32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*t.pad));
  w->SetBool("tokenizer.ggml.add_bos_token", t.add_bos);
  for (const auto& [name, text] : t.chat_templates) {
    w->SetString(name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + name, text);
  }
}

}  // namespace sftctl::gguf
