#include "trainer/tools/generate_command.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "common/os/file_system.h"
#include "trainer/model/generate.h"
#include "trainer/runtime/device.h"
#include "trainer/tools/hf_tools.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using nlohmann::json;

// eos_token_id of <dir>/generation_config.json (absent file: none).
StatusOr<std::vector<int32_t>> GenerationConfigEos(const std::string& dir) {
  FileSystem* fs = FileSystem::Default();
  const std::string path = JoinPath(dir, "generation_config.json");
  std::vector<int32_t> ids;
  if (!fs->Exists(path)) return ids;
  SFT_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(path));
  SFT_ASSIGN_OR_RETURN(json j, ParseJson(text, path));
  const json eos = j.is_object() && j.contains("eos_token_id") ? j["eos_token_id"] : json();
  if (eos.is_null()) return ids;
  for (const json& e : eos.is_array() ? eos : json::array({eos})) {
    if (!e.is_number_integer())
      return FieldError(path, "eos_token_id", "must be an integer or a list of integers");
    ids.push_back(e.get<int32_t>());
  }
  return ids;
}

struct GenerationResult {
  GenerationPrompt prompt;
  Generation generation;
  std::string text;  // decoded, cut at the first stop string
};

// Loads the model and tokenizer, reads the prompts and generates for all of them.
StatusOr<std::vector<GenerationResult>> GenerateAll(const GenerateCommandOptions& o, bool need_reference) {
  SFT_ASSIGN_OR_RETURN(DevicePlan plan, InferencePlan(o.device));
  JobSpec spec;
  spec.model.path = o.model_dir;
  spec.tokenizer = o.tokenizer;
  std::string source;
  SFT_ASSIGN_OR_RETURN(auto tok, OpenTokenizer(spec, &source));
  PromptOptions popt = o.prompts;
  popt.tokenizer_dir = source == "byte" ? o.model_dir : source;
  popt.need_reference = need_reference;
  PromptReader reader(*tok, popt);
  std::vector<GenerationPrompt> prompts;
  if (!o.prompts_file.empty()) {
    SFT_ASSIGN_OR_RETURN(prompts, reader.ReadFile(o.prompts_file));
  } else {
    SFT_ASSIGN_OR_RETURN(GenerationPrompt p, reader.FromText(o.prompt, "--prompt"));
    prompts.push_back(std::move(p));
  }
  SFT_ASSIGN_OR_RETURN(CausalLM model, LoadModelMaybeAdapter(o.model_dir, o.adapter_dir, plan.device));
  model->ToDevice(plan.device);
  model->eval();

  GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  g.sampling = o.sampling;
  g.seed = o.seed;
  g.batch_size = o.batch_size;
  g.use_cache = o.use_cache;
  SFT_ASSIGN_OR_RETURN(g.stop_ids, GenerationConfigEos(o.model_dir));
  for (int64_t id : model->config().eos_token_ids) g.stop_ids.push_back(static_cast<int32_t>(id));
  if (tok->eos_id()) g.stop_ids.push_back(*tok->eos_id());
  g.stop_strings = o.stop;
  g.detokenize = [&tok](const std::vector<int32_t>& ids) { return tok->Decode(ids, /*skip_special=*/false); };
  std::vector<std::vector<int32_t>> ids;
  for (const GenerationPrompt& p : prompts) ids.push_back(p.ids);
  std::vector<Generation> gens = Generate(model, ids, g, plan);

  std::vector<GenerationResult> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::string text = CutAtStopString(tok->Decode(gens[i].tokens, /*skip_special=*/true), o.stop);
    out.push_back({std::move(prompts[i]), std::move(gens[i]), std::move(text)});
  }
  return out;
}

json ResultJson(size_t index, const GenerationResult& r) {
  json j = {{"index", index}, {"prompt", r.prompt.text}};
  if (r.prompt.reference) j["reference"] = *r.prompt.reference;
  j["generation"] = r.text;
  j["tokens"] = r.generation.tokens.size();
  j["stop_reason"] = StopReasonName(r.generation.stop);
  return j;
}

std::string Line(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

std::string Trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

}  // namespace

Status RunGenerateCommand(const GenerateCommandOptions& o, std::ostream& out) {
  SFT_ASSIGN_OR_RETURN(std::vector<GenerationResult> results, GenerateAll(o, /*need_reference=*/false));
  if (o.prompts_file.empty() && o.output.empty()) {
    out << results[0].text << std::endl;
    return OkStatus();
  }
  std::string lines;
  for (size_t i = 0; i < results.size(); ++i) lines += Line(ResultJson(i, results[i]));
  if (o.output.empty()) {
    out << lines << std::flush;
    return OkStatus();
  }
  return WriteFileAtomic(FileSystem::Default(), o.output, lines);
}

MatchScore ScoreGeneration(const std::string& generation, const std::string& reference) {
  const std::string gen = Trim(generation), ref = Trim(reference);
  return {gen == ref, !ref.empty() && gen.find(ref) != std::string::npos};
}

StatusOr<GenerationEvalReport> EvalGenerations(const GenerateCommandOptions& o,
                                               const std::string& samples_out) {
  SFT_ASSIGN_OR_RETURN(std::vector<GenerationResult> results, GenerateAll(o, /*need_reference=*/true));
  GenerationEvalReport report;
  std::string lines;
  for (size_t i = 0; i < results.size(); ++i) {
    const MatchScore s = ScoreGeneration(results[i].text, *results[i].prompt.reference);
    ++report.samples;
    report.exact += s.exact;
    report.contains += s.contains;
    json j = ResultJson(i, results[i]);
    j["exact_match"] = s.exact;
    j["contains"] = s.contains;
    lines += Line(j);
  }
  if (!samples_out.empty()) SFT_RETURN_IF_ERROR(WriteFileAtomic(FileSystem::Default(), samples_out, lines));
  return report;
}

}  // namespace sftctl::trainer
