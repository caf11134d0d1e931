// sftctl-trainer: the only sftctl binary that links LibTorch. The same binary trains locally
// (exec'd by `sftctl run --local`) and on GPU hosts (spawned by sftd, one per rank).
//
//   sftctl-trainer train --spec RUN/spec.json [--events-fd N]
//   sftctl-trainer generate --model CHECKPOINT --prompt TEXT [--max-new-tokens N] [--temperature T]
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/version.h"
#include "trainer/device.h"
#include "trainer/generate.h"
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
    auto model = LoadModelDir(model_dir);
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

  CLI11_PARSE(app, argc, argv);
  return code;
}
