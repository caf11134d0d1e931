// sftctl-trainer: the only sftctl binary that links LibTorch. The same binary trains locally
// (exec'd by `sftctl run --local`) and on GPU hosts (spawned by sftd, one per rank).
//
//   sftctl-trainer train --spec RUN/spec.json [--events-fd N]
//   sftctl-trainer generate --model CHECKPOINT --prompt TEXT [--max-new-tokens N] [--temperature T]
//   sftctl-trainer eval --model DIR --data FILE.jsonl [--adapter DIR] [--dump-logits OUT.safetensors]
//   sftctl-trainer export --model DIR [--merge --adapter DIR] -o OUT [--dtype bf16] [--max-shard-size BYTES]
//   sftctl-trainer export --model DIR [--merge --adapter DIR] --gguf OUT.gguf [--type f16|q8_0]
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/version.h"
#include "trainer/device.h"
#include "trainer/generate.h"
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

int RunTrain(const std::string& spec_path, int events_fd) {
  auto spec = ReadSpecJson(spec_path);
  if (!spec.ok()) return Fail(spec.status(), events_fd);
  TrainOptions options;
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

int RunGenerate(const std::string& model_dir, const std::string& prompt, int64_t max_new, double temperature,
                uint64_t seed, const std::string& device) {
  ConfigureThreads(0);
  auto plan = ChooseDevice(device, "fp32");
  if (!plan.ok()) return Fail(plan.status());
  JobSpec spec;
  spec.model.path = model_dir;
  spec.tokenizer = FileSystem::Default()->Exists(JoinPath(model_dir, "tokenizer.json")) ? model_dir : "byte";
  std::string source;
  auto tok = OpenTokenizer(spec, &source);
  if (!tok.ok()) return Fail(tok.status());
  try {
    auto model = LoadModelMaybeAdapter(model_dir);  // a LoRA checkpoint: base + adapter
    if (!model.ok()) return Fail(model.status());
    CausalLM m = *model;
    m->ToDevice(plan->device);
    m->eval();
    std::vector<int32_t> ids = (*tok)->Encode(prompt, /*parse_special=*/true);
    if (ids.empty()) return Fail(InvalidArgumentError("--prompt is empty"));
    GenerateOptions opts;
    opts.max_new_tokens = max_new;
    opts.temperature = temperature;
    opts.seed = seed;
    for (int64_t id : m->config().eos_token_ids) opts.stop_ids.push_back(static_cast<int32_t>(id));
    if ((*tok)->eos_id()) opts.stop_ids.push_back(*(*tok)->eos_id());
    auto out = Generate(m, {ids}, opts, *plan);
    std::cout << (*tok)->Decode(out[0], /*skip_special=*/true) << std::endl;
  } catch (const c10::Error& e) {
    return Fail(InternalError(std::string("LibTorch error: ") + e.what_without_backtrace()));
  }
  return 0;
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

  auto* gen = app.add_subcommand("generate", "Continue a prompt with a trained checkpoint");
  std::string model_dir, prompt, device = "auto";
  int64_t max_new = 64;
  double temperature = 0.0;
  uint64_t seed = 0;
  gen->add_option("--model", model_dir, "A checkpoint or HF model folder")->required();
  gen->add_option("--prompt", prompt, "The prompt text")->required();
  gen->add_option("--max-new-tokens", max_new, "Most tokens to generate")->check(CLI::PositiveNumber);
  gen->add_option("--temperature", temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  gen->add_option("--seed", seed, "Sampling seed");
  gen->add_option("--device", device, "auto, cpu, cuda, cuda:N, mps");
  gen->callback([&] { code = RunGenerate(model_dir, prompt, max_new, temperature, seed, device); });

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
  ev->callback([&] { code = RunEval(eval_opts); });

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
