// `sftctl eval --model DIR --data FILE.jsonl [--dump-logits OUT]`: loss and perplexity of a model
// folder on a dataset, with the training masking rules; with --generate, exact-match/contains
// scores of generations against the records' references (runs sftctl-trainer).
#include "client/commands.h"
#include "client/trainer_exec.h"

namespace sftctl::client {

void RegisterEvalCommand(CLI::App& app, CommandContext& ctx) {
  struct Args {
    std::string model, data, adapter, dump_logits, format, tokenizer, device;
    int64_t max_seq_len = 0, batch_size = 8;
    bool generate = false;
    std::string samples_out;
  };
  auto a = std::make_shared<Args>();
  auto g = std::make_shared<GenerationArgs>();
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
  cmd->add_flag("--generate", a->generate,
                "Score generations against references (exact match, contains) instead of the loss");
  cmd->add_option("--samples-out", a->samples_out,
                  "With --generate: write each sample and its scores (JSONL)");
  AddGenerationArgs(cmd, g);
  cmd->callback([a, g, &ctx] {
    std::vector<std::string> args = {
        "eval", "--model", a->model, "--data", a->data, "--batch-size", std::to_string(a->batch_size)};
    if (!a->adapter.empty()) args.insert(args.end(), {"--adapter", a->adapter});
    if (!a->dump_logits.empty()) args.insert(args.end(), {"--dump-logits", a->dump_logits});
    if (!a->format.empty()) args.insert(args.end(), {"--format", a->format});
    if (!a->tokenizer.empty()) args.insert(args.end(), {"--tokenizer", a->tokenizer});
    if (a->max_seq_len > 0) args.insert(args.end(), {"--max-seq-len", std::to_string(a->max_seq_len)});
    if (!a->device.empty()) args.insert(args.end(), {"--device", a->device});
    if (a->generate) {
      args.push_back("--generate");
      if (!a->samples_out.empty()) args.insert(args.end(), {"--samples-out", a->samples_out});
      const std::vector<std::string> gen = g->ToTrainerArgs();
      args.insert(args.end(), gen.begin(), gen.end());
    }
    ctx.exit_code = RunTrainer(args);
  });
}

}  // namespace sftctl::client
