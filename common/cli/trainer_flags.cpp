#include "common/cli/trainer_flags.h"

#include <stdexcept>
#include <utility>

namespace sftctl::cli {
namespace {

using K = FlagKind;
using C = FlagCheck;

FlagDef Flag(FlagName name, std::string help, FlagKind kind, FlagCheck check = C::kNone) {
  FlagDef f;
  f.names = name.names;
  f.help = std::move(help);
  f.kind = kind;
  f.check = check;
  return f;
}
FlagDef Required(FlagDef f) {
  f.required = true;
  return f;
}
FlagDef Excludes(FlagDef f, FlagName other) {
  f.excludes = LongName(other);
  return f;
}
FlagDef Needs(FlagDef f, FlagName other) {
  f.needs = LongName(other);
  return f;
}
FlagDef Default(FlagDef f, std::string value) {
  f.default_value = std::move(value);
  return f;
}

// The flags `generate` and `eval --generate` share.
std::vector<FlagDef> GenerationFlags() {
  return {
      Default(Flag(flag::kMaxNewTokens, "Most tokens to generate", K::kInt, C::kPositive), "64"),
      Default(Flag(flag::kTemperature, "Sampling temperature; 0: greedy", K::kDouble, C::kNonNegative), "0"),
      Default(Flag(flag::kTopP, "Nucleus sampling: keep the top tokens of this much probability; 1: off",
                   K::kDouble, C::kUnitInterval),
              "1"),
      Default(Flag(flag::kTopK, "Keep the K most likely tokens; 0: all", K::kInt, C::kNonNegative), "0"),
      Default(Flag(flag::kSeed, "Sampling seed; prompt i samples with seed + i", K::kUint), "0"),
      Flag(flag::kStop, "Stop when the text contains this string (repeatable)", K::kStrings),
      Flag(flag::kChat, "Render prompts as a user message with the model's chat template", K::kBool),
      Flag(flag::kSystem, "With --chat: a system message", K::kString),
      Default(Flag(flag::kChatTemplate,
                   "auto (tokenizer_config.json), chatml, qwen3, llama3 or a template file", K::kString),
              "auto"),
  };
}

FlagDef ModelFlag(std::string help) {
  return Required(Flag(flag::kModel, std::move(help), K::kString, C::kExistingDir));
}
FlagDef AdapterFlag() {
  return Flag(flag::kAdapter, "A PEFT LoRA adapter folder to apply", K::kString, C::kExistingDir);
}
FlagDef TokenizerFlag() {
  return Default(Flag(flag::kTokenizer, "auto, byte or a folder with tokenizer.json", K::kString), "auto");
}
FlagDef DeviceFlag() {
  return Default(Flag(flag::kDevice, "auto, cpu, cuda, cuda:N, mps", K::kString), "auto");
}

TrainerCommandDef MakeGenerate() {
  TrainerCommandDef d;
  d.name = "generate";
  d.description = "Continue prompts with a checkpoint or HF model folder (KV cache, sampling)";
  d.flags = {
      ModelFlag("Checkpoint or HF model folder"),
      Excludes(Flag(flag::kPrompt, "Prompt text", K::kString), flag::kPrompts),
      Flag(flag::kPrompts, "JSONL: {\"prompt\"} or {\"messages\"} per line, optional \"reference\"",
           K::kString, C::kExistingFile),
      Flag(flag::kOutput, "Write one JSON line per prompt here (default: stdout)", K::kString),
      Default(Flag(flag::kBatchSize, "Prompts decoded together", K::kInt, C::kPositive), "8"),
      AdapterFlag(),
      TokenizerFlag(),
      DeviceFlag(),
      Flag(flag::kNoCache, "Re-run the whole sequence per token (the slow reference)", K::kBool),
  };
  for (FlagDef& f : GenerationFlags()) d.flags.push_back(std::move(f));
  return d;
}

TrainerCommandDef MakeEval() {
  TrainerCommandDef d;
  d.name = "eval";
  d.description = "Loss and perplexity of a checkpoint or HF model folder on a JSONL file";
  d.flags = {
      ModelFlag("Checkpoint or HF model folder"),
      Required(Flag(flag::kData, "JSONL file (text, prompt/completion or messages)", K::kString,
                    C::kExistingFile)),
      AdapterFlag(),
      Flag(flag::kDumpLogits, "Write the first batch's logits here (safetensors)", K::kString),
      Default(Flag(flag::kFormat, "auto, text, prompt_completion, messages", K::kString), "auto"),
      TokenizerFlag(),
      Default(
          Flag(flag::kMaxSeqLen, "Truncate samples; 0: the model's max positions", K::kInt, C::kNonNegative),
          "0"),
      Default(Flag(flag::kBatchSize, "Sequences per batch", K::kInt, C::kPositive), "8"),
      DeviceFlag(),
      Default(
          Flag(flag::kPrecision,
               "fp32, bf16, fp16 or auto (auto: the training autocast on a GPU, fp32 elsewhere)", K::kString),
          "auto"),
      Flag(flag::kGenerate,
           "Score generations against references (exact match, contains) instead of the loss", K::kBool),
      Needs(Flag(flag::kSamplesOut, "With --generate: write each sample and its scores (JSONL)", K::kString),
            flag::kGenerate),
  };
  for (FlagDef& f : GenerationFlags()) d.flags.push_back(std::move(f));
  return d;
}

TrainerCommandDef MakeExport() {
  TrainerCommandDef d;
  d.name = "export";
  d.description = "Write an HF model folder or a GGUF file, optionally merging a LoRA adapter";
  d.flags = {
      ModelFlag("Base model or checkpoint folder"),
      Flag(flag::kAdapter, "PEFT LoRA adapter folder (with --merge)", K::kString, C::kExistingDir),
      Flag(flag::kMerge, "Merge the adapter into the weights: W + (alpha/r) B A", K::kBool),
      Excludes(Flag(flag::kOutput, "The HF folder to create", K::kString), flag::kGguf),
      Flag(flag::kGguf, "The GGUF file to create instead (llama.cpp, ollama)", K::kString),
      Needs(Flag(flag::kDtype, "fp32, bf16 or fp16 (default: as loaded, fp32)", K::kString), flag::kOutput),
      Needs(
          Default(Flag(flag::kMaxShardSize, "Shard the weights above this many bytes", K::kInt, C::kPositive),
                  "5000000000"),
          flag::kOutput),
      Needs(Default(Flag(flag::kType, "GGUF weight type: f16, q8_0 or f32", K::kString), "f16"), flag::kGguf),
  };
  return d;
}

void AddCheck(CLI::Option* opt, FlagCheck check) {
  switch (check) {
    case C::kNone:
      return;
    case C::kPositive:
      opt->check(CLI::PositiveNumber);
      return;
    case C::kNonNegative:
      opt->check(CLI::NonNegativeNumber);
      return;
    case C::kUnitInterval:
      opt->check(CLI::Range(0.0, 1.0));
      return;
    case C::kExistingDir:
      opt->check(CLI::ExistingDirectory);
      return;
    case C::kExistingFile:
      opt->check(CLI::ExistingFile);
      return;
  }
}

// The parts every flag has in both binaries: requirement, check, repeatability, relations.
void Finish(CLI::App* cmd, const TrainerCommandDef& def) {
  for (const FlagDef& f : def.flags) {
    CLI::Option* opt = cmd->get_option(LongName(f));
    if (f.required) opt->required();
    AddCheck(opt, f.check);
    if (!f.excludes.empty()) opt->excludes(cmd->get_option(f.excludes));
    if (!f.needs.empty()) opt->needs(cmd->get_option(f.needs));
  }
}

// The value's name in the help (the same in both binaries; a flag has none).
std::string TypeName(FlagKind kind) {
  if (kind == K::kInt || kind == K::kUint) return "INT";
  if (kind == K::kDouble) return "FLOAT";
  return "TEXT";
}

// The type check sftctl makes where the trainer's typed option would refuse the text (without a
// description: the help shows the same type name as the trainer's).
void AddTypeCheck(CLI::Option* opt, FlagKind kind) {
  if (kind == K::kInt) opt->check(CLI::TypeValidator<int64_t>().description(""));
  if (kind == K::kUint) opt->check(CLI::TypeValidator<uint64_t>().description(""));
  if (kind == K::kDouble) opt->check(CLI::Validator(CLI::Number).description(""));
}

template <typename T>
T* Get(const FlagBindings::Target& target, const FlagDef& f) {
  if (T* const* p = std::get_if<T*>(&target)) return *p;
  throw std::logic_error(f.names + ": bound to a variable of the wrong type for its kind");
}

CLI::Option* AddBound(CLI::App* cmd, const FlagDef& f, const FlagBindings::Target& t) {
  switch (f.kind) {
    case K::kString:
      return cmd->add_option(f.names, *Get<std::string>(t, f), HelpText(f));
    case K::kInt:
      return cmd->add_option(f.names, *Get<int64_t>(t, f), HelpText(f));
    case K::kUint:
      return cmd->add_option(f.names, *Get<uint64_t>(t, f), HelpText(f));
    case K::kDouble:
      return cmd->add_option(f.names, *Get<double>(t, f), HelpText(f));
    case K::kBool:
      return cmd->add_flag(f.names, *Get<bool>(t, f), HelpText(f));
    case K::kStrings:
      return cmd->add_option(f.names, *Get<std::vector<std::string>>(t, f), HelpText(f));
  }
  throw std::logic_error(f.names + ": unknown kind");
}

// The variable behind `opt` must hold the default the help names (and the help shows it once).
void CheckDefault(const TrainerCommandDef& def, const FlagDef& f, CLI::Option* opt) {
  if (f.default_value.empty()) return;
  const std::string held = opt->capture_default_str()->get_default_str();
  if (held != f.default_value) {
    throw std::logic_error(def.name + " " + f.names + ": the table's default is '" + f.default_value +
                           "' but the bound variable holds '" + held + "'");
  }
  opt->default_str("");
}

}  // namespace

const TrainerCommandDef& GenerateCommandDef() {
  static const TrainerCommandDef def = MakeGenerate();
  return def;
}
const TrainerCommandDef& EvalCommandDef() {
  static const TrainerCommandDef def = MakeEval();
  return def;
}
const TrainerCommandDef& ExportCommandDef() {
  static const TrainerCommandDef def = MakeExport();
  return def;
}
std::vector<const TrainerCommandDef*> TrainerCommandDefs() {
  return {&GenerateCommandDef(), &EvalCommandDef(), &ExportCommandDef()};
}

std::string HelpText(const FlagDef& flag) {
  return flag.default_value.empty() ? flag.help : flag.help + " (default " + flag.default_value + ")";
}

std::string LongName(FlagName flag) {
  const std::string names = flag.names;
  const size_t comma = names.rfind(',');
  return comma == std::string::npos ? names : names.substr(comma + 1);
}

std::string LongName(const FlagDef& flag) { return LongName(FlagName{flag.names.c_str()}); }

CLI::App* AddForwardingCommand(CLI::App& app, const TrainerCommandDef& def) {
  CLI::App* cmd = app.add_subcommand(def.name, def.description);
  for (const FlagDef& f : def.flags) {
    const std::string help = HelpText(f);  // (CLI11 takes an unbound option's help as a const lvalue)
    if (f.kind == K::kBool) {
      cmd->add_flag(f.names, help);
      continue;
    }
    CLI::Option* opt = cmd->add_option(f.names, help)->type_name(TypeName(f.kind));
    // Repeatable as the trainer's std::vector option is: one value per occurrence.
    if (f.kind == K::kStrings) opt->expected(CLI::detail::expected_max_vector_size);
    AddTypeCheck(opt, f.kind);
  }
  Finish(cmd, def);
  return cmd;
}

std::vector<std::string> ForwardedArgs(const CLI::App& cmd, const TrainerCommandDef& def) {
  std::vector<std::string> args = {def.name};
  for (const FlagDef& f : def.flags) {
    const CLI::Option* opt = cmd.get_option(LongName(f));
    if (opt->count() == 0) continue;
    if (f.kind == K::kBool) {
      if (opt->as<bool>()) args.push_back(LongName(f));  // (`--merge=false` is not a --merge)
      continue;
    }
    for (const std::string& value : opt->results()) args.insert(args.end(), {LongName(f), value});
  }
  return args;
}

CLI::App* AddBoundCommand(CLI::App& app, const TrainerCommandDef& def, const FlagBindings& bindings) {
  CLI::App* cmd = app.add_subcommand(def.name, def.description);
  size_t bound = 0;
  for (const FlagDef& f : def.flags) {
    auto it = bindings.targets().find(LongName(f));
    if (it == bindings.targets().end()) throw std::logic_error(def.name + " " + f.names + ": not bound");
    CLI::Option* opt = AddBound(cmd, f, it->second);
    if (f.kind != K::kBool) opt->type_name(TypeName(f.kind));
    CheckDefault(def, f, opt);
    ++bound;
  }
  if (bound != bindings.targets().size())
    throw std::logic_error(def.name + ": a binding names no flag of the command");
  Finish(cmd, def);
  return cmd;
}

}  // namespace sftctl::cli
