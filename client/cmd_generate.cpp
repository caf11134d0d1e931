// `sftctl generate --model DIR --prompt TEXT`: sample from a checkpoint (runs sftctl-trainer).
#include "client/commands.h"
#include "client/trainer_exec.h"

namespace sftctl::client {

void RegisterGenerateCommand(CLI::App& app, CommandContext& ctx) {
  struct Args {
    std::string model, prompt, device;
    int64_t max_new_tokens = 64;
    double temperature = 0;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a checkpoint or HF model folder");
  cmd->add_option("--model", a->model, "Checkpoint or HF model folder")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prompt", a->prompt, "Prompt text")->required();
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "Most tokens to generate")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", a->temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->seed, "Sampling seed");
  cmd->add_option("--device", a->device, "auto, cpu, cuda, cuda:N, mps");
  cmd->callback([a, &ctx] {
    std::vector<std::string> args = {"generate",
                                     "--model",
                                     a->model,
                                     "--prompt",
                                     a->prompt,
                                     "--max-new-tokens",
                                     std::to_string(a->max_new_tokens),
                                     "--temperature",
                                     std::to_string(a->temperature),
                                     "--seed",
                                     std::to_string(a->seed)};
    if (!a->device.empty()) args.insert(args.end(), {"--device", a->device});
    ctx.exit_code = RunTrainer(args);
  });
}

}  // namespace sftctl::client
