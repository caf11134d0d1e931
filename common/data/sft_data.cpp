#include "common/data/sft_data.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "common/data/jsonl_reader.h"
#include "common/json_parse.h"
#include "common/tokenizer/bpe_tokenizer.h"

namespace sftctl {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

StatusOr<std::string> StringField(const ordered_json& rec, const char* key, const std::string& where) {
  auto it = rec.find(key);
  if (it == rec.end()) return InvalidArgumentError(where + ": missing field '" + key + "'");
  if (!it->is_string()) return InvalidArgumentError(where + ": field '" + key + "' must be a string");
  return it->get<std::string>();
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::string ResolveTokenizerSource(const JobSpec& spec) {
  if (spec.tokenizer != "auto") return spec.tokenizer;
  if (!spec.model.path.empty() && IsFile(spec.model.path + "/tokenizer.json")) return spec.model.path;
  return "byte";
}

SampleEncoder::SampleEncoder(const Tokenizer& tok, DataOptions options)
    : tok_(tok), opt_(std::move(options)) {}

StatusOr<std::string> SampleEncoder::DetectFormat(const ordered_json& rec, const std::string& where) {
  if (!rec.is_object()) return InvalidArgumentError(where + ": each line must be a JSON object");
  const bool chat = rec.contains("messages");
  const bool pc = rec.contains("prompt") || rec.contains("completion");
  const bool text = rec.contains("text");
  if (static_cast<int>(chat) + static_cast<int>(pc) + static_cast<int>(text) > 1) {
    return InvalidArgumentError(where +
                                ": ambiguous record: it has fields of several formats ('text', "
                                "'prompt'/'completion', 'messages'); use exactly one");
  }
  if (chat) return std::string("messages");
  if (pc) return std::string("prompt_completion");
  if (text) return std::string("text");
  return InvalidArgumentError(where +
                              ": cannot tell the format: expected a 'text' field, 'prompt' and "
                              "'completion' fields, or a 'messages' list");
}

StatusOr<const ChatTemplate*> SampleEncoder::Chat() {
  if (!chat_) {
    SFT_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Load(opt_.chat_template, opt_.tokenizer_dir));
    chat_ = std::move(t);
  }
  return &*chat_;
}

std::string SampleEncoder::TokenBytes(int32_t id) const {
  if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok_)) return bpe->DecodeBytes({id});
  if (dynamic_cast<const ByteTokenizer*>(&tok_) != nullptr && id >= 0 && id < 256)
    return std::string(1, static_cast<char>(id));
  return tok_.Decode({id});
}

Status SampleEncoder::Encode(const ordered_json& rec, const std::string& format, const std::string& where,
                             EncodedSample* out) {
  out->ids.clear();
  out->trained.clear();
  if (format == "messages") return EncodeMessages(rec, where, out);
  if (!tok_.eos_id())
    return FailedPreconditionError("tokenizer " + tok_.name() + " has no end-of-sequence token");
  if (format == "text") {
    SFT_ASSIGN_OR_RETURN(std::string text, StringField(rec, "text", where));
    out->ids = EncodePlainSample(tok_, text, nullptr);
    out->trained.assign(out->ids.size(), 1);
  } else {
    SFT_ASSIGN_OR_RETURN(std::string prompt, StringField(rec, "prompt", where));
    SFT_ASSIGN_OR_RETURN(std::string completion, StringField(rec, "completion", where));
    size_t prompt_tokens = 0;
    out->ids = EncodePlainSample(tok_, prompt, &prompt_tokens, completion);
    out->trained.assign(out->ids.size(), 1);
    std::fill_n(out->trained.begin(), std::min(prompt_tokens, out->ids.size()), 0);
  }
  return OkStatus();
}

std::vector<int32_t> EncodePlainSample(const Tokenizer& tok, std::string_view text, size_t* prompt_tokens,
                                       std::string_view completion) {
  const SequenceSpecialTokens special = tok.single_special_tokens();
  const std::optional<int32_t> eos = tok.eos_id();
  // A leading bos text is the bos the post_processor adds; a trailing eos text the eos appended.
  std::string_view body = text;
  if (!special.prefix_text.empty() && body.substr(0, special.prefix_text.size()) == special.prefix_text) {
    body.remove_prefix(special.prefix_text.size());
  }
  std::string joined;
  if (prompt_tokens != nullptr) {
    *prompt_tokens = special.prefix.size() + tok.Encode(body, /*parse_special=*/false).size();
    joined.assign(body).append(completion);
    body = joined;
  }
  const std::string eos_text = eos ? tok.Decode({*eos}) : std::string();
  if (!eos_text.empty() && body.size() >= eos_text.size() &&
      body.substr(body.size() - eos_text.size()) == eos_text) {
    body.remove_suffix(eos_text.size());
  }
  std::vector<int32_t> ids = special.prefix;
  const std::vector<int32_t> encoded = tok.Encode(body, /*parse_special=*/false);
  ids.insert(ids.end(), encoded.begin(), encoded.end());
  if (eos && (special.suffix.empty() || special.suffix.front() != *eos)) ids.push_back(*eos);
  ids.insert(ids.end(), special.suffix.begin(), special.suffix.end());
  return ids;
}

Status SampleEncoder::EncodeMessages(const ordered_json& rec, const std::string& where, EncodedSample* out) {
  const ordered_json& m = rec["messages"];
  if (!m.is_array()) return InvalidArgumentError(where + ": field 'messages' must be a list");
  if (m.empty()) return InvalidArgumentError(where + ": field 'messages' is empty");
  ordered_json tools;
  if (auto it = rec.find("tools"); it != rec.end() && !it->is_null()) {
    if (!it->is_array()) return InvalidArgumentError(where + ": field 'tools' must be a list");
    tools = *it;
  }
  std::vector<ChatMessage> messages;
  bool has_assistant = false;
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string at = where + ": messages[" + std::to_string(i) + "]";
    SFT_ASSIGN_OR_RETURN(ChatMessage msg, ChatMessageFromJson(m[i], at));
    has_assistant = has_assistant || msg.role == "assistant";
    messages.push_back(std::move(msg));
  }
  if (!has_assistant) {
    return InvalidArgumentError(where + ": the conversation has no assistant message (nothing to train on)");
  }
  auto chat_or = Chat();
  if (!chat_or.ok()) return chat_or.status().WithContext(where);
  const ChatTemplate& chat = **chat_or;
  if (!chat.interprets()) {
    // A built-in by name renders plain conversations only; a template decides for itself.
    for (size_t i = 0; i < messages.size(); ++i) {
      const std::string at = where + ": messages[" + std::to_string(i) + "]";
      const std::string& role = messages[i].role;
      if (role != "system" && role != "user" && role != "assistant") {
        return InvalidArgumentError(at + ": field 'role' must be system, user or assistant, got '" + role +
                                    "' (other roles and tool calls need the model's own chat template)");
      }
      auto content = m[i].find("content");
      if (content == m[i].end()) return InvalidArgumentError(at + ": missing field 'content'");
      if (!content->is_string()) return InvalidArgumentError(at + ": field 'content' must be a string");
    }
  }
  auto segments_or = chat.Render(messages, /*add_generation_prompt=*/false, tools);
  if (!segments_or.ok()) return InvalidArgumentError(where + ": " + segments_or.status().message());
  const std::vector<ChatSegment>& segments = *segments_or;

  std::vector<int32_t> seg_of;  // seg_of[k]: the segment token k starts in
  EncodeRendered(segments, &out->ids, &seg_of);
  out->trained.assign(out->ids.size(), 0);
  for (size_t k = 0; k < out->ids.size(); ++k) out->trained[k] = segments[seg_of[k]].trained ? 1 : 0;

  // Every assistant turn must have trained tokens, ending with the end-of-turn token (of a
  // built-in; an interpreted template's turns may end differently, e.g. tool calls).
  const bool interpreted = chat.family() == ChatTemplate::Family::kJinja;
  const auto eot = interpreted ? std::nullopt : tok_.TokenToId(chat.end_of_turn());
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    // An interpreted template may leave a turn out of its rendering (nothing to train there).
    if (interpreted && std::none_of(segments.begin(), segments.end(), [&](const ChatSegment& s) {
          return s.trained && s.turn == static_cast<int>(i);
        }))
      continue;
    int64_t count = 0;
    int32_t last = -1;
    for (size_t k = 0; k < out->ids.size(); ++k) {
      if (out->trained[k] && segments[seg_of[k]].turn == static_cast<int>(i)) {
        ++count;
        last = out->ids[k];
      }
    }
    if (count == 0 || (eot && last != *eot)) {
      return InternalError(
          where + ": messages[" + std::to_string(i) + "]: the assistant turn has " + std::to_string(count) +
          " trained tokens" + (eot && count > 0 ? " not ending in " + chat.end_of_turn() : std::string()) +
          " after tokenizing the " + chat.name() + " rendering (a tokenizer/template mismatch)");
    }
  }
  return OkStatus();
}

// The rendered text is tokenized once, as transformers tokenizes it (no post_processor tokens:
// the template writes its own bos), and each token is assigned the segment it starts in, by its
// byte offset in the text (BpeTokenizer::EncodeWithOffsets), or else by the bytes each token
// decodes to. Only when neither gives exact offsets (a Unicode normalizer changed the text) are the
// segments tokenized one by one.
void SampleEncoder::EncodeRendered(const std::vector<ChatSegment>& segments, std::vector<int32_t>* ids,
                                   std::vector<int32_t>* seg_of) const {
  std::string text;
  std::vector<size_t> seg_end;
  for (const auto& s : segments) {
    text += s.text;
    seg_end.push_back(text.size());
  }
  std::vector<size_t> starts;
  bool exact = false;
  if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok_)) {
    exact = bpe->EncodeWithOffsets(text, /*parse_special=*/true, ids, &starts);
  } else {
    *ids = tok_.Encode(text, /*parse_special=*/true);
    std::string joined;
    exact = true;
    for (size_t k = 0; k < ids->size() && exact; ++k) {
      starts.push_back(joined.size());
      joined += TokenBytes((*ids)[k]);
      exact = joined.size() <= text.size() &&
              text.compare(starts.back(), joined.size() - starts.back(), joined, starts.back()) == 0;
    }
    exact = exact && joined == text;
  }
  seg_of->clear();
  if (exact) {
    size_t s = 0;
    for (size_t start : starts) {
      while (s + 1 < seg_end.size() && seg_end[s] <= start) ++s;
      seg_of->push_back(static_cast<int32_t>(s));
    }
    return;
  }
  ids->clear();
  for (size_t s = 0; s < segments.size(); ++s) {
    std::vector<int32_t> part = tok_.Encode(segments[s].text, /*parse_special=*/true);
    ids->insert(ids->end(), part.begin(), part.end());
    seg_of->resize(ids->size(), static_cast<int32_t>(s));
  }
}

Status SampleEncoder::ScanFile(const std::string& path, DataStats* stats,
                               const std::function<Status(EncodedSample&)>& fn, int64_t limit) {
  std::string file_format = opt_.format == "auto" ? "" : opt_.format;
  const std::string format_origin = opt_.format == "auto" ? "the file" : "data.format";
  int64_t records = 0, kept = 0;
  EncodedSample s;
  auto on_record = [&](const ordered_json& rec, const std::string& where, int64_t line_no,
                       bool* stop) -> Status {
    SFT_ASSIGN_OR_RETURN(std::string f, DetectFormat(rec, where));
    if (file_format.empty()) {
      file_format = f;
    } else if (f != file_format) {
      return InvalidArgumentError(where + ": record is '" + f + "' but " + format_origin + " is '" +
                                  file_format + "' (formats cannot be mixed in one file)");
    }
    try {  // a field of an unexpected type names its line instead of throwing
      SFT_RETURN_IF_ERROR(Encode(rec, file_format, where, &s));
    } catch (const json::exception& e) {
      return InvalidArgumentError(where + ": unusable record: " + e.what());
    }
    s.line = line_no;
    ++stats->samples;
    s.truncated = static_cast<int64_t>(s.ids.size()) > opt_.max_seq_len;
    if (s.truncated) {
      ++stats->truncated;
      s.ids.resize(opt_.max_seq_len);
      s.trained.resize(opt_.max_seq_len);
    }
    int64_t trained = 0;
    for (size_t i = 1; i < s.trained.size(); ++i) trained += s.trained[i];
    if (trained == 0) {
      ++stats->dropped;
      return OkStatus();
    }
    stats->tokens += static_cast<int64_t>(s.ids.size());
    stats->trained_tokens += trained;
    ++kept;
    *stop = limit >= 0 && kept >= limit;
    return fn(s);
  };
  if (limit == 0) return OkStatus();
  SFT_RETURN_IF_ERROR(ForEachJsonlRecord(path, kMaxLineBytes, on_record, &records));
  if (records == 0) return InvalidArgumentError("data file '" + path + "' is empty");
  return OkStatus();
}

}  // namespace sftctl
