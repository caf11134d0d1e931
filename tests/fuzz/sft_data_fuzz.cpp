// Fuzz target: a JSONL training data file (text / prompt_completion / messages records), read by
// SampleEncoder::ScanFile — ParseJson per line, DetectFormat, Encode (chat rendering and the loss
// mask for messages), truncation — exactly as `sftctl inspect-data` and the trainer read it.
//
// Input: the file's bytes. It is scanned with the built-in ByteTokenizer (format auto, ChatML),
// again with a forced data.format, and, when it holds "messages", with the Qwen3 and Llama-3
// renderings and with a small byte-level BPE tokenizer whose special tokens are the templates'
// (so the chat masking runs on special-token ids, as with a real model's tokenizer).
//
// Properties checked on every kept sample: ids and trained flags have the same length, at most
// max_seq_len; every id is below the tokenizer's vocab size (or a valid BPE id); a sample has a
// trained token after position 0; and the counts in DataStats add up.
#include <memory>
#include <nlohmann/json.hpp>

#include "common/data/sft_data.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

namespace {

constexpr int64_t kMaxSeqLen = 48;

// GPT-2's bytes_to_unicode for one byte, as UTF-8.
std::string ByteLevelChar(unsigned char b) {
  int n = 0, cp = b;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    if (x == b) {
      cp = printable ? x : 256 + n;
      break;
    }
    if (!printable) ++n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string ByteLevel(std::string_view raw) {
  std::string out;
  for (unsigned char c : raw) out += ByteLevelChar(c);
  return out;
}

// A byte-level BPE tokenizer with a few merges and the special tokens of ChatML and Llama-3.
const BpeTokenizer& SmallBpe() {
  static const std::unique_ptr<BpeTokenizer> tok = [] {
    using json = nlohmann::json;
    json vocab = json::object();
    int next = 0;
    auto add = [&](const std::string& raw) {
      const std::string t = ByteLevel(raw);
      if (!vocab.contains(t)) vocab[t] = next++;
    };
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
    json merges = json::array();
    for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"<", "|"},
                                                                               {"|", ">"},
                                                                               {"i", "m"},
                                                                               {"e", "n"},
                                                                               {"s", "t"},
                                                                               {"\n", "\n"},
                                                                               {" ", "t"},
                                                                               {"t", "h"}}) {
      add(a + b);
      merges.push_back(ByteLevel(a) + " " + ByteLevel(b));
    }
    json added = json::array();
    for (const char* special :
         {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|begin_of_text|>",
          "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
      const bool is_special = std::string_view(special)[0] == '<' && std::string_view(special)[1] == '|';
      added.push_back({{"id", next++},
                       {"content", special},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", is_special}});
    }
    const json tokenizer = {
        {"version", "1.0"},
        {"added_tokens", added},
        {"normalizer", {{"type", "NFC"}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"post_processor", nullptr},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"vocab", vocab},
          {"merges", merges}}}};
    const json config = {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
    auto t = BpeTokenizer::FromJson(tokenizer.dump(), config.dump(), "small/tokenizer.json",
                                    "small/tokenizer_config.json", "small");
    FUZZ_CHECK(t.ok(), "the target's own tokenizer does not load: " + t.status().ToString());
    return std::move(t).value();
  }();
  return *tok;
}

void Scan(const std::string& path, const Tokenizer& tok, const std::string& format, const std::string& chat) {
  DataOptions opt;
  opt.format = format;
  opt.max_seq_len = kMaxSeqLen;
  opt.chat_template = chat;
  opt.tokenizer_dir = "byte";
  SampleEncoder enc(tok, opt);
  DataStats stats;
  int64_t kept = 0, tokens = 0, trained_tokens = 0;
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok);
  Status s = enc.ScanFile(path, &stats, [&](EncodedSample& sample) -> Status {
    FUZZ_CHECK(sample.ids.size() == sample.trained.size(), "ids and trained flags differ in length");
    FUZZ_CHECK(static_cast<int64_t>(sample.ids.size()) <= kMaxSeqLen, "a sample longer than max_seq_len");
    FUZZ_CHECK(sample.line >= 1, "a sample without a line");
    int64_t trained = 0;
    for (size_t i = 0; i < sample.ids.size(); ++i) {
      const int32_t id = sample.ids[i];
      FUZZ_CHECK(id >= 0 && (bpe ? bpe->IsValidId(id) : id < tok.vocab_size()),
                 "id " + std::to_string(id) + " out of range");
      FUZZ_CHECK(sample.trained[i] <= 1, "a trained flag other than 0/1");
      if (i > 0) trained += sample.trained[i];
    }
    FUZZ_CHECK(trained > 0, "a kept sample without a trained token");
    ++kept;
    tokens += static_cast<int64_t>(sample.ids.size());
    trained_tokens += trained;
    return OkStatus();
  });
  fuzz::Log("ScanFile " + tok.name() + " " + format + " " + chat, s);
  FUZZ_CHECK(stats.tokens == tokens && stats.trained_tokens == trained_tokens, "DataStats token counts");
  FUZZ_CHECK(stats.samples >= kept + stats.dropped, "DataStats sample counts");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ByteTokenizer byte_tok;
  const std::string_view text = fuzz::AsView(data, size);
  const std::string path = fuzz::ScratchDir() + "/data.jsonl";
  fuzz::WriteFile(path, text);
  Scan(path, byte_tok, "auto", "chatml");
  static const char* const kFormats[] = {"text", "prompt_completion", "messages"};
  Scan(path, byte_tok, kFormats[size % 3], "llama3");
  if (text.find("messages") != std::string_view::npos) {
    Scan(path, byte_tok, "auto", "qwen3");
    Scan(path, byte_tok, "auto", "llama3");
    Scan(path, SmallBpe(), "auto", "chatml");
    Scan(path, SmallBpe(), "auto", "qwen3");
  } else {
    Scan(path, SmallBpe(), "auto", "chatml");
  }
  return 0;
}
