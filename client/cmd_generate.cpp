// `sftctl generate --model DIR (--prompt TEXT | --prompts FILE.jsonl)`: continue prompts with a
// checkpoint (runs sftctl-trainer generate; docs/generate.md).
#include <cstdio>

#include "client/commands.h"
#include "client/trainer_exec.h"

namespace sftctl::client {

void AddGenerationArgs(CLI::App* cmd, const std::shared_ptr<GenerationArgs>& a) {
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Most tokens to generate")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", a->temperature, "0 = greedy (default)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling: keep the top tokens of this much probability")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", a->top_k, "Keep the K most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "Sampling seed (prompt i samples with seed + i)");
  cmd->add_option("--stop", a->stop, "Stop when the text contains this string (repeatable)");
  cmd->add_flag("--chat", a->chat, "Render prompts as a user message with the model's chat template");
  cmd->add_option("--system", a->system, "With --chat: a system message");
  cmd->add_option("--chat-template", a->chat_template,
                  "auto (tokenizer_config.json), chatml, qwen3, llama3 or a template file");
}

std::vector<std::string> GenerationArgs::ToTrainerArgs() const {
  std::vector<std::string> args = {"--max-new-tokens", std::to_string(max_new_tokens),
                                   "--temperature",    std::to_string(temperature),
                                   "--top-p",          std::to_string(top_p),
                                   "--top-k",          std::to_string(top_k),
                                   "--seed",           std::to_string(seed)};
  for (const std::string& s : stop) args.insert(args.end(), {"--stop", s});
  if (chat) args.push_back("--chat");
  if (!system.empty()) args.insert(args.end(), {"--system", system});
  if (!chat_template.empty()) args.insert(args.end(), {"--chat-template", chat_template});
  return args;
}

void RegisterGenerateCommand(CLI::App& app, CommandContext& ctx) {
  struct Args {
    std::string model, prompt, prompts, output, adapter, tokenizer, device;
    int64_t batch_size = 8;
    bool no_cache = false;
  };
  auto a = std::make_shared<Args>();
  auto g = std::make_shared<GenerationArgs>();
  auto* cmd = app.add_subcommand("generate", "Continue prompts with a checkpoint or HF model folder");
  cmd->add_option("--model", a->model, "Checkpoint or HF model folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  auto* one = cmd->add_option("--prompt", a->prompt, "Prompt text");
  auto* many = cmd->add_option("--prompts", a->prompts,
                               "JSONL: {\"prompt\"} or {\"messages\"} per line, optional \"reference\"")
                   ->check(CLI::ExistingFile);
  one->excludes(many);
  cmd->add_option("-o,--output", a->output, "Write one JSON line per prompt here (default: stdout)");
  cmd->add_option("--batch-size", a->batch_size, "Prompts decoded together")->check(CLI::PositiveNumber);
  cmd->add_option("--adapter", a->adapter, "A PEFT LoRA adapter folder to apply")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--tokenizer", a->tokenizer, "auto, byte or a folder with tokenizer.json");
  cmd->add_option("--device", a->device, "auto, cpu, cuda, cuda:N, mps");
  cmd->add_flag("--no-cache", a->no_cache, "Re-run the whole sequence per token (the slow reference)");
  AddGenerationArgs(cmd, g);
  cmd->callback([a, g, one, many, &ctx] {
    if (one->count() + many->count() != 1) {
      std::fprintf(stderr, "error: give either --prompt or --prompts\n");
      ctx.exit_code = 2;
      return;
    }
    std::vector<std::string> args = {"generate", "--model", a->model, "--batch-size",
                                     std::to_string(a->batch_size)};
    if (one->count()) args.insert(args.end(), {"--prompt", a->prompt});
    if (many->count()) args.insert(args.end(), {"--prompts", a->prompts});
    if (!a->output.empty()) args.insert(args.end(), {"--output", a->output});
    if (!a->adapter.empty()) args.insert(args.end(), {"--adapter", a->adapter});
    if (!a->tokenizer.empty()) args.insert(args.end(), {"--tokenizer", a->tokenizer});
    if (!a->device.empty()) args.insert(args.end(), {"--device", a->device});
    if (a->no_cache) args.push_back("--no-cache");
    const std::vector<std::string> gen = g->ToTrainerArgs();
    args.insert(args.end(), gen.begin(), gen.end());
    ctx.exit_code = RunTrainer(args);
  });
}

}  // namespace sftctl::client
