// The flags of the trainer's commands that `sftctl` offers too (`generate`, `eval`, `export`), each
// defined once: a table of flags (names, help, kind, check, relations) per command. sftctl-trainer
// registers them bound to its option structs (AddBoundCommand); sftctl registers the same table
// unbound, checks the values as the trainer would, and passes what was given on to sftctl-trainer
// (AddForwardingCommand, ForwardedArgs). So `sftctl generate --help` and `sftctl-trainer generate
// --help` list the same options with the same text, and a flag added here exists in both binaries.
// Defaults live in the trainer's option structs; the table names them for the help, and the trainer
// checks the two agree when it registers the flags. sftctl forwards only the flags given, so it
// applies no default of its own. Each flag's name is written once, as a FlagName below: the table's
// rows and the trainer's bindings name the flag by it.
//
// Thread safety: the tables are immutable; registration and parsing on one thread (CLI11's rules).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace sftctl::cli {

enum class FlagKind {
  kString,
  kInt,      // int64_t
  kUint,     // uint64_t
  kDouble,   // double
  kBool,     // a flag without a value
  kStrings,  // a repeatable string option (std::vector<std::string>)
};

enum class FlagCheck { kNone, kPositive, kNonNegative, kUnitInterval, kExistingDir, kExistingFile };

// A flag's CLI11 names, e.g. "-o,--output"; the long name is the key.
struct FlagName {
  const char* names;
};

// Every flag of the table (a flag of several commands is one name; its help may differ per command).
namespace flag {
inline constexpr FlagName kModel{"--model"};
inline constexpr FlagName kAdapter{"--adapter"};
inline constexpr FlagName kTokenizer{"--tokenizer"};
inline constexpr FlagName kDevice{"--device"};
inline constexpr FlagName kBatchSize{"--batch-size"};
inline constexpr FlagName kOutput{"-o,--output"};
// generate
inline constexpr FlagName kPrompt{"--prompt"};
inline constexpr FlagName kPrompts{"--prompts"};
inline constexpr FlagName kNoCache{"--no-cache"};
// generate and eval --generate
inline constexpr FlagName kMaxNewTokens{"--max-new-tokens"};
inline constexpr FlagName kTemperature{"--temperature"};
inline constexpr FlagName kTopP{"--top-p"};
inline constexpr FlagName kTopK{"--top-k"};
inline constexpr FlagName kSeed{"--seed"};
inline constexpr FlagName kStop{"--stop"};
inline constexpr FlagName kChat{"--chat"};
inline constexpr FlagName kSystem{"--system"};
inline constexpr FlagName kChatTemplate{"--chat-template"};
// eval
inline constexpr FlagName kData{"--data"};
inline constexpr FlagName kDumpLogits{"--dump-logits"};
inline constexpr FlagName kFormat{"--format"};
inline constexpr FlagName kMaxSeqLen{"--max-seq-len"};
inline constexpr FlagName kPrecision{"--precision"};
inline constexpr FlagName kGenerate{"--generate"};
inline constexpr FlagName kSamplesOut{"--samples-out"};
// export
inline constexpr FlagName kMerge{"--merge"};
inline constexpr FlagName kGguf{"--gguf"};
inline constexpr FlagName kDtype{"--dtype"};
inline constexpr FlagName kMaxShardSize{"--max-shard-size"};
inline constexpr FlagName kType{"--type"};
}  // namespace flag

struct FlagDef {
  std::string names;  // a FlagName's names ("-o,--output")
  std::string help;
  FlagKind kind = FlagKind::kString;
  FlagCheck check = FlagCheck::kNone;
  bool required = false;
  std::string excludes;  // the long name of a flag of the same command that cannot come with this one
  std::string needs;     // the long name of a flag of the same command this one needs
  // Shown in both binaries' help as "(default X)". sftctl-trainer checks that the variable it binds
  // the flag to holds exactly this (as CLI11 prints it), so the help cannot drift from the code.
  std::string default_value;
};

// The help line of `flag` in both binaries: its help and its default.
std::string HelpText(const FlagDef& flag);

struct TrainerCommandDef {
  std::string name;  // the subcommand, the same in both binaries
  std::string description;
  std::vector<FlagDef> flags;
};

const TrainerCommandDef& GenerateCommandDef();
const TrainerCommandDef& EvalCommandDef();
const TrainerCommandDef& ExportCommandDef();
// Every command above.
std::vector<const TrainerCommandDef*> TrainerCommandDefs();

// "--output" for "-o,--output".
std::string LongName(const FlagDef& flag);
std::string LongName(FlagName flag);

// sftctl's side: adds `def.name` to `app` with every flag of `def`, values kept by CLI11 only.
// The returned subcommand is owned by `app`.
CLI::App* AddForwardingCommand(CLI::App& app, const TrainerCommandDef& def);

// After `cmd` (from AddForwardingCommand) parsed: sftctl-trainer's argv[1..] — the command name,
// then each flag given, by its long name, in table order, a value as its own argument (so values
// that start with '-' or are empty pass unchanged; a repeated flag repeats).
std::vector<std::string> ForwardedArgs(const CLI::App& cmd, const TrainerCommandDef& def);

// sftctl-trainer's side: where each flag of a command is stored, by its FlagName (or, for code that
// binds a whole table, by its row).
class FlagBindings {
 public:
  using Target = std::variant<std::string*, int64_t*, uint64_t*, double*, bool*, std::vector<std::string>*>;
  // REQUIRES: `target` outlives the parse; each flag bound once.
  void Bind(FlagName flag, Target target) { targets_[LongName(flag)] = target; }
  void Bind(const FlagDef& flag, Target target) { targets_[LongName(flag)] = target; }
  const std::map<std::string, Target>& targets() const { return targets_; }

 private:
  std::map<std::string, Target> targets_;
};

// Adds `def.name` to `app`, each flag stored where `bindings` says. Throws std::logic_error (a
// programming error, seen at the binary's first start) when a flag of `def` is not bound, is bound
// to the wrong type for its kind, its variable does not hold the table's default_value, or a binding
// names no flag of `def`.
CLI::App* AddBoundCommand(CLI::App& app, const TrainerCommandDef& def, const FlagBindings& bindings);

}  // namespace sftctl::cli
