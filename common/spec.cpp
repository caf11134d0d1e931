#include "common/spec.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/hub_path.h"

namespace sftctl {
namespace {

using nlohmann::json;

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const char* TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "a mapping";
}

// Reads the fields of one JSON object, remembering which keys were consumed, so that
// unknown keys can be reported with a "did you mean" suggestion.
class ObjectReader {
 public:
  ObjectReader(const json& obj, std::string prefix, const FieldLocator& locate)
      : obj_(obj), prefix_(std::move(prefix)), locate_(locate) {}

  std::string Path(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

  Status Error(const std::string& key, const std::string& problem) const {
    std::string path = Path(key);
    std::string where = locate_ ? locate_(path) : std::string();
    return FieldError(where, path, problem);
  }

  const json* Get(const std::string& key) {
    known_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status Int(const std::string& key, int64_t* out, int64_t min_value) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    // A float counts when it is a whole number in int64's range (casting one outside it is undefined).
    if (v->is_number_float() && v->get<double>() >= -0x1p63 && v->get<double>() < 0x1p63 &&
        v->get<double>() == std::trunc(v->get<double>())) {
      *out = static_cast<int64_t>(v->get<double>());
    } else if (v->is_number_integer() || v->is_number_unsigned()) {
      *out = v->get<int64_t>();
    } else {
      return Error(key, std::string("must be an integer, got ") + TypeName(*v));
    }
    if (*out < min_value)
      return Error(key, "must be >= " + std::to_string(min_value) + ", got " + std::to_string(*out));
    return OkStatus();
  }

  Status Double(const std::string& key, double* out, double min_value, double max_value) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_number()) return Error(key, std::string("must be a number, got ") + TypeName(*v));
    *out = v->get<double>();
    if (!(*out >= min_value && *out <= max_value)) {
      return Error(key, "must be in [" + Num(min_value) + ", " + Num(max_value) + "], got " + Num(*out));
    }
    return OkStatus();
  }

  Status Bool(const std::string& key, bool* out) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_boolean()) return Error(key, std::string("must be true or false, got ") + TypeName(*v));
    *out = v->get<bool>();
    return OkStatus();
  }

  Status String(const std::string& key, std::string* out) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_string()) return Error(key, std::string("must be a string, got ") + TypeName(*v));
    *out = v->get<std::string>();
    return OkStatus();
  }

  Status Choice(const std::string& key, std::string* out, const std::vector<std::string>& choices) {
    SFT_RETURN_IF_ERROR(String(key, out));
    if (std::find(choices.begin(), choices.end(), *out) != choices.end()) return OkStatus();
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    return Error(key, "must be one of " + list + ", got '" + *out + "'");
  }

  // A file list: a single string or a list of strings.
  Status Files(const std::string& key, std::vector<std::string>* out, const std::string& base_dir) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    out->clear();
    if (v->is_string()) {
      out->push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const auto& e : *v) {
        if (!e.is_string()) return Error(key, std::string("must list file names, found ") + TypeName(e));
        out->push_back(e.get<std::string>());
      }
    } else {
      return Error(key, std::string("must be a file name or a list of file names, got ") + TypeName(*v));
    }
    for (auto& f : *out) f = Resolve(f, base_dir);
    return OkStatus();
  }

  // A nested object; `present` tells whether it was given.
  Status Object(const std::string& key, const json** out) {
    *out = Get(key);
    if (*out != nullptr && !(*out)->is_object())
      return Error(key, std::string("must be a mapping, got ") + TypeName(**out));
    return OkStatus();
  }

  // Reports the first key that no reader asked for.
  Status CheckNoUnknown() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (known_.count(it.key())) continue;
      std::string best;
      size_t best_d = 3;
      for (const auto& k : known_) {
        size_t d = EditDistance(it.key(), k);
        if (d < best_d) best_d = d, best = k;
      }
      return Error(it.key(), "unknown field" +
                                 (best.empty() ? std::string() : " (did you mean '" + Path(best) + "'?)"));
    }
    return OkStatus();
  }

  static std::string Resolve(const std::string& p, const std::string& base_dir) {
    if (p.empty() || base_dir.empty() || p[0] == '/' || IsHubPath(p)) return p;
    return (std::filesystem::path(base_dir) / p).lexically_normal().string();
  }

 private:
  static std::string Num(double d) {
    std::ostringstream os;
    os << d;
    return os.str();
  }

  const json& obj_;
  std::string prefix_;
  const FieldLocator& locate_;
  std::set<std::string> known_;
};

}  // namespace

StatusOr<JobSpec> ParseSpec(const json& j, const std::string& base_dir, const FieldLocator& locate) {
  if (!j.is_object()) {
    std::string where = locate ? locate("") : std::string();
    return InvalidArgumentError((where.empty() ? "" : where + ": ") +
                                "a job spec must be a mapping of fields");
  }
  JobSpec s;
  ObjectReader top(j, "", locate);
  SFT_RETURN_IF_ERROR(top.String("name", &s.name));
  SFT_RETURN_IF_ERROR(top.String("output_dir", &s.output_dir));
  s.output_dir = ObjectReader::Resolve(s.output_dir, base_dir);
  SFT_RETURN_IF_ERROR(top.String("resume", &s.resume));
  // s3:// is fetched into the run folder by the client or the agent before the trainer starts.
  if (s.resume != "auto" && s.resume != "never" && s.resume.rfind("s3://", 0) != 0)
    s.resume = ObjectReader::Resolve(s.resume, base_dir);
  SFT_RETURN_IF_ERROR(top.Int("seed", &s.seed, 0));
  SFT_RETURN_IF_ERROR(top.Bool("deterministic", &s.deterministic));
  SFT_RETURN_IF_ERROR(top.String("device", &s.device));
  if (!(s.device == "auto" || s.device == "cpu" || s.device == "mps" || s.device.rfind("cuda", 0) == 0)) {
    return top.Error("device", "must be auto, cpu, cuda, cuda:N or mps, got '" + s.device + "'");
  }
  SFT_RETURN_IF_ERROR(top.Choice("precision", &s.precision, {"auto", "fp32", "bf16", "fp16"}));
  SFT_RETURN_IF_ERROR(top.Int("threads", &s.threads, 0));
  SFT_RETURN_IF_ERROR(top.String("tokenizer", &s.tokenizer));
  if (s.tokenizer != "auto" && s.tokenizer != "byte")
    s.tokenizer = ObjectReader::Resolve(s.tokenizer, base_dir);

  const json* model = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("model", &model));
  if (model == nullptr) return top.Error("model", "is required (give model.path or model.config)");
  {
    ObjectReader r(*model, "model", locate);
    SFT_RETURN_IF_ERROR(r.String("path", &s.model.path));
    s.model.path = ObjectReader::Resolve(s.model.path, base_dir);
    const json* config = nullptr;
    SFT_RETURN_IF_ERROR(r.Object("config", &config));
    if (config != nullptr) s.model.config = *config;
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
    if (s.model.path.empty() == (config == nullptr)) {
      return r.Error("path",
                     "give exactly one of model.path (a Hugging Face folder) or model.config (from scratch)");
    }
  }

  const json* data = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("data", &data));
  if (data == nullptr) return top.Error("data", "is required (data.train lists JSONL files)");
  {
    ObjectReader r(*data, "data", locate);
    SFT_RETURN_IF_ERROR(r.Files("train", &s.data.train, base_dir));
    if (s.data.train.empty()) return r.Error("train", "is required: list at least one JSONL file");
    SFT_RETURN_IF_ERROR(r.Files("eval", &s.data.eval, base_dir));
    SFT_RETURN_IF_ERROR(r.Double("eval_fraction", &s.data.eval_fraction, 0.0, 0.5));
    SFT_RETURN_IF_ERROR(
        r.Choice("format", &s.data.format, {"auto", "text", "prompt_completion", "messages"}));
    SFT_RETURN_IF_ERROR(r.Int("max_seq_len", &s.data.max_seq_len, 2));
    SFT_RETURN_IF_ERROR(r.String("chat_template", &s.data.chat_template));
    if (s.data.chat_template.empty()) return r.Error("chat_template", "must not be empty");
    if (s.data.chat_template != "auto" && s.data.chat_template != "chatml" &&
        s.data.chat_template != "qwen3" && s.data.chat_template != "llama3") {
      s.data.chat_template = ObjectReader::Resolve(s.data.chat_template, base_dir);
    }
    SFT_RETURN_IF_ERROR(r.Bool("packing", &s.data.packing));
    SFT_RETURN_IF_ERROR(r.Int("max_samples", &s.data.max_samples, 0));
    SFT_RETURN_IF_ERROR(r.Int("max_eval_samples", &s.data.max_eval_samples, 0));
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
  }

  const json* train = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("train", &train));
  if (train != nullptr) {
    ObjectReader r(*train, "train", locate);
    TrainSpec& t = s.train;
    SFT_RETURN_IF_ERROR(r.Int("batch_size", &t.batch_size, 1));
    SFT_RETURN_IF_ERROR(r.Int("grad_accum", &t.grad_accum, 1));
    SFT_RETURN_IF_ERROR(r.Double("lr", &t.lr, 0.0, 10.0));
    if (t.lr <= 0) return r.Error("lr", "must be > 0");
    SFT_RETURN_IF_ERROR(r.Double("min_lr_ratio", &t.min_lr_ratio, 0.0, 1.0));
    SFT_RETURN_IF_ERROR(r.Choice("schedule", &t.schedule, {"cosine", "linear", "constant"}));
    SFT_RETURN_IF_ERROR(r.Int("warmup_steps", &t.warmup_steps, 0));
    SFT_RETURN_IF_ERROR(r.Double("weight_decay", &t.weight_decay, 0.0, 10.0));
    SFT_RETURN_IF_ERROR(r.Double("beta1", &t.beta1, 0.0, 0.999999));
    SFT_RETURN_IF_ERROR(r.Double("beta2", &t.beta2, 0.0, 0.999999));
    SFT_RETURN_IF_ERROR(r.Double("eps", &t.eps, 0.0, 1.0));
    SFT_RETURN_IF_ERROR(r.Double("clip_grad_norm", &t.clip_grad_norm, 0.0, 1e9));
    SFT_RETURN_IF_ERROR(r.Int("epochs", &t.epochs, 1));
    SFT_RETURN_IF_ERROR(r.Int("max_steps", &t.max_steps, 0));
    SFT_RETURN_IF_ERROR(r.Int("max_bad_steps", &t.max_bad_steps, 1));
    SFT_RETURN_IF_ERROR(r.Int("log_interval", &t.log_interval, 1));
    SFT_RETURN_IF_ERROR(r.Bool("gradient_checkpointing", &t.gradient_checkpointing));
    SFT_RETURN_IF_ERROR(r.Int("loss_chunk_tokens", &t.loss_chunk_tokens, 0));
    SFT_RETURN_IF_ERROR(r.Bool("skip_memory_check", &t.skip_memory_check));
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
  }

  const json* eval = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("eval", &eval));
  if (eval != nullptr) {
    ObjectReader r(*eval, "eval", locate);
    SFT_RETURN_IF_ERROR(r.Int("interval", &s.eval.interval, 0));
    SFT_RETURN_IF_ERROR(r.Int("batch_size", &s.eval.batch_size, 1));
    SFT_RETURN_IF_ERROR(r.Bool("exact_match", &s.eval.exact_match));
    SFT_RETURN_IF_ERROR(r.Int("max_new_tokens", &s.eval.max_new_tokens, 1));
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
  }

  const json* ckpt = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("checkpoint", &ckpt));
  if (ckpt != nullptr) {
    ObjectReader r(*ckpt, "checkpoint", locate);
    SFT_RETURN_IF_ERROR(r.Int("interval", &s.checkpoint.interval, 0));
    SFT_RETURN_IF_ERROR(r.Int("keep", &s.checkpoint.keep, 1));
    SFT_RETURN_IF_ERROR(r.Double("save_timeout_s", &s.checkpoint.save_timeout_s, 1.0, 7 * 86400.0));
    SFT_RETURN_IF_ERROR(r.String("upload_to", &s.checkpoint.upload_to));
    SFT_RETURN_IF_ERROR(r.String("endpoint_url", &s.checkpoint.endpoint_url));
    SFT_RETURN_IF_ERROR(r.String("region", &s.checkpoint.region));
    const std::string& up = s.checkpoint.upload_to;
    if (!up.empty() && (up.rfind("s3://", 0) != 0 || up.size() == 5 || up[5] == '/'))
      return r.Error("upload_to", "must be s3://BUCKET[/PREFIX], got '" + up + "'");
    const std::string& ep = s.checkpoint.endpoint_url;
    if (!ep.empty() && ep.rfind("http://", 0) != 0 && ep.rfind("https://", 0) != 0)
      return r.Error("endpoint_url", "must be an http:// or https:// URL, got '" + ep + "'");
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
  }
  const json* lora = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("lora", &lora));
  if (lora != nullptr) {
    ObjectReader r(*lora, "lora", locate);
    LoraSpec l;
    SFT_RETURN_IF_ERROR(r.Int("r", &l.r, 1));
    SFT_RETURN_IF_ERROR(r.Double("alpha", &l.alpha, 0.0, 1e6));
    if (l.alpha <= 0) return r.Error("alpha", "must be > 0");
    SFT_RETURN_IF_ERROR(r.Double("dropout", &l.dropout, 0.0, 0.99));
    SFT_RETURN_IF_ERROR(r.Bool("use_rslora", &l.use_rslora));
    SFT_RETURN_IF_ERROR(r.Choice("base_dtype", &l.base_dtype, {"auto", "fp32", "bf16"}));
    static const std::vector<std::string> kModules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                      "gate_proj", "up_proj", "down_proj"};
    if (const json* t = r.Get("target_modules"); t != nullptr) {
      l.target_modules.clear();
      if (t->is_string() && t->get<std::string>() == "all-linear") {
        l.target_modules = kModules;
      } else if (t->is_array() && !t->empty()) {
        for (const auto& e : *t) {
          if (!e.is_string())
            return r.Error("target_modules", std::string("must list module names, found ") + TypeName(e));
          const std::string m = e.get<std::string>();
          if (std::find(kModules.begin(), kModules.end(), m) == kModules.end()) {
            return r.Error("target_modules",
                           "'" + m +
                               "' is not a projection of llama/qwen2/qwen3/mistral (q_proj, k_proj, v_proj, "
                               "o_proj, gate_proj, up_proj, down_proj)");
          }
          if (std::find(l.target_modules.begin(), l.target_modules.end(), m) == l.target_modules.end())
            l.target_modules.push_back(m);
        }
      } else {
        return r.Error("target_modules", std::string("must be a non-empty list of module names or "
                                                     "'all-linear', got ") +
                                             TypeName(*t));
      }
    }
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
    s.lora = l;
  }
  const json* dist = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("distributed", &dist));
  if (dist != nullptr) {
    ObjectReader r(*dist, "distributed", locate);
    SFT_RETURN_IF_ERROR(r.Double("timeout_s", &s.distributed.timeout_s, 1.0, 86400.0));
    SFT_RETURN_IF_ERROR(r.Double("bucket_mb", &s.distributed.bucket_mb, 0.0, 4096.0));
    if (s.distributed.bucket_mb <= 0) return r.Error("bucket_mb", "must be > 0");
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
  }
  const json* metrics = nullptr;
  SFT_RETURN_IF_ERROR(top.Object("metrics", &metrics));
  if (metrics != nullptr) {
    ObjectReader r(*metrics, "metrics", locate);
    SFT_RETURN_IF_ERROR(r.Bool("tensorboard", &s.metrics.tensorboard));
    SFT_RETURN_IF_ERROR(r.Double("gpu_peak_tflops", &s.metrics.gpu_peak_tflops, 0.0, 1e6));
    SFT_RETURN_IF_ERROR(r.CheckNoUnknown());
  }
  if (const json* hosts = top.Get("hosts"); hosts != nullptr) {
    if (!hosts->is_array())
      return top.Error("hosts", std::string("must be a list of host names, got ") + TypeName(*hosts));
    for (const auto& h : *hosts) {
      if (!h.is_string())
        return top.Error("hosts", std::string("must list host names, found ") + TypeName(h));
      if (h.get<std::string>().empty()) return top.Error("hosts", "host names must not be empty");
      s.hosts.push_back(h.get<std::string>());
    }
  }
  SFT_RETURN_IF_ERROR(top.CheckNoUnknown());

  if (s.name.empty()) s.name = "run";
  if (s.output_dir.empty()) s.output_dir = ObjectReader::Resolve("runs/" + s.name, base_dir);
  return s;
}

json ToJson(const JobSpec& s) {
  json model = json::object();
  if (!s.model.path.empty()) model["path"] = s.model.path;
  if (!s.model.config.is_null()) model["config"] = s.model.config;
  const TrainSpec& t = s.train;
  json lora;  // null: no LoRA
  if (s.lora) {
    lora = {{"r", s.lora->r},
            {"alpha", s.lora->alpha},
            {"dropout", s.lora->dropout},
            {"target_modules", s.lora->target_modules},
            {"use_rslora", s.lora->use_rslora}};
    if (s.lora->base_dtype != "auto") lora["base_dtype"] = s.lora->base_dtype;
  }
  json out = json{
      {"name", s.name},
      {"output_dir", s.output_dir},
      {"resume", s.resume},
      {"seed", s.seed},
      {"device", s.device},
      {"precision", s.precision},
      {"threads", s.threads},
      {"tokenizer", s.tokenizer},
      {"model", model},
      {"data",
       {{"train", s.data.train},
        {"eval", s.data.eval},
        {"eval_fraction", s.data.eval_fraction},
        {"format", s.data.format},
        {"max_seq_len", s.data.max_seq_len},
        {"chat_template", s.data.chat_template},
        {"packing", s.data.packing}}},
      {"train",
       {{"batch_size", t.batch_size},
        {"grad_accum", t.grad_accum},
        {"lr", t.lr},
        {"min_lr_ratio", t.min_lr_ratio},
        {"schedule", t.schedule},
        {"warmup_steps", t.warmup_steps},
        {"weight_decay", t.weight_decay},
        {"beta1", t.beta1},
        {"beta2", t.beta2},
        {"eps", t.eps},
        {"clip_grad_norm", t.clip_grad_norm},
        {"epochs", t.epochs},
        {"max_steps", t.max_steps},
        {"max_bad_steps", t.max_bad_steps},
        {"log_interval", t.log_interval},
        {"gradient_checkpointing", t.gradient_checkpointing}}},
      {"eval",
       {{"interval", s.eval.interval},
        {"batch_size", s.eval.batch_size},
        {"exact_match", s.eval.exact_match},
        {"max_new_tokens", s.eval.max_new_tokens}}},
      {"checkpoint", {{"interval", s.checkpoint.interval}, {"keep", s.checkpoint.keep}}},
  };
  out["lora"] = lora;
  // Knobs added later appear only when set, so an older agent's trainer still takes the spec.
  if (s.data.max_samples > 0) out["data"]["max_samples"] = s.data.max_samples;
  if (s.data.max_eval_samples > 0) out["data"]["max_eval_samples"] = s.data.max_eval_samples;
  if (t.loss_chunk_tokens != 0) out["train"]["loss_chunk_tokens"] = t.loss_chunk_tokens;
  if (t.skip_memory_check) out["train"]["skip_memory_check"] = true;
  if (s.deterministic) out["deterministic"] = true;
  if (s.checkpoint.save_timeout_s != CheckpointSpec().save_timeout_s)
    out["checkpoint"]["save_timeout_s"] = s.checkpoint.save_timeout_s;
  if (!s.checkpoint.upload_to.empty()) out["checkpoint"]["upload_to"] = s.checkpoint.upload_to;
  if (!s.checkpoint.endpoint_url.empty()) out["checkpoint"]["endpoint_url"] = s.checkpoint.endpoint_url;
  if (!s.checkpoint.region.empty()) out["checkpoint"]["region"] = s.checkpoint.region;
  out["distributed"] = {{"timeout_s", s.distributed.timeout_s}, {"bucket_mb", s.distributed.bucket_mb}};
  if (s.metrics.tensorboard) out["metrics"]["tensorboard"] = true;
  if (s.metrics.gpu_peak_tflops > 0) out["metrics"]["gpu_peak_tflops"] = s.metrics.gpu_peak_tflops;
  out["hosts"] = s.hosts;
  return out;
}

Status CheckSpecFiles(const JobSpec& spec) {
  auto check = [](const std::string& field, const std::string& path) -> Status {
    if (IsHubPath(path)) return OkStatus();  // downloaded before the trainer starts (common/hub_spec.h)
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      return NotFoundError("field '" + field + "': file '" + path + "' does not exist");
    if (!S_ISREG(st.st_mode))
      return InvalidArgumentError("field '" + field + "': '" + path + "' is not a regular file");
    return OkStatus();
  };
  for (const auto& f : spec.data.train) SFT_RETURN_IF_ERROR(check("data.train", f));
  for (const auto& f : spec.data.eval) SFT_RETURN_IF_ERROR(check("data.eval", f));
  if (!spec.model.path.empty() && !IsHubPath(spec.model.path)) {
    SFT_RETURN_IF_ERROR(check("model.path", spec.model.path + "/config.json"));
  }
  return OkStatus();
}

}  // namespace sftctl
