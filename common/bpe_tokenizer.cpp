#include "common/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <utility>

#include "common/unicode_normalize.h"

namespace sftctl {

using json = nlohmann::json;

namespace bpe_internal {

// ---------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2's bytes_to_unicode): every byte maps to a printable code point.

struct ByteAlphabet {
  char32_t byte_to_cp[256];
  int16_t cp_to_byte[512];  // -1 where the code point is not in the alphabet
  ByteAlphabet() {
    std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), int16_t{-1});
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

// Converts a byte-level token string ("Ġworld") to the bytes it stands for (" world").
// Returns false (and the UTF-8 of the unmapped characters, kept verbatim) when the token
// contains characters outside the byte-level alphabet.
bool ByteLevelToBytes(std::string_view token, std::string* out) {
  const ByteAlphabet& a = Alphabet();
  bool all_mapped = true;
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp = NextCodePoint(token, &i);
    if (cp < 512 && a.cp_to_byte[cp] >= 0) {
      out->push_back(static_cast<char>(a.cp_to_byte[cp]));
    } else {
      all_mapped = false;
      AppendUtf8(cp, out);
    }
  }
  return all_mapped;
}

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) AppendUtf8(Alphabet().byte_to_cp[b], &out);
  return out;
}

// ---------------------------------------------------------------------------------------
// PCRE2 regex (UTF + UCP, JIT when available).

struct MatchResources {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchResources() {
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchResources() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
};

MatchResources& ThreadMatchResources() {
  thread_local MatchResources resources;
  return resources;
}

class Regex {
 public:
  static std::unique_ptr<Regex> Compile(const std::string& pattern, bool literal, std::string* error) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // PCRE2_LITERAL does not combine with PCRE2_UCP (which only affects escapes anyway).
    const uint32_t options =
        literal ? PCRE2_UTF | PCRE2_NO_UTF_CHECK | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                     &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR buffer[256];
      pcre2_get_error_message(error_code, buffer, sizeof(buffer));
      *error = "PCRE2 error at offset " + std::to_string(error_offset) + ": " +
               reinterpret_cast<const char*>(buffer);
      return nullptr;
    }
    auto regex = std::unique_ptr<Regex>(new Regex());
    regex->code_ = code;
    regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return regex;
  }
  ~Regex() { pcre2_code_free(code_); }

  // Finds the first match in subject[start..]; returns false when there is none.
  // REQUIRES: subject is valid UTF-8 and `start` is on a character boundary.
  bool Find(std::string_view subject, size_t start, size_t* match_start, size_t* match_end) const {
    MatchResources& res = ThreadMatchResources();
    auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    int rc;
    if (jit_) {
      rc = pcre2_jit_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, res.match_data, res.context);
    } else {
      rc = pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK, res.match_data, res.context);
    }
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // fall back to the interpreter (heap frames)
      rc = pcre2_match(code_, s, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, res.match_data,
                       res.context);
    }
    if (rc < 0) return false;  // no match (or a resource limit: treat the rest as unmatched)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(res.match_data);
    *match_start = ovector[0];
    *match_end = ovector[1];
    return true;
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// GPT-2's pre-tokenization regex, used by ByteLevel(use_regex=true).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
  std::shared_ptr<Regex> regex;  // kSplit, or kByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool add_prefix_space = false;  // kByteLevel
};

// Splits `text` by `step` and calls `emit` for every non-empty piece, in order.
template <typename Emit>
void RunPreTokenizerStep(const PreTokenizerStep& step, std::string_view text, Emit&& emit) {
  std::string prefixed;
  if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    if (step.add_prefix_space && (text.empty() || text[0] != ' ')) {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    if (!step.regex) {
      if (!text.empty()) emit(text);
      return;
    }
  }
  // Walk the matches, producing (piece, is_match) in order.
  const Regex& regex = *step.regex;
  const SplitBehavior behavior =
      step.kind == PreTokenizerStep::Kind::kByteLevel ? SplitBehavior::kIsolated : step.behavior;
  // Pending piece for the merging behaviours.
  size_t pending_begin = 0, pending_end = 0;
  bool has_pending = false, pending_is_match = false;
  auto flush = [&]() {
    if (has_pending && pending_end > pending_begin)
      emit(text.substr(pending_begin, pending_end - pending_begin));
    has_pending = false;
  };
  auto piece = [&](size_t begin, size_t end, bool is_match) {
    if (end <= begin) return;
    switch (behavior) {
      case SplitBehavior::kIsolated:
        emit(text.substr(begin, end - begin));
        return;
      case SplitBehavior::kRemoved:
        if (!is_match) emit(text.substr(begin, end - begin));
        return;
      case SplitBehavior::kMergedWithPrevious:
        // A match joins the preceding non-match piece.
        if (is_match && has_pending && !pending_is_match && pending_end == begin) {
          pending_end = end;
          pending_is_match = true;
          return;
        }
        flush();
        break;
      case SplitBehavior::kMergedWithNext:
        // A non-match piece joins the preceding match.
        if (!is_match && has_pending && pending_is_match && pending_end == begin) {
          pending_end = end;
          pending_is_match = false;
          flush();
          return;
        }
        flush();
        break;
      case SplitBehavior::kContiguous:
        if (is_match && has_pending && pending_is_match && pending_end == begin) {
          pending_end = end;
          return;
        }
        flush();
        break;
    }
    pending_begin = begin;
    pending_end = end;
    pending_is_match = is_match;
    has_pending = true;
    if (behavior == SplitBehavior::kMergedWithNext && !is_match) flush();
  };
  size_t pos = 0, last = 0;
  while (pos <= text.size()) {
    size_t ms, me;
    if (!regex.Find(text, pos, &ms, &me)) break;
    piece(last, ms, false);
    piece(ms, me, true);
    last = me;
    if (me > ms) {
      pos = me;
    } else {  // empty match: step over one character
      if (ms >= text.size()) break;
      size_t next = ms;
      NextCodePoint(text, &next);
      pos = next;
    }
  }
  piece(last, text.size(), false);
  flush();
}

// ---------------------------------------------------------------------------------------
// Merge table: (left id, right id) -> (rank, merged id), open addressing on uint64 keys.

class MergeTable {
 public:
  explicit MergeTable(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
    mask_ = cap - 1;
  }
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // Later entries overwrite earlier ones, as in both reference implementations.
  void Insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
    const uint64_t key = Key(a, b);
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == kEmpty || slots_[i].key == key) {
        slots_[i] = Slot{key, rank, merged};
        return;
      }
    }
  }
  // Returns the rank (INT32_MAX when the pair does not merge) and sets *merged.
  int32_t Find(int32_t a, int32_t b, int32_t* merged) const {
    const uint64_t key = Key(a, b);
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *merged = s.merged;
        return s.rank;
      }
      if (s.key == kEmpty) return INT32_MAX;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  static uint64_t Hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// ---------------------------------------------------------------------------------------
// Added-token matcher: leftmost-longest over a byte trie.

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin, end;  // [begin, end) of the text this segment covers
    int32_t token;      // -1: plain text to encode; otherwise the added token's id
  };

  void Add(const AddedToken& token) {
    if (token.content.empty()) return;
    int32_t node = 0;
    for (unsigned char c : token.content) {
      int32_t child = Child(node, c);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(c, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
    first_byte_[static_cast<unsigned char>(token.content[0])] = true;
  }
  bool empty() const { return tokens_.empty(); }

  // Splits `text` into plain-text and added-token segments, in order.
  void Split(std::string_view text, std::vector<Segment>* out) const {
    out->clear();
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t plain_begin = 0;
    size_t i = 0;
    while (i < n) {
      if (!first_byte_[p[i]]) {
        ++i;
        continue;
      }
      // Longest match first; fall back to shorter ones when single_word rejects it.
      int32_t candidates[64];
      size_t ends[64];
      int num = 0;
      int32_t node = 0;
      for (size_t j = i; j < n; ++j) {
        node = Child(node, p[j]);
        if (node < 0) break;
        if (nodes_[node].token >= 0 && num < 64) {
          candidates[num] = nodes_[node].token;
          ends[num] = j + 1;
          ++num;
        }
      }
      bool matched = false;
      for (int c = num - 1; c >= 0 && !matched; --c) {
        const AddedToken& tok = tokens_[candidates[c]];
        size_t begin = i, end = ends[c];
        if (tok.single_word && !IsSingleWord(text, begin, end)) continue;
        if (tok.lstrip) {
          while (begin > plain_begin) {
            size_t prev = PrevCharStart(text, begin);
            size_t q = prev;
            if (!IsUnicodeWhitespace(NextCodePoint(text, &q))) break;
            begin = prev;
          }
        }
        if (tok.rstrip) {
          while (end < n) {
            size_t q = end;
            if (!IsUnicodeWhitespace(NextCodePoint(text, &q))) break;
            end = q;
          }
        }
        if (begin > plain_begin) out->push_back(Segment{plain_begin, begin, -1});
        out->push_back(Segment{begin, end, tok.id});
        plain_begin = end;
        i = end;
        matched = true;
      }
      if (!matched) ++i;
    }
    if (plain_begin < n || out->empty()) out->push_back(Segment{plain_begin, n, -1});
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;
  };
  int32_t Child(int32_t node, unsigned char c) const {
    for (const auto& [byte, child] : nodes_[node].children) {
      if (byte == c) return child;
    }
    return -1;
  }
  static size_t PrevCharStart(std::string_view text, size_t pos) {
    do {
      --pos;
    } while (pos > 0 && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80);
    return pos;
  }
  static bool IsSingleWord(std::string_view text, size_t begin, size_t end) {
    if (begin > 0) {
      size_t q = PrevCharStart(text, begin);
      if (IsUnicodeAlnum(NextCodePoint(text, &q))) return false;
    }
    if (end < text.size()) {
      size_t q = end;
      if (IsUnicodeAlnum(NextCodePoint(text, &q))) return false;
    }
    return true;
  }

  std::vector<Node> nodes_{1};
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace bpe_internal

using bpe_internal::AddedTokenMatcher;
using bpe_internal::MergeTable;
using bpe_internal::PreTokenizerStep;
using bpe_internal::Regex;

// ---------------------------------------------------------------------------------------

struct BpeTokenizer::NormalizerStep {
  NormalizationForm form;
};

struct BpeTokenizer::CacheShard {
  struct Entry {
    std::string word;
    std::vector<int32_t> ids;
  };
  std::mutex mu;
  std::unordered_map<uint64_t, Entry> map;
};

namespace {

constexpr uint8_t kFlagValid = 1;
constexpr uint8_t kFlagSpecial = 2;
constexpr uint8_t kFlagAdded = 4;
constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntriesPerShard = 4096;
constexpr size_t kMaxLinearMergeSymbols = 96;

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

}  // namespace

BpeTokenizer::BpeTokenizer() : cache_(new CacheShard[kCacheShards]) {}
BpeTokenizer::~BpeTokenizer() = default;

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view tokenizer_config_json,
                                                               const std::string& json_label,
                                                               const std::string& config_label,
                                                               std::string name) {
  const JsonErrors err{json_label};
  const JsonErrors cfg_err{config_label};
  json root;
  try {
    root = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return InvalidArgumentError(json_label + ": invalid JSON: " + e.what());
  }
  if (!root.is_object())
    return InvalidArgumentError(json_label + ": expected a JSON object at the top level");

  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  tok->name_ = std::move(name);

  // ---- model -------------------------------------------------------------------------
  auto model_it = root.find("model");
  if (model_it == root.end() || model_it->is_null()) return err.Missing("model");
  const json& model = *model_it;
  if (!model.is_object()) return err.Field("model", "expected an object, got " + TypeName(model));
  auto type_it = model.find("type");
  if (type_it != model.end() && !type_it->is_string()) return err.Field("model.type", "expected a string");
  const std::string model_type = type_it == model.end() ? "BPE" : type_it->get<std::string>();
  if (model_type != "BPE") {
    return InvalidArgumentError(json_label + ": model.type '" + model_type +
                                "' is not supported (byte-level BPE only)");
  }
  {
    auto d = model.find("dropout");
    if (d != model.end() && !d->is_null() && !(d->is_number() && d->get<double>() == 0.0)) {
      return err.Field("model.dropout", "BPE dropout is not supported (must be null)");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto s = model.find(key);
      if (s != model.end() && !s->is_null() && !(s->is_string() && s->get<std::string>().empty())) {
        return err.Field(std::string("model.") + key, "is not supported by byte-level BPE (must be empty)");
      }
    }
    SFT_ASSIGN_OR_RETURN(bool byte_fallback, OptionalBool(model, "byte_fallback", false, err, "model"));
    if (byte_fallback) return err.Field("model.byte_fallback", "is not supported by byte-level BPE");
    SFT_ASSIGN_OR_RETURN(tok->ignore_merges_, OptionalBool(model, "ignore_merges", false, err, "model"));
  }

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end()) return err.Missing("model.vocab");
  if (!vocab_it->is_object()) return err.Field("model.vocab", "expected an object of token -> id");
  int64_t max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= INT32_MAX) {
      return err.Field("model.vocab", "id of '" + Truncated(it.key()) + "' is not a non-negative integer");
    }
    max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  }

  // ---- added tokens (tokenizer.json, then tokenizer_config.json added_tokens_decoder) --
  std::vector<AddedToken> added;
  if (auto at = root.find("added_tokens"); at != root.end() && !at->is_null()) {
    if (!at->is_array()) return err.Field("added_tokens", "expected an array");
    for (size_t i = 0; i < at->size(); ++i) {
      SFT_ASSIGN_OR_RETURN(
          AddedToken t,
          ParseAddedToken((*at)[i], err, "added_tokens[" + std::to_string(i) + "]", std::nullopt));
      added.push_back(std::move(t));
    }
  }
  json config = json::object();
  if (!tokenizer_config_json.empty()) {
    try {
      config = json::parse(tokenizer_config_json);
    } catch (const json::exception& e) {
      return InvalidArgumentError(config_label + ": invalid JSON: " + e.what());
    }
    if (!config.is_object())
      return InvalidArgumentError(config_label + ": expected a JSON object at the top level");
    if (auto atd = config.find("added_tokens_decoder"); atd != config.end() && !atd->is_null()) {
      if (!atd->is_object())
        return cfg_err.Field("added_tokens_decoder", "expected an object of id -> token");
      for (auto it = atd->begin(); it != atd->end(); ++it) {
        int64_t id = -1;
        try {
          size_t used = 0;
          id = std::stoll(it.key(), &used);
          if (used != it.key().size()) id = -1;
        } catch (const std::exception&) {
          id = -1;
        }
        if (id < 0 || id >= INT32_MAX) {
          return cfg_err.Field("added_tokens_decoder", "key '" + Truncated(it.key()) + "' is not a token id");
        }
        const bool known =
            std::any_of(added.begin(), added.end(), [&](const AddedToken& a) { return a.id == id; });
        if (known) continue;  // tokenizer.json is authoritative
        SFT_ASSIGN_OR_RETURN(AddedToken t,
                             ParseAddedToken(it.value(), cfg_err, "added_tokens_decoder." + it.key(),
                                             static_cast<int32_t>(id)));
        added.push_back(std::move(t));
      }
    }
    if (auto ast = config.find("additional_special_tokens"); ast != config.end() && ast->is_array()) {
      for (const json& s : *ast) {
        const std::string content = s.is_string() ? s.get<std::string>()
                                    : (s.is_object() && s.contains("content") && s["content"].is_string())
                                        ? s["content"].get<std::string>()
                                        : std::string();
        for (AddedToken& a : added) {
          if (a.content == content) a.special = true;
        }
      }
    }
  }
  for (const AddedToken& a : added) max_id = std::max<int64_t>(max_id, a.id);

  // ---- id tables ---------------------------------------------------------------------
  const size_t n_ids = static_cast<size_t>(max_id + 1);
  tok->vocab_size_ = static_cast<int32_t>(n_ids);
  tok->id_to_token_.assign(n_ids, std::string());
  tok->id_to_bytes_.assign(n_ids, std::string());
  tok->id_flags_.assign(n_ids, 0);
  std::vector<uint8_t> byte_level(n_ids, 0);
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    if (tok->id_flags_[id] & kFlagValid) {
      return err.Field("model.vocab", "id " + std::to_string(id) + " is used by both '" +
                                          Truncated(tok->id_to_token_[id]) + "' and '" + Truncated(it.key()) +
                                          "'");
    }
    tok->id_flags_[id] = kFlagValid;
    tok->id_to_token_[id] = it.key();
    byte_level[id] = bpe_internal::ByteLevelToBytes(it.key(), &tok->id_to_bytes_[id]) ? 1 : 0;
  }
  for (const AddedToken& a : added) {
    const auto id = static_cast<size_t>(a.id);
    if ((tok->id_flags_[id] & kFlagValid) && !(tok->id_flags_[id] & kFlagAdded) &&
        tok->id_to_token_[id] != a.content) {
      return err.Field("added_tokens", "token '" + Truncated(a.content) + "' has id " + std::to_string(id) +
                                           ", which model.vocab gives to '" +
                                           Truncated(tok->id_to_token_[id]) + "'");
    }
    tok->id_flags_[id] = kFlagValid | kFlagAdded | (a.special ? kFlagSpecial : 0);
    tok->id_to_token_[id] = a.content;
    tok->id_to_bytes_[id] = a.content;
    byte_level[id] = 0;
  }
  tok->token_to_id_.reserve(n_ids);
  tok->bytes_to_id_.reserve(n_ids);
  for (size_t id = 0; id < n_ids; ++id) {
    if (!(tok->id_flags_[id] & kFlagValid)) continue;
    tok->token_to_id_.emplace(tok->id_to_token_[id], static_cast<int32_t>(id));
    if (byte_level[id]) tok->bytes_to_id_.emplace(tok->id_to_bytes_[id], static_cast<int32_t>(id));
  }
  // Added tokens also resolve by their content (already in token_to_id_ as id_to_token_).
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    auto it = tok->bytes_to_id_.find(one);
    tok->byte_ids_[b] = it == tok->bytes_to_id_.end() ? -1 : it->second;
    // Bytes that occur in well-formed UTF-8 must have a token.
    const bool needed = b < 0xC0 || (b >= 0xC2 && b <= 0xF4);
    if (tok->byte_ids_[b] < 0 && needed) {
      return err.Field("model.vocab",
                       "has no token for byte 0x" + std::string(1, "0123456789ABCDEF"[b >> 4]) +
                           std::string(1, "0123456789ABCDEF"[b & 15]) + " ('" +
                           bpe_internal::BytesToByteLevel(one) + "'): not a byte-level BPE vocabulary");
    }
  }

  // ---- merges ------------------------------------------------------------------------
  auto merges_it = model.find("merges");
  if (merges_it == model.end()) return err.Missing("model.merges");
  if (!merges_it->is_array()) return err.Field("model.merges", "expected an array");
  tok->merges_ = std::make_unique<MergeTable>(merges_it->size());
  std::string left, right;
  for (size_t i = 0; i < merges_it->size(); ++i) {
    const json& m = (*merges_it)[i];
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
          s.find(' ', sp + 1) != std::string::npos) {
        return err.Field(path, "expected \"left right\" (one space), got \"" + Truncated(s) + "\"");
      }
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return err.Field(path, "expected \"left right\" or [\"left\", \"right\"], got " + Truncated(m.dump()));
    }
    auto a = tok->token_to_id_.find(left);
    if (a == tok->token_to_id_.end())
      return err.Field(path, "token '" + Truncated(left) + "' is not in model.vocab");
    auto b = tok->token_to_id_.find(right);
    if (b == tok->token_to_id_.end())
      return err.Field(path, "token '" + Truncated(right) + "' is not in model.vocab");
    auto merged = tok->token_to_id_.find(left + right);
    if (merged == tok->token_to_id_.end()) {
      return err.Field(path, "merged token '" + Truncated(left + right) + "' is not in model.vocab");
    }
    tok->merges_->Insert(a->second, b->second, static_cast<int32_t>(i), merged->second);
  }

  // ---- normalizer --------------------------------------------------------------------
  if (auto nit = root.find("normalizer"); nit != root.end() && !nit->is_null()) {
    std::function<Status(const json&, const std::string&)> parse_normalizer =
        [&](const json& n, const std::string& path) -> Status {
      if (!n.is_object() || !n.contains("type") || !n["type"].is_string()) {
        return err.Field(path, "expected an object with a \"type\"");
      }
      const std::string type = n["type"].get<std::string>();
      if (type == "Sequence") {
        auto list = n.find("normalizers");
        if (list == n.end() || !list->is_array())
          return err.Field(path + ".normalizers", "expected an array");
        for (size_t i = 0; i < list->size(); ++i) {
          SFT_RETURN_IF_ERROR(parse_normalizer((*list)[i], path + ".normalizers[" + std::to_string(i) + "]"));
        }
        return OkStatus();
      }
      auto form = ParseNormalizerForm(type);
      if (!form.ok()) {
        return InvalidArgumentError(json_label + ": " + path + ".type '" + type +
                                    "' is not supported (NFC, NFD, NFKC, NFKD, Sequence)");
      }
      tok->normalizers_.push_back(NormalizerStep{*form});
      return OkStatus();
    };
    SFT_RETURN_IF_ERROR(parse_normalizer(*nit, "normalizer"));
  }

  // ---- pre-tokenizer -----------------------------------------------------------------
  bool has_byte_level = false;
  auto pit = root.find("pre_tokenizer");
  if (pit == root.end() || pit->is_null()) return err.Missing("pre_tokenizer");
  {
    std::function<Status(const json&, const std::string&)> parse_pre =
        [&](const json& p, const std::string& path) -> Status {
      if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
        return err.Field(path, "expected an object with a \"type\"");
      }
      const std::string type = p["type"].get<std::string>();
      if (type == "Sequence") {
        auto list = p.find("pretokenizers");
        if (list == p.end() || !list->is_array())
          return err.Field(path + ".pretokenizers", "expected an array");
        for (size_t i = 0; i < list->size(); ++i) {
          SFT_RETURN_IF_ERROR(parse_pre((*list)[i], path + ".pretokenizers[" + std::to_string(i) + "]"));
        }
        return OkStatus();
      }
      PreTokenizerStep step;
      std::string regex_error;
      if (type == "ByteLevel") {
        has_byte_level = true;
        step.kind = PreTokenizerStep::Kind::kByteLevel;
        SFT_ASSIGN_OR_RETURN(step.add_prefix_space, OptionalBool(p, "add_prefix_space", true, err, path));
        SFT_ASSIGN_OR_RETURN(bool use_regex, OptionalBool(p, "use_regex", true, err, path));
        if (use_regex) {
          step.regex = Regex::Compile(bpe_internal::kGpt2Pattern, false, &regex_error);
          if (!step.regex) return InternalError("GPT-2 pattern: " + regex_error);
        }
      } else if (type == "Split") {
        step.kind = PreTokenizerStep::Kind::kSplit;
        auto pattern = p.find("pattern");
        if (pattern == p.end() || !pattern->is_object())
          return err.Field(path + ".pattern", "expected an object");
        if (auto r = pattern->find("Regex"); r != pattern->end() && r->is_string()) {
          step.regex = Regex::Compile(r->get<std::string>(), false, &regex_error);
          if (!step.regex) return err.Field(path + ".pattern.Regex", regex_error);
        } else if (auto s = pattern->find("String"); s != pattern->end() && s->is_string()) {
          step.regex = Regex::Compile(s->get<std::string>(), true, &regex_error);
          if (!step.regex) return err.Field(path + ".pattern.String", regex_error);
        } else {
          return err.Field(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
        }
        SFT_ASSIGN_OR_RETURN(bool invert, OptionalBool(p, "invert", false, err, path));
        if (invert) return err.Field(path + ".invert", "true is not supported");
        auto behavior = p.find("behavior");
        const std::string b =
            behavior != p.end() && behavior->is_string() ? behavior->get<std::string>() : "";
        if (b == "Isolated") {
          step.behavior = bpe_internal::SplitBehavior::kIsolated;
        } else if (b == "Removed") {
          step.behavior = bpe_internal::SplitBehavior::kRemoved;
        } else if (b == "MergedWithPrevious") {
          step.behavior = bpe_internal::SplitBehavior::kMergedWithPrevious;
        } else if (b == "MergedWithNext") {
          step.behavior = bpe_internal::SplitBehavior::kMergedWithNext;
        } else if (b == "Contiguous") {
          step.behavior = bpe_internal::SplitBehavior::kContiguous;
        } else {
          return err.Field(path + ".behavior", "'" + b + "' is not a known split behavior");
        }
      } else {
        return InvalidArgumentError(json_label + ": " + path + ".type '" + type +
                                    "' is not supported (Split, ByteLevel, Sequence)");
      }
      tok->pre_tokenizers_.push_back(std::move(step));
      return OkStatus();
    };
    SFT_RETURN_IF_ERROR(parse_pre(*pit, "pre_tokenizer"));
  }
  if (!has_byte_level) {
    return err.Field("pre_tokenizer", "has no ByteLevel step: only byte-level BPE tokenizers are supported");
  }
  // A ByteLevel step without prefix space or regex only maps bytes, which the model does
  // implicitly: drop it from the pipeline.
  tok->pre_tokenizers_.erase(std::remove_if(tok->pre_tokenizers_.begin(), tok->pre_tokenizers_.end(),
                                            [](const PreTokenizerStep& s) {
                                              return s.kind == PreTokenizerStep::Kind::kByteLevel &&
                                                     !s.add_prefix_space && !s.regex;
                                            }),
                             tok->pre_tokenizers_.end());

  // ---- decoder -----------------------------------------------------------------------
  {
    auto dit = root.find("decoder");
    if (dit == root.end() || dit->is_null()) return err.Missing("decoder");
    std::function<Status(const json&, const std::string&)> check_decoder =
        [&](const json& d, const std::string& path) -> Status {
      if (!d.is_object() || !d.contains("type") || !d["type"].is_string()) {
        return err.Field(path, "expected an object with a \"type\"");
      }
      const std::string type = d["type"].get<std::string>();
      if (type == "ByteLevel") return OkStatus();
      if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
        for (size_t i = 0; i < d["decoders"].size(); ++i) {
          SFT_RETURN_IF_ERROR(check_decoder(d["decoders"][i], path + ".decoders[" + std::to_string(i) + "]"));
        }
        return OkStatus();
      }
      return InvalidArgumentError(json_label + ": " + path + ".type '" + type +
                                  "' is not supported (ByteLevel, Sequence)");
    };
    SFT_RETURN_IF_ERROR(check_decoder(*dit, "decoder"));
  }

  // ---- added-token matchers ----------------------------------------------------------
  for (auto& m : tok->raw_matchers_) m = std::make_unique<AddedTokenMatcher>();
  for (auto& m : tok->normalized_matchers_) m = std::make_unique<AddedTokenMatcher>();
  for (const AddedToken& a : added) {
    // Without a normalizer "normalized" makes no difference: match everything on raw text.
    const bool on_normalized = a.normalized && !tok->normalizers_.empty();
    auto* matchers = on_normalized ? tok->normalized_matchers_ : tok->raw_matchers_;
    matchers[0]->Add(a);
    if (!a.special) matchers[1]->Add(a);
  }
  tok->added_tokens_ = std::move(added);

  // ---- special token ids from tokenizer_config.json ----------------------------------
  auto resolve = [&](const char* key, std::optional<int32_t>* out) -> Status {
    SFT_ASSIGN_OR_RETURN(std::optional<std::string> content, ConfigToken(config, key, cfg_err));
    if (!content) return OkStatus();
    auto id = tok->TokenToId(*content);
    if (!id) return cfg_err.Field(key, "token '" + Truncated(*content) + "' is not in the vocabulary");
    *out = *id;
    return OkStatus();
  };
  SFT_RETURN_IF_ERROR(resolve("eos_token", &tok->eos_id_));
  SFT_RETURN_IF_ERROR(resolve("pad_token", &tok->pad_id_));
  SFT_RETURN_IF_ERROR(resolve("bos_token", &tok->bos_id_));
  return tok;
}

// ---------------------------------------------------------------------------------------
// Encoding

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  ids.reserve(text.size() / 3 + 4);
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = ToValidUtf8(text);
    text = repaired;
  }
  const AddedTokenMatcher& matcher = *raw_matchers_[parse_special ? 0 : 1];
  if (matcher.empty()) {
    EncodeSection(text, parse_special, &ids);
    return ids;
  }
  std::vector<AddedTokenMatcher::Segment> segments;
  matcher.Split(text, &segments);
  for (const auto& seg : segments) {
    if (seg.token >= 0) {
      ids.push_back(seg.token);
    } else {
      EncodeSection(text.substr(seg.begin, seg.end - seg.begin), parse_special, &ids);
    }
  }
  return ids;
}

void BpeTokenizer::EncodeSection(std::string_view text, bool parse_special, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  std::string normalized;
  if (!normalizers_.empty()) {
    bool changed = false;
    for (const NormalizerStep& step : normalizers_) {
      std::string_view current = changed ? std::string_view(normalized) : text;
      if (step.form == NormalizationForm::kNFC && IsNfcStable(current)) continue;
      std::string next = NormalizeUtf8(current, step.form);
      normalized = std::move(next);
      changed = true;
    }
    if (changed) text = normalized;
  }
  auto run_pre_tokenizers = [&](std::string_view section) {
    if (pre_tokenizers_.empty()) {
      EncodeWord(section, ids);
    } else if (pre_tokenizers_.size() == 1) {  // the common case (Qwen2/3, Llama-3, GPT-2)
      bpe_internal::RunPreTokenizerStep(pre_tokenizers_[0], section,
                                        [&](std::string_view word) { EncodeWord(word, ids); });
    } else {
      // Recursive descent through the steps, without materialising lists of pieces.
      std::function<void(size_t, std::string_view)> descend = [&](size_t step, std::string_view piece) {
        if (step == pre_tokenizers_.size()) {
          EncodeWord(piece, ids);
          return;
        }
        bpe_internal::RunPreTokenizerStep(pre_tokenizers_[step], piece,
                                          [&](std::string_view sub) { descend(step + 1, sub); });
      };
      descend(0, section);
    }
  };
  const AddedTokenMatcher& nmatcher = *normalized_matchers_[parse_special ? 0 : 1];
  if (nmatcher.empty()) {
    run_pre_tokenizers(text);
    return;
  }
  std::vector<AddedTokenMatcher::Segment> segments;
  nmatcher.Split(text, &segments);
  for (const auto& seg : segments) {
    if (seg.token >= 0) {
      ids->push_back(seg.token);
    } else {
      run_pre_tokenizers(text.substr(seg.begin, seg.end - seg.begin));
    }
  }
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(word);
    if (it != bytes_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    MergeWord(word, ids);
    return;
  }
  const uint64_t hash = std::hash<std::string_view>{}(word);
  CacheShard& shard = cache_[hash % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(hash);
    if (it != shard.map.end() && it->second.word == word) {
      ids->insert(ids->end(), it->second.ids.begin(), it->second.ids.end());
      return;
    }
  }
  const size_t first = ids->size();
  MergeWord(word, ids);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kMaxCacheEntriesPerShard) shard.map.clear();
  CacheShard::Entry& entry = shard.map[hash];
  entry.word.assign(word.data(), word.size());
  entry.ids.assign(ids->begin() + static_cast<std::ptrdiff_t>(first), ids->end());
}

void BpeTokenizer::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  const size_t n = word.size();
  if (n <= kMaxLinearMergeSymbols) {
    // Few symbols: keep them in an array with the rank of each adjacent pair, and merge the
    // lowest-ranked (leftmost on ties) pair until none merges.
    int32_t sym[kMaxLinearMergeSymbols];
    int32_t rank[kMaxLinearMergeSymbols];
    int32_t merged[kMaxLinearMergeSymbols] = {};
    size_t count = n;
    for (size_t i = 0; i < n; ++i) sym[i] = byte_ids_[static_cast<unsigned char>(word[i])];
    for (size_t i = 0; i + 1 < n; ++i) rank[i] = merges_->Find(sym[i], sym[i + 1], &merged[i]);
    while (count > 1) {
      size_t best = 0;
      int32_t best_rank = rank[0];
      for (size_t i = 1; i + 1 < count; ++i) {
        if (rank[i] < best_rank) {
          best_rank = rank[i];
          best = i;
        }
      }
      if (best_rank == INT32_MAX) break;
      sym[best] = merged[best];
      // Remove symbol best+1 and pair best.
      for (size_t i = best + 1; i + 1 < count; ++i) sym[i] = sym[i + 1];
      for (size_t i = best; i + 2 < count; ++i) {
        rank[i] = rank[i + 1];
        merged[i] = merged[i + 1];
      }
      --count;
      if (best > 0) rank[best - 1] = merges_->Find(sym[best - 1], sym[best], &merged[best - 1]);
      if (best + 1 < count) rank[best] = merges_->Find(sym[best], sym[best + 1], &merged[best]);
    }
    out->insert(out->end(), sym, sym + count);
    return;
  }

  // Many symbols: doubly linked list + priority queue keyed by (rank, position).
  struct Node {
    int32_t id;
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left_id, right_id, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Node> nodes(n);
  for (size_t i = 0; i < n; ++i) {
    nodes[i] = Node{byte_ids_[static_cast<unsigned char>(word[i])], static_cast<int32_t>(i) - 1,
                    i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int32_t pos) {
    const int32_t next = nodes[pos].next;
    if (next < 0) return;
    int32_t m = 0;
    const int32_t r = merges_->Find(nodes[pos].id, nodes[next].id, &m);
    if (r != INT32_MAX) queue.push(Candidate{r, pos, nodes[pos].id, nodes[next].id, m});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Node& left = nodes[c.pos];
    if (left.id != c.left_id || left.next < 0 || nodes[left.next].id != c.right_id) continue;  // stale
    const int32_t right = left.next;
    left.id = c.merged;
    left.next = nodes[right].next;
    if (left.next >= 0) nodes[left.next].prev = c.pos;
    nodes[right].id = -1;  // dead
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) out->push_back(nodes[i].id);
}

// ---------------------------------------------------------------------------------------
// Decoding and lookups

void BpeTokenizer::AppendDecoded(int32_t id, bool skip_special, std::string* out) const {
  if (id < 0 || id >= vocab_size_) return;
  const uint8_t flags = id_flags_[static_cast<size_t>(id)];
  if (!(flags & kFlagValid)) return;
  if (skip_special && (flags & kFlagSpecial)) return;
  out->append(id_to_bytes_[static_cast<size_t>(id)]);
}

std::string BpeTokenizer::DecodeBytes(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) AppendDecoded(id, skip_special, &out);
  return out;
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  // Byte-level pieces between added tokens are repaired separately, as the reference
  // decoders convert each run of byte-level tokens to a string on its own.
  std::string out, run;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) continue;
    const uint8_t flags = id_flags_[static_cast<size_t>(id)];
    if (flags & kFlagAdded) {
      if (!run.empty()) {
        out += IsValidUtf8(run) ? run : ToValidUtf8(run);
        run.clear();
      }
      AppendDecoded(id, skip_special, &out);
    } else {
      AppendDecoded(id, skip_special, &run);
    }
  }
  if (!run.empty()) out += IsValidUtf8(run) ? run : ToValidUtf8(run);
  return out;
}

std::optional<int32_t> BpeTokenizer::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> BpeTokenizer::IdToToken(int32_t id) const {
  if (!IsValidId(id)) return std::nullopt;
  return id_to_token_[static_cast<size_t>(id)];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return IsValidId(id) && (id_flags_[static_cast<size_t>(id)] & kFlagSpecial);
}

bool BpeTokenizer::IsValidId(int32_t id) const {
  return id >= 0 && id < vocab_size_ && (id_flags_[static_cast<size_t>(id)] & kFlagValid);
}

}  // namespace sftctl
