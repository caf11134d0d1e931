// `sftctl eval --model DIR --data FILE.jsonl [--dump-logits OUT]`: loss and perplexity of a model
// folder on a dataset, with the training masking rules (runs sftctl-trainer).
#include "client/commands.h"
#include "client/trainer_exec.h"

namespace sftctl::client {

void RegisterEvalCommand(CLI::App& app, CommandContext& ctx) {
  struct Args {
    std::string model, data, adapter, dump_logits, format, tokenizer, device;
    int64_t max_seq_len = 0, batch_size = 8;
  };
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("eval", "Loss and perplexity of a checkpoint or HF model folder on a JSONL file");
  cmd->add_option("--model", a->model, "Checkpoint or HF model folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--data", a->data, "JSONL file (text, prompt/completion or messages)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--adapter", a->adapter, "A PEFT LoRA adapter folder to apply")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--dump-logits", a->dump_logits, "Write the first batch's logits here (safetensors)");
  cmd->add_option("--format", a->format, "auto, text, prompt_completion, messages");
  cmd->add_option("--tokenizer", a->tokenizer, "auto, byte or a folder with tokenizer.json");
  cmd->add_option("--max-seq-len", a->max_seq_len, "Truncate samples (default: the model's max positions)");
  cmd->add_option("--batch-size", a->batch_size, "Sequences per batch")->check(CLI::PositiveNumber);
  cmd->add_option("--device", a->device, "auto, cpu, cuda, cuda:N, mps");
  cmd->callback([a, &ctx] {
    std::vector<std::string> args = {
        "eval", "--model", a->model, "--data", a->data, "--batch-size", std::to_string(a->batch_size)};
    if (!a->adapter.empty()) args.insert(args.end(), {"--adapter", a->adapter});
    if (!a->dump_logits.empty()) args.insert(args.end(), {"--dump-logits", a->dump_logits});
    if (!a->format.empty()) args.insert(args.end(), {"--format", a->format});
    if (!a->tokenizer.empty()) args.insert(args.end(), {"--tokenizer", a->tokenizer});
    if (a->max_seq_len > 0) args.insert(args.end(), {"--max-seq-len", std::to_string(a->max_seq_len)});
    if (!a->device.empty()) args.insert(args.end(), {"--device", a->device});
    ctx.exit_code = RunTrainer(args);
  });
}

}  // namespace sftctl::client
