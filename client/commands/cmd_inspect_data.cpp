// `sftctl inspect-data SPEC [-n N] [--color auto|always|never]`: shows how the first N
// training samples are tokenized and which tokens are trained, then counts over all data:
// samples, tokens, trained tokens, truncated and dropped samples.
//
// Trained tokens are green on a terminal and [in brackets] otherwise. Uses the same encoder
// as the trainer (common/data/sft_data.h), without LibTorch. Errors print "error: ..." and exit 1.
// The samples' text, file names and errors come from files (perhaps from the Hub): they reach the
// terminal through EscapeForTerminal (common/terminal_text.h), so a sample holding ESC, C1 or
// bidirectional controls shows them as "\x1b", "\u009b", "\u202e".
#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>

#include "client/commands/commands.h"
#include "client/transfer/hub_download.h"
#include "common/data/sft_data.h"
#include "common/spec/spec_yaml.h"
#include "common/terminal_text.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/tokenizer_loader.h"

namespace sftctl::client {
namespace {

struct InspectArgs {
  std::string spec_path;
  int64_t n = 3;
  std::string color = "auto";
};

std::string Bytes(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  if (const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok)) return bpe->DecodeBytes(ids);
  return tok.Decode(ids);
}

// The bytes at the end of `s` that begin a UTF-8 character `s` cuts short (0 to 3).
size_t CutCharacterTail(const std::string& s) {
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - k]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > k ? k : 0;
  }
  return 0;
}

// The sample's text with each run of trained tokens between `on` and `off`. Each run is escaped on
// its own (the markers are ours); a character whose bytes two runs share goes whole to the second.
std::string MarkedText(const Tokenizer& tok, const EncodedSample& s, const char* on, const char* off) {
  std::string text, carry;
  for (size_t i = 0; i < s.ids.size();) {
    size_t j = i;
    while (j < s.ids.size() && s.trained[j] == s.trained[i]) ++j;
    std::string piece = carry + Bytes(tok, std::vector<int32_t>(s.ids.begin() + i, s.ids.begin() + j));
    const size_t cut = j < s.ids.size() ? CutCharacterTail(piece) : 0;
    carry = piece.substr(piece.size() - cut);
    piece.resize(piece.size() - cut);
    piece = EscapeForTerminal(piece);
    if (!piece.empty()) text += s.trained[i] ? on + piece + off : piece;
    i = j;
  }
  return text;
}

void PrintSample(const Tokenizer& tok, const EncodedSample& s, const std::string& where, bool color) {
  int64_t trained = 0;
  for (size_t i = 1; i < s.trained.size(); ++i) trained += s.trained[i];
  std::cout << "── " << EscapeForTerminal(where) << ": " << s.ids.size() << " tokens, " << trained
            << " trained" << (s.truncated ? " (truncated)" : "") << "\n";
  const char* on = color ? "\x1b[32m" : "[";
  const char* off = color ? "\x1b[0m" : "]";
  const std::string text = MarkedText(tok, s, on, off);
  std::cout << text << "\n";
  std::cout << "ids:";
  for (size_t i = 0; i < s.ids.size(); ++i) {
    std::cout << ' ' << (s.trained[i] ? on : "") << s.ids[i] << (s.trained[i] ? off : "");
  }
  std::cout << "\n\n";
}

int InspectData(const InspectArgs& a) {
  auto fail = [](const Status& s) {
    std::cerr << "error: " << EscapeForTerminal(s.message()) << std::endl;
    return 1;
  };
  auto spec = LoadSpecFile(a.spec_path);
  if (!spec.ok()) return fail(spec.status());
  // hf:// data files and tokenizers come from the Hub (the model's weights are not needed here).
  if (Status s = ResolveHubPathsLocally(&*spec, /*tokenizer_only=*/true); !s.ok()) return fail(s);
  const std::string tok_dir = ResolveTokenizerSource(*spec);
  auto tok = LoadTokenizer(tok_dir);
  if (!tok.ok()) return fail(tok.status());
  const bool color = a.color == "always" || (a.color == "auto" && ::isatty(1));

  DataOptions opt;
  opt.format = spec->data.format;
  opt.max_seq_len = spec->data.max_seq_len;
  opt.chat_template = spec->data.chat_template;
  opt.tokenizer_dir = tok_dir;
  SampleEncoder encoder(**tok, opt);
  std::cout << "tokenizer: " << EscapeForTerminal((*tok)->name()) << ", max_seq_len "
            << spec->data.max_seq_len << (spec->data.packing ? ", packing on" : "") << "\n\n";

  int64_t shown = 0;
  auto show = [&](const std::string& file, DataStats* stats) -> Status {
    return encoder.ScanFile(file, stats, [&](EncodedSample& s) -> Status {
      if (shown < a.n) {
        PrintSample(**tok, s, file + ":" + std::to_string(s.line), color);
        ++shown;
      }
      return OkStatus();
    });
  };
  DataStats train, eval;
  for (const auto& f : spec->data.train) {
    if (Status s = show(f, &train); !s.ok()) return fail(s);
  }
  for (const auto& f : spec->data.eval) {
    if (Status s = show(f, &eval); !s.ok()) return fail(s);
  }
  if (const ChatTemplate* chat = encoder.loaded_chat())
    std::cout << "chat template: " << EscapeForTerminal(chat->description()) << "\n";
  auto line = [](const char* name, const DataStats& d) {
    std::cout << name << ": " << d.samples << " samples, " << d.tokens << " tokens, " << d.trained_tokens
              << " trained tokens, " << d.truncated << " truncated, " << d.dropped
              << " dropped (no trained token left)\n";
  };
  line("train", train);
  if (!spec->data.eval.empty()) line("eval", eval);
  return 0;
}

}  // namespace

void RegisterInspectDataCommand(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "inspect-data",
      "Show how the first N samples are tokenized and which tokens are trained, with data counts");
  cmd->add_option("spec", args->spec_path, "job spec (YAML)")->required();
  cmd->add_option("-n", args->n, "samples to show (default 3)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--color", args->color, "colour trained tokens: auto (on a terminal), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd->callback([args, &ctx] { ctx.exit_code = InspectData(*args); });
}

}  // namespace sftctl::client
