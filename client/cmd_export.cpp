// `sftctl export --model DIR [--merge --adapter DIR] -o OUT`: write a Hugging Face model folder,
// optionally with a LoRA adapter merged into the weights; `--gguf OUT.gguf [--type f16|q8_0]`
// writes one GGUF file instead (llama.cpp, ollama). Runs sftctl-trainer, which checks the flags.
#include "client/commands.h"
#include "client/trainer_exec.h"

namespace sftctl::client {

void RegisterExportCommand(CLI::App& app, CommandContext& ctx) {
  struct Args {
    std::string model, adapter, out, dtype, gguf, type;
    bool merge = false;
    int64_t max_shard_size = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "export", "Write an HF model folder or a GGUF file, optionally merging a LoRA adapter");
  cmd->add_option("--model", a->model, "Base model or checkpoint folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--adapter", a->adapter, "PEFT LoRA adapter folder (with --merge)")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--merge", a->merge, "Merge the adapter: W + (alpha/r) B A");
  cmd->add_option("-o,--output", a->out, "The HF folder to create");
  cmd->add_option("--gguf", a->gguf, "The GGUF file to create instead (llama.cpp, ollama)");
  cmd->add_option("--type", a->type, "GGUF weight type: f16 or q8_0 (default f16)");
  cmd->add_option("--dtype", a->dtype, "fp32, bf16 or fp16 (default fp32)");
  cmd->add_option("--max-shard-size", a->max_shard_size, "Shard above this many bytes (default 5e9)")
      ->check(CLI::PositiveNumber);
  cmd->callback([a, &ctx] {
    std::vector<std::string> args = {"export", "--model", a->model};
    if (!a->out.empty()) args.insert(args.end(), {"-o", a->out});
    if (!a->gguf.empty()) args.insert(args.end(), {"--gguf", a->gguf});
    if (!a->type.empty()) args.insert(args.end(), {"--type", a->type});
    if (a->merge) args.push_back("--merge");
    if (!a->adapter.empty()) args.insert(args.end(), {"--adapter", a->adapter});
    if (!a->dtype.empty()) args.insert(args.end(), {"--dtype", a->dtype});
    if (a->max_shard_size > 0)
      args.insert(args.end(), {"--max-shard-size", std::to_string(a->max_shard_size)});
    ctx.exit_code = RunTrainer(args);
  });
}

}  // namespace sftctl::client
