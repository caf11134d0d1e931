// `sftctl tokenize --tokenizer DIR|byte [--json] [--decode] [--whole]`: encodes stdin to
// token ids (one text per line, or the whole input with --whole), or decodes ids back to text.
//
//   encode: each input line -> its ids, space-separated ("9707 11 1879 0"), or a JSON array
//           with --json. Only '\n' separates lines (a '\r' before it stays part of the text).
//   decode: each input line of ids (space-separated, or a JSON array) -> its text; with
//           --json the text is printed as a JSON string (so newlines inside stay on one line).
//           --whole decodes all ids of the input as one sequence.
// A bad tokenizer directory or a bad id prints "error: ..." (naming the line) and exits 1.
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "client/commands/commands.h"
#include "common/json_parse.h"
#include "common/status.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/tokenizer_loader.h"

namespace sftctl::client {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  bool json = false;
  bool decode = false;
  bool whole = false;
  bool no_special = false;
  bool skip_special = false;
};

bool IsKnownId(const Tokenizer& tok, int64_t id) {
  if (id < 0 || id >= tok.vocab_size()) return false;
  if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok))
    return bpe->IsValidId(static_cast<int32_t>(id));
  return true;
}

// Parses one line of ids: a JSON array or whitespace-separated integers.
Status ParseIds(const Tokenizer& tok, const std::string& line, size_t line_no, std::vector<int32_t>* ids) {
  const std::string where = "line " + std::to_string(line_no) + ": ";
  std::vector<nlohmann::json> values;
  const size_t first = line.find_first_not_of(" \t\r");
  if (first != std::string::npos && line[first] == '[') {
    StatusOr<nlohmann::json> j = ParseJson(line, "line " + std::to_string(line_no));
    if (!j.ok() || !j->is_array()) return InvalidArgumentError(where + "not a JSON array of token ids");
    for (const auto& v : *j) {
      if (!v.is_number_integer()) return InvalidArgumentError(where + "'" + v.dump() + "' is not a token id");
      values.push_back(v);
    }
  } else {
    std::istringstream in(line);
    for (std::string word; in >> word;) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || word.empty())
        return InvalidArgumentError(where + "'" + word + "' is not a token id");
      values.emplace_back(v);
    }
  }
  for (const auto& v : values) {
    const int64_t id = v.get<int64_t>();
    if (!IsKnownId(tok, id)) {
      return OutOfRangeError(where + "id " + std::to_string(id) + " is not in the vocabulary (size " +
                             std::to_string(tok.vocab_size()) + ")");
    }
    ids->push_back(static_cast<int32_t>(id));
  }
  return OkStatus();
}

void PrintIds(const std::vector<int32_t>& ids, bool json) {
  std::string out;
  out.reserve(ids.size() * 7 + 2);
  if (json) out.push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out.push_back(json ? ',' : ' ');
    out += std::to_string(ids[i]);
  }
  if (json) out.push_back(']');
  out.push_back('\n');
  std::cout << out;
}

void PrintText(const std::string& text, bool json) {
  if (json) {
    std::cout << nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  } else {
    std::cout << text << '\n';
  }
}

int RunTokenize(const TokenizeArgs& a) {
  auto loaded = LoadTokenizer(a.tokenizer);
  if (!loaded.ok()) {
    std::cerr << "error: " << loaded.status().message() << std::endl;
    return 1;
  }
  const Tokenizer& tok = **loaded;
  std::ios::sync_with_stdio(false);
  if (a.whole) {
    const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    if (!a.decode) {
      PrintIds(tok.Encode(input, !a.no_special), a.json);
      return 0;
    }
    std::vector<int32_t> ids;
    std::istringstream lines(input);
    size_t line_no = 0;
    for (std::string line; std::getline(lines, line);) {
      Status s = ParseIds(tok, line, ++line_no, &ids);
      if (!s.ok()) {
        std::cerr << "error: " << s.message() << std::endl;
        return 1;
      }
    }
    PrintText(tok.Decode(ids, a.skip_special), a.json);
    return 0;
  }
  size_t line_no = 0;
  for (std::string line; std::getline(std::cin, line);) {
    ++line_no;
    if (!a.decode) {
      PrintIds(tok.Encode(line, !a.no_special), a.json);
      continue;
    }
    std::vector<int32_t> ids;
    Status s = ParseIds(tok, line, line_no, &ids);
    if (!s.ok()) {
      std::cout.flush();
      std::cerr << "error: " << s.message() << std::endl;
      return 1;
    }
    PrintText(tok.Decode(ids, a.skip_special), a.json);
  }
  return 0;
}

}  // namespace

void RegisterTokenizeCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand("tokenize",
                                 "Encode stdin to token ids (one text per line), or --decode ids to text");
  cmd->add_option("--tokenizer", a->tokenizer, "Folder with tokenizer.json (HF byte-level BPE), or \"byte\"")
      ->required();
  cmd->add_flag("--json", a->json,
                "Print a JSON array of ids per line (with --decode: a JSON string per line)");
  cmd->add_flag("--decode", a->decode, "Read ids (space-separated or a JSON array per line) and print text");
  cmd->add_flag("--whole", a->whole,
                "Treat the whole input as one text (or, with --decode, one id sequence)");
  cmd->add_flag("--no-special", a->no_special,
                "Encode special tokens written in the text (<|im_start|>) as plain text");
  cmd->add_flag("--skip-special", a->skip_special, "With --decode: drop special tokens from the output");
  cmd->callback([a, &ctx] { ctx.exit_code = RunTokenize(*a); });
}

}  // namespace sftctl::client
