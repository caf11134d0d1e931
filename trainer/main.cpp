// sftctl-trainer: the only sftctl binary that links LibTorch. The same binary trains locally
// (exec'd by `sftctl run --local`) and on GPU hosts (spawned by sftd, one per rank).
//
//   sftctl-trainer train --spec RUN/spec.json [--events-fd N]
//   sftctl-trainer generate --model CHECKPOINT (--prompt TEXT | --prompts FILE.jsonl [-o OUT.jsonl])
//                           [--chat [--system TEXT]] [--max-new-tokens N] [--temperature T --top-p P
//                           --top-k K --seed S] [--stop STRING]... [--batch-size B]
//   sftctl-trainer eval --model DIR --data FILE.jsonl [--adapter DIR] [--dump-logits OUT.safetensors]
//   sftctl-trainer eval --generate --model DIR --data FILE.jsonl [--samples-out OUT.jsonl] [generation flags]
//   sftctl-trainer export --model DIR [--merge --adapter DIR] -o OUT [--dtype bf16] [--max-shard-size BYTES]
//   sftctl-trainer export --model DIR [--merge --adapter DIR] --gguf OUT.gguf [--type f16|q8_0]
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/version.h"
#include "trainer/device.h"
#include "trainer/generate_command.h"
#include "trainer/gguf_export.h"
#include "trainer/hf_tools.h"
#include "trainer/metrics.h"
#include "trainer/trainer.h"

namespace {

using namespace sftctl;
using namespace sftctl::trainer;

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnimplemented:
      return 2;  // the input is wrong: fix the spec or the data
    default:
      return 1;
  }
}

int Fail(const Status& s, int events_fd = -1) {
  std::cerr << "error: " << s.message() << std::endl;
  if (events_fd >= 0) {
    std::string line =
        nlohmann::json{{"event", "error"}, {"code", StatusCodeName(s.code())}, {"message", s.message()}}.dump(
            -1, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n";
    (void)!::write(events_fd, line.data(), line.size());
  }
  return ExitCodeFor(s);
}

StatusOr<JobSpec> ReadSpecJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read spec '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(path + ": invalid JSON");
  return ParseSpec(j, "", [&path](const std::string&) { return path; });
}

// Test seam (tests/trainer/distributed_test.cpp): SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S=N makes the
// first checkpoint this process writes take N seconds longer, as a large model's would.
class SlowFirstCheckpoint : public ForwardingFileSystem {
 public:
  SlowFirstCheckpoint(FileSystem* base, double delay_s) : ForwardingFileSystem(base), delay_s_(delay_s) {}
  Status SyncDir(const std::string& path) override {
    if (!slept_ && path.find("/.tmp-checkpoint-") != std::string::npos) {
      slept_ = true;
      std::this_thread::sleep_for(std::chrono::duration<double>(delay_s_));
    }
    return ForwardingFileSystem::SyncDir(path);
  }

 private:
  double delay_s_;
  bool slept_ = false;
};

int RunTrain(const std::string& spec_path, int events_fd) {
  auto spec = ReadSpecJson(spec_path);
  if (!spec.ok()) return Fail(spec.status(), events_fd);
  TrainOptions options;
  std::unique_ptr<SlowFirstCheckpoint> slow_fs;
  if (const char* delay = std::getenv("SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S"); delay != nullptr && *delay) {
    slow_fs = std::make_unique<SlowFirstCheckpoint>(FileSystem::Default(), std::atof(delay));
    options.hooks.fs = slow_fs.get();
  }
  options.events_fd = events_fd;
  options.progress_bar = events_fd < 0 && StderrIsTty();
  auto result = Train(*spec, options);
  if (!result.ok()) return Fail(result.status(), events_fd);
  const TrainResult& r = *result;
  if (r.rank != 0) return 0;  // rank 0 reports for a data-parallel job
  std::ostringstream summary;
  summary << "done: " << r.steps << " steps in " << static_cast<int>(r.elapsed_s) << " s (" << r.device
          << ", " << r.precision << "), final train loss " << r.last_loss;
  if (r.eval_loss) summary << ", eval loss " << *r.eval_loss;
  if (r.exact_match) summary << ", held-out exact match " << 100.0 * *r.exact_match << "%";
  spdlog::info("{}", summary.str());
  const int64_t dropped = r.train_stats.dropped + r.eval_stats.dropped;
  const int64_t truncated = r.train_stats.truncated + r.eval_stats.truncated;
  if (dropped > 0 || truncated > 0) {
    spdlog::warn("{} sample(s) truncated to data.max_seq_len, {} dropped (no trained token left)", truncated,
                 dropped);
  }
  spdlog::info("checkpoint: {}", r.checkpoint_dir);
  return 0;
}

int RunGenerate(const GenerateCommandOptions& o) {
  ConfigureThreads(0);
  if (o.prompt.empty() == o.prompts_file.empty())
    return Fail(InvalidArgumentError("give either --prompt or --prompts"));
  try {
    Status s = RunGenerateCommand(o, std::cout);
    if (!s.ok()) return Fail(s);
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  return 0;
}

int RunEvalGenerate(const GenerateCommandOptions& o, const std::string& samples_out) {
  ConfigureThreads(0);
  try {
    auto r = EvalGenerations(o, samples_out);
    if (!r.ok()) return Fail(r.status());
    const double n = static_cast<double>(std::max<int64_t>(r->samples, 1));
    std::printf("exact match %lld/%lld (%.2f%%)  contains %lld/%lld (%.2f%%)\n",
                static_cast<long long>(r->exact), static_cast<long long>(r->samples), 100.0 * r->exact / n,
                static_cast<long long>(r->contains), static_cast<long long>(r->samples),
                100.0 * r->contains / n);
    if (!samples_out.empty()) std::printf("samples: %s\n", samples_out.c_str());
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  return 0;
}

// The generation flags `generate` and `eval --generate` share (the client's GenerationArgs).
void AddGenerationOptions(CLI::App* cmd, GenerateCommandOptions& o) {
  cmd->add_option("--max-new-tokens", o.max_new_tokens, "Most tokens to generate")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o.sampling.temperature, "0 = greedy (default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o.sampling.top_p,
                  "Nucleus sampling: keep the top tokens of this much probability")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--top-k", o.sampling.top_k, "Keep the K most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", o.seed, "Sampling seed (prompt i samples with seed + i)");
  cmd->add_option("--stop", o.stop, "Stop when the text contains this string (repeatable)");
  cmd->add_flag("--chat", o.prompts.chat, "Render prompts as a user message with the model's chat template");
  cmd->add_option("--system", o.prompts.system, "With chat: a system message");
  cmd->add_option("--chat-template", o.prompts.chat_template,
                  "auto (tokenizer_config.json), chatml, qwen3, llama3 or a template file");
}

int RunEval(const EvalModelOptions& o) {
  ConfigureThreads(0);
  try {
    auto r = EvalModel(o);
    if (!r.ok()) return Fail(r.status());
    std::printf(
        "loss %.6f  perplexity %.4f  (%lld target tokens in %lld samples; %lld truncated, %lld dropped)\n",
        r->loss, r->perplexity, static_cast<long long>(r->targets), static_cast<long long>(r->samples),
        static_cast<long long>(r->truncated), static_cast<long long>(r->dropped));
    if (!o.dump_logits.empty()) std::printf("first-batch logits: %s\n", o.dump_logits.c_str());
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  return 0;
}

// The HF folder export (-o) or the GGUF export (--gguf): exactly one of them.
int RunExport(const ExportOptions& o, const GgufExportOptions& g) {
  if (o.out_dir.empty() == g.out_path.empty())
    return Fail(
        InvalidArgumentError("export needs exactly one of -o (an HF folder) and --gguf (a GGUF file)"));
  ConfigureThreads(0);
  try {
    Status s = o.out_dir.empty() ? ExportGguf(g) : ExportModel(o);
    if (!s.ok()) return Fail(s);
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  std::printf("wrote %s\n", o.out_dir.empty() ? g.out_path.c_str() : o.out_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sftctl-trainer: the LibTorch trainer behind `sftctl run` and the sftd agent"};
  app.set_version_flag("--version", std::string("sftctl-trainer ") + kVersion);
  app.require_subcommand(1);
  int code = 0;

  auto* train = app.add_subcommand("train", "Train from a resolved JSON spec (written by `sftctl run`)");
  std::string spec_path;
  int events_fd = -1;
  train->add_option("--spec", spec_path, "The job spec in canonical JSON")->required();
  train->add_option("--events-fd", events_fd,
                    "Also write metric records (JSON lines) to this file descriptor");
  train->callback([&] { code = RunTrain(spec_path, events_fd); });

  auto* gen =
      app.add_subcommand("generate", "Continue prompts with a trained checkpoint (KV cache, sampling)");
  GenerateCommandOptions gen_opts;
  gen->add_option("--model", gen_opts.model_dir, "A checkpoint or HF model folder")->required();
  gen->add_option("--prompt", gen_opts.prompt, "The prompt text");
  gen->add_option("--prompts", gen_opts.prompts_file,
                  "JSONL: {\"prompt\"} or {\"messages\"} per line, optional \"reference\"");
  gen->add_option("-o,--output", gen_opts.output, "Write one JSON line per prompt here (default: stdout)");
  gen->add_option("--batch-size", gen_opts.batch_size, "Prompts decoded together")
      ->check(CLI::PositiveNumber);
  gen->add_option("--tokenizer", gen_opts.tokenizer, "auto, byte or a folder with tokenizer.json");
  gen->add_option("--adapter", gen_opts.adapter_dir, "A PEFT LoRA adapter folder to apply");
  gen->add_option("--device", gen_opts.device, "auto, cpu, cuda, cuda:N, mps");
  gen->add_flag("!--no-cache", gen_opts.use_cache,
                "Re-run the whole sequence per token (the slow reference)");
  AddGenerationOptions(gen, gen_opts);
  gen->callback([&] { code = RunGenerate(gen_opts); });

  auto* ev = app.add_subcommand("eval", "Loss and perplexity of a model folder on a JSONL file");
  EvalModelOptions eval_opts;
  ev->add_option("--model", eval_opts.model_dir, "A checkpoint or HF model folder")->required();
  ev->add_option("--data", eval_opts.data_file, "JSONL file (text, prompt/completion or messages)")
      ->required();
  ev->add_option("--adapter", eval_opts.adapter_dir, "A PEFT LoRA adapter folder to apply");
  ev->add_option("--dump-logits", eval_opts.dump_logits, "Write the first batch's logits (safetensors)");
  ev->add_option("--format", eval_opts.format, "auto, text, prompt_completion, messages");
  ev->add_option("--tokenizer", eval_opts.tokenizer, "auto, byte or a folder with tokenizer.json");
  ev->add_option("--max-seq-len", eval_opts.max_seq_len, "Truncate samples (default: max positions)");
  ev->add_option("--batch-size", eval_opts.batch_size, "Sequences per batch")->check(CLI::PositiveNumber);
  ev->add_option("--device", eval_opts.device, "auto, cpu, cuda, cuda:N, mps");
  bool eval_generate = false;
  std::string samples_out;
  GenerateCommandOptions eval_gen;
  ev->add_flag("--generate", eval_generate,
               "Score generations against references (exact match, contains) instead of the loss");
  ev->add_option("--samples-out", samples_out, "With --generate: write each sample and its scores (JSONL)");
  AddGenerationOptions(ev, eval_gen);  // used with --generate
  ev->callback([&] {
    if (!eval_generate) {
      code = RunEval(eval_opts);
      return;
    }
    eval_gen.model_dir = eval_opts.model_dir;
    eval_gen.adapter_dir = eval_opts.adapter_dir;
    eval_gen.prompts_file = eval_opts.data_file;
    eval_gen.tokenizer = eval_opts.tokenizer;
    eval_gen.device = eval_opts.device;
    eval_gen.batch_size = eval_opts.batch_size;
    code = RunEvalGenerate(eval_gen, samples_out);
  });

  auto* ex = app.add_subcommand(
      "export", "Write a model as a Hugging Face folder or a GGUF file (optionally merging LoRA)");
  ExportOptions export_opts;
  GgufExportOptions gguf_opts;
  ex->add_option("--model", export_opts.model_dir, "The base model / checkpoint folder")->required();
  ex->add_option("--adapter", export_opts.adapter_dir, "A PEFT LoRA adapter folder (with --merge)");
  ex->add_flag("--merge", export_opts.merge, "Merge the adapter into the weights: W + (alpha/r) B A");
  auto* out_opt = ex->add_option("-o,--output", export_opts.out_dir, "The HF folder to create");
  auto* gguf_opt =
      ex->add_option("--gguf", gguf_opts.out_path, "The GGUF file to create (llama.cpp, ollama)");
  ex->add_option("--dtype", export_opts.dtype, "fp32, bf16 or fp16 (default: fp32)")->needs(out_opt);
  ex->add_option("--max-shard-size", export_opts.max_shard_bytes, "Shard the weights above this many bytes")
      ->check(CLI::PositiveNumber)
      ->needs(out_opt);
  ex->add_option("--type", gguf_opts.type, "GGUF weight type: f16 or q8_0 (default: f16)")->needs(gguf_opt);
  ex->callback([&] {
    gguf_opts.model_dir = export_opts.model_dir;
    gguf_opts.adapter_dir = export_opts.adapter_dir;
    gguf_opts.merge = export_opts.merge;
    code = RunExport(export_opts, gguf_opts);
  });

  CLI11_PARSE(app, argc, argv);
  return code;
}
