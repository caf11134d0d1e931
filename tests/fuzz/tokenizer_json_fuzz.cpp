// Fuzz target: a Hugging Face tokenizer.json (+ tokenizer_config.json), as downloaded with a
// model, through BpeTokenizer::FromJson (what LoadTokenizer calls with the two files' text), then
// Encode/Decode of short strings.
//
// Input: "<tokenizer.json>" ["\n#####\n" "<tokenizer_config.json>" ["\n#####\n" "<text>"]]; the
// text (if any) is encoded along with a few fixed strings (ChatML/Llama-3 markup, CR/LF, non-ASCII,
// invalid UTF-8).
//
// Properties checked on every loaded tokenizer: Encode yields valid ids; Decode returns valid
// UTF-8 (the documented repair of ill-formed byte runs); DecodeBytes of the ids one at a time
// concatenates to DecodeBytes of all of them; ids out of range are skipped, never read.
#include <cstring>

#include "common/tokenizer/bpe_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::Split(fuzz::AsView(data, size), "\n#####\n");
  const std::string_view json_text = parts[0];
  const std::string_view config_text = parts.size() > 1 ? parts[1] : std::string_view();
  auto tok =
      BpeTokenizer::FromJson(json_text, config_text, "m/tokenizer.json", "m/tokenizer_config.json", "bpe:m");
  fuzz::Log("FromJson", tok.status());
  if (!tok.ok()) {
    FUZZ_CHECK(!tok.status().message().empty(), "an error without a message");
    return 0;
  }
  const BpeTokenizer& t = **tok;
  std::vector<std::string> texts = {"Hello, world! It's 2024.\r\n  x",
                                    "<|im_start|>user\nhi<|im_end|>\n<|eot_id|><think>\n</think>",
                                    "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 e\xcc\x81",
                                    std::string("bad \xff\xfe utf8 \xc3", 13)};
  if (parts.size() > 2) texts.emplace_back(parts[2]);
  for (const std::string& text : texts) {
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = t.Encode(text, special);
      std::string pieces;
      for (int32_t id : ids) {
        FUZZ_CHECK(t.IsValidId(id), "Encode produced the invalid id " + std::to_string(id));
        pieces += t.DecodeBytes({id});
      }
      FUZZ_CHECK(pieces == t.DecodeBytes(ids), "DecodeBytes of single ids does not concatenate");
      const std::string decoded = t.Decode(ids);
      FUZZ_CHECK(fuzz::IsValidUtf8(decoded), "Decode returned invalid UTF-8");
      FUZZ_CHECK(fuzz::IsValidUtf8(t.Decode(ids, /*skip_special=*/true)),
                 "Decode(skip_special) invalid UTF-8");
    }
  }
  // Ids from the input: out-of-range ones are skipped.
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 4 <= size && raw.size() < 64; i += 4) {
    int32_t v;
    std::memcpy(&v, data + i, 4);
    raw.push_back(static_cast<int32_t>(int64_t{v} % (int64_t{t.vocab_size()} + 8)));
  }
  raw.push_back(-1);
  raw.push_back(t.vocab_size());
  FUZZ_CHECK(fuzz::IsValidUtf8(t.Decode(raw)), "Decode of arbitrary ids returned invalid UTF-8");
  (void)t.DecodeBytes(raw, /*skip_special=*/true);
  for (int32_t id : raw) {
    if (auto s = t.IdToToken(id)) (void)t.TokenToId(*s);
  }
  return 0;
}
