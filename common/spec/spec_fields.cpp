#include "common/spec/spec_fields.h"

#include <cmath>
#include <sstream>
#include <utility>

#include "common/spec/upload_to.h"

namespace sftctl {
namespace {

// The member a leaf field parses into (its section exists when this is called).
#define SPEC_MEMBER(m) [](JobSpec& s) -> SpecValue { return &s.m; }

// Builds one SpecField: the table below reads as one chain per field.
class Def {
 public:
  Def(std::string name, SpecKind kind, SpecValue (*value)(JobSpec&)) {
    f_.name = std::move(name);
    f_.kind = kind;
    f_.value = value;
  }
  Def& Min(int64_t v) {
    f_.int_min = v;
    return *this;
  }
  Def& Range(double lo, double hi) {
    f_.min = lo;
    f_.max = hi;
    return *this;
  }
  Def& AboveMin() {
    f_.above_min = true;
    return *this;
  }
  Def& Choices(std::vector<std::string> c) {
    f_.choices = std::move(c);
    return *this;
  }
  Def& Check(std::string (*check)(const std::string&)) {
    f_.check = check;
    return *this;
  }
  Def& NonEmpty() {
    f_.non_empty = true;
    return *this;
  }
  Def& Path(std::vector<std::string> keep = {}) {
    f_.is_path = true;
    f_.keep = std::move(keep);
    return *this;
  }
  Def& Hub(SpecHub what) {
    f_.hub = what;
    return *this;
  }
  Def& Items(std::string item, std::string items) {
    f_.item = std::move(item);
    f_.items = std::move(items);
    return *this;
  }
  Def& OneStringOk() {
    f_.one_string_ok = true;
    return *this;
  }
  Def& ListNonEmpty() {
    f_.list_non_empty = true;
    return *this;
  }
  Def& ItemsNonEmpty() {
    f_.items_non_empty = true;
    return *this;
  }
  Def& Dedupe() {
    f_.dedupe = true;
    return *this;
  }
  Def& AllAlias(std::string alias, std::string choice_problem) {
    f_.all_alias = std::move(alias);
    f_.choice_problem = std::move(choice_problem);
    return *this;
  }
  Def& Required(std::string problem) {
    f_.required = std::move(problem);
    return *this;
  }
  Def& WhenSet() {
    f_.emit = SpecEmit::kUnlessDefault;
    return *this;
  }
  Def& Optional(bool (*present)(const JobSpec&), void (*enable)(JobSpec&), bool null_when_absent) {
    f_.present = present;
    f_.enable = enable;
    f_.null_when_absent = null_when_absent;
    return *this;
  }
  Def& Fields(const std::vector<SpecField>* fields) {
    f_.fields = fields;
    return *this;
  }
  Def& SectionCheck(std::string (*check)(const JobSpec&), std::string at) {
    f_.section_check = check;
    f_.check_at = std::move(at);
    return *this;
  }
  Def& Default(std::string text) {
    f_.default_doc = std::move(text);
    return *this;
  }
  Def& Doc(std::string text) {
    f_.doc = std::move(text);
    return *this;
  }
  operator SpecField() const { return f_; }  // NOLINT: the table's rows convert implicitly

 private:
  SpecField f_;
};

Def Int(std::string name, SpecValue (*v)(JobSpec&), int64_t min) {
  return std::move(Def(std::move(name), SpecKind::kInt, v).Min(min));
}
Def Number(std::string name, SpecValue (*v)(JobSpec&), double lo, double hi) {
  return std::move(Def(std::move(name), SpecKind::kNumber, v).Range(lo, hi));
}
Def Bool(std::string name, SpecValue (*v)(JobSpec&)) { return Def(std::move(name), SpecKind::kBool, v); }
Def String(std::string name, SpecValue (*v)(JobSpec&)) { return Def(std::move(name), SpecKind::kString, v); }
Def List(std::string name, SpecValue (*v)(JobSpec&)) { return Def(std::move(name), SpecKind::kList, v); }
Def Section(std::string name, const std::vector<SpecField>& fields) {
  Def d(std::move(name), SpecKind::kSection, nullptr);
  return std::move(d.Fields(&fields));
}

std::string DeviceProblem(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "mps" || d.rfind("cuda", 0) == 0) return "";
  return "must be auto, cpu, cuda, cuda:N or mps, got '" + d + "'";
}

// checkpoint.upload_to's rules are written once, in common/spec/upload_to.h.
std::string UploadToProblem(const std::string& up) {
  if (ReadUploadTo(up).ok()) return "";
  return "must be s3://BUCKET[/PREFIX] or hf://ORG/NAME[@REVISION] (a model repository), got '" + up + "'";
}

std::string EndpointProblem(const std::string& ep) {
  if (ep.empty() || ep.rfind("http://", 0) == 0 || ep.rfind("https://", 0) == 0) return "";
  return "must be an http:// or https:// URL, got '" + ep + "'";
}

std::string ModelProblem(const JobSpec& s) {
  if (s.model.path.empty() != s.model.config.is_null()) return "";
  return "give exactly one of model.path (a Hugging Face folder) or model.config (from scratch)";
}

const std::vector<SpecField>& ModelFields() {
  static const std::vector<SpecField> kFields = {
      String("path", SPEC_MEMBER(model.path))
          .Path()
          .Hub(SpecHub::kModel)
          .WhenSet()
          .Default("—")
          .Doc("a Hugging Face model folder (config.json + model.safetensors), or a Hub model "
               "`hf://ORG/NAME[@REVISION][/PATH]` downloaded before training ([hub.md](hub.md))"),
      Def("config", SpecKind::kJson, SPEC_MEMBER(model.config))
          .WhenSet()
          .Default("—")
          .Doc(
              "an inline config.json for a from-scratch model (`model_type` llama, qwen2, qwen3 (needs "
              "`head_dim`), mistral, gemma2, gemma3_text or phi3; `vocab_size` defaults to the tokenizer's). "
              "Exactly one of `path` / `config`"),
  };
  return kFields;
}

const std::vector<SpecField>& DataFields() {
  static const std::vector<SpecField> kFields = {
      List("train", SPEC_MEMBER(data.train))
          .Items("file name", "file names")
          .OneStringOk()
          .Path()
          .Hub(SpecHub::kFile)
          .Required("is required: list at least one JSONL file")
          .Default("required")
          .Doc("a JSONL file or a list of them; a Hub file is `hf://datasets/ORG/NAME[@REVISION]/FILE` "
               "([hub.md](hub.md))"),
      List("eval", SPEC_MEMBER(data.eval))
          .Items("file name", "file names")
          .OneStringOk()
          .Path()
          .Hub(SpecHub::kFile)
          .Doc("held-out JSONL files (local or hf://)"),
      Number("eval_fraction", SPEC_MEMBER(data.eval_fraction), 0.0, 0.5)
          .Doc("without `data.eval`: the fraction of training samples held out (seeded)"),
      String("format", SPEC_MEMBER(data.format))
          .Choices({"auto", "text", "prompt_completion", "messages"})
          .Doc("`auto`: per file, from its first record"),
      Int("max_seq_len", SPEC_MEMBER(data.max_seq_len), 2)
          .Doc("longer samples are truncated; samples left with no trained token are dropped and counted"),
      String("chat_template", SPEC_MEMBER(data.chat_template))
          .NonEmpty()
          .Path({"auto", "chatml", "qwen3", "llama3"})
          .Doc("how `messages` are rendered: `auto` (the tokenizer's `chat_template`, run by sftctl's Jinja "
               "interpreter), `chatml`, `qwen3`, `llama3` (built-in renderings, no template file), or a file "
               "(a Jinja chat template or a `tokenizer_config.json`)"),
      Bool("packing", SPEC_MEMBER(data.packing))
          .Doc("pack the samples of each micro-batch into shared rows of `max_seq_len` tokens (attention "
               "blocked between samples)"),
      Int("max_samples", SPEC_MEMBER(data.max_samples), 0)
          .WhenSet()
          .Default("`0` (all)")
          .Doc("keep only the first N samples of `data.train` (file order, before `eval_fraction`); later "
               "lines and files are not read. For smoke tests: `--set data.max_samples=100`"),
      Int("max_eval_samples", SPEC_MEMBER(data.max_eval_samples), 0)
          .WhenSet()
          .Default("`0` (all)")
          .Doc("the same for `data.eval`"),
  };
  return kFields;
}

const std::vector<SpecField>& TrainFields() {
  static const std::vector<SpecField> kFields = {
      Int("batch_size", SPEC_MEMBER(train.batch_size), 1)
          .Doc("sequences per micro-batch, per rank (the global batch is `batch_size` × ranks)"),
      Int("grad_accum", SPEC_MEMBER(train.grad_accum), 1).Doc("micro-batches per optimizer step"),
      Number("lr", SPEC_MEMBER(train.lr), 0.0, 10.0).AboveMin().Doc("peak learning rate"),
      Number("min_lr_ratio", SPEC_MEMBER(train.min_lr_ratio), 0.0, 1.0)
          .Doc("final lr = lr × ratio (cosine, linear)"),
      String("schedule", SPEC_MEMBER(train.schedule))
          .Choices({"cosine", "linear", "constant"})
          .Doc("the learning-rate schedule after warm-up"),
      Int("warmup_steps", SPEC_MEMBER(train.warmup_steps), 0).Doc("linear warm-up steps"),
      Number("weight_decay", SPEC_MEMBER(train.weight_decay), 0.0, 10.0)
          .Doc("AdamW decoupled decay on 2-D weights (not norms, biases, embeddings)"),
      Number("beta1", SPEC_MEMBER(train.beta1), 0.0, 0.999999).Doc("AdamW"),
      Number("beta2", SPEC_MEMBER(train.beta2), 0.0, 0.999999).Doc("AdamW"),
      Number("eps", SPEC_MEMBER(train.eps), 0.0, 1.0).Doc("AdamW"),
      Number("clip_grad_norm", SPEC_MEMBER(train.clip_grad_norm), 0.0, 1e9)
          .Doc("global gradient-norm clip; 0 disables"),
      Int("epochs", SPEC_MEMBER(train.epochs), 1)
          .Doc("passes over the training data (ignored when `max_steps` > 0)"),
      Int("max_steps", SPEC_MEMBER(train.max_steps), 0).Doc("optimizer steps; > 0 overrides `epochs`"),
      Int("max_bad_steps", SPEC_MEMBER(train.max_bad_steps), 1)
          .Doc("consecutive non-finite steps (skipped) before the run stops with an error"),
      Int("log_interval", SPEC_MEMBER(train.log_interval), 1)
          .Doc("steps between log lines when not on a terminal"),
      Bool("gradient_checkpointing", SPEC_MEMBER(train.gradient_checkpointing))
          .Doc("activation checkpointing per decoder layer: keep only each layer's input and recompute its "
               "activations in backward (same loss and gradients; less activation memory for one more "
               "forward of the layers — `bench/grad_checkpoint`)"),
      Int("loss_chunk_tokens", SPEC_MEMBER(train.loss_chunk_tokens), 0)
          .WhenSet()
          .Doc("rows per chunk of the loss head's cross-entropy: the logits of one chunk exist at a time, "
               "recomputed in backward (same loss and gradients). `0`: automatic, chunks of about 64 MiB of "
               "fp32 logits when the vocabulary has 32,000 tokens or more (Qwen's 151,936: 110 rows), none "
               "below; a batch with no more labelled positions than one chunk takes the plain path "
               "([memory.md](memory.md))"),
      Bool("skip_memory_check", SPEC_MEMBER(train.skip_memory_check))
          .WhenSet()
          .Doc("train even when the memory estimate says the plan does not fit ([memory.md](memory.md))"),
  };
  return kFields;
}

const std::vector<SpecField>& EvalFields() {
  static const std::vector<SpecField> kFields = {
      Int("interval", SPEC_MEMBER(eval.interval), 0).Doc("steps between evaluations; 0: only at the end"),
      Int("batch_size", SPEC_MEMBER(eval.batch_size), 1).Doc("evaluation batch size"),
      Bool("exact_match", SPEC_MEMBER(eval.exact_match))
          .Doc("greedy-decode each prompt and report exact match of the completion (end token included)"),
      Int("max_new_tokens", SPEC_MEMBER(eval.max_new_tokens), 1)
          .Doc("longest completion generated for exact match"),
  };
  return kFields;
}

const std::vector<SpecField>& CheckpointFields() {
  static const std::vector<SpecField> kFields = {
      Int("interval", SPEC_MEMBER(checkpoint.interval), 0)
          .Doc("steps between checkpoints; 0: only at the end"),
      Int("keep", SPEC_MEMBER(checkpoint.keep), 1).Doc("complete checkpoints kept (the newest)"),
      Number("save_timeout_s", SPEC_MEMBER(checkpoint.save_timeout_s), 1.0, 7 * 86400.0)
          .WhenSet()
          .Doc("multi-rank jobs: how long the other ranks wait for rank 0 to write a checkpoint, or to read "
               "one when resuming; `distributed.timeout_s` does not bound these waits"),
      String("upload_to", SPEC_MEMBER(checkpoint.upload_to))
          .Check(UploadToProblem)
          .WhenSet()
          .Doc(
              "`s3://BUCKET/PREFIX`: each complete checkpoint (and `metrics.jsonl`, `spec.json`) is uploaded "
              "there while training continues, `MANIFEST.json` last; `keep` holds in the bucket too "
              "([object-storage.md](object-storage.md)); or `hf://ORG/NAME`: a Hub model repository, one "
              "commit per checkpoint ([hub.md](hub.md))"),
      String("upload", SPEC_MEMBER(checkpoint.upload))
          .Choices({"all", "final"})
          .WhenSet()
          .Doc("with `upload_to`: `all` sends every complete checkpoint while training continues; `final` "
               "only the run's last one, when it ends (on the Hub, its model files at the repository's "
               "root, so `from_pretrained(\"ORG/NAME\")` loads it)"),
      String("endpoint_url", SPEC_MEMBER(checkpoint.endpoint_url))
          .Check(EndpointProblem)
          .WhenSet()
          .Doc("S3-compatible endpoint (R2, B2, MinIO, GCS, ...), `http://` or `https://`; empty: AWS S3"),
      String("region", SPEC_MEMBER(checkpoint.region))
          .WhenSet()
          .Doc("signing region; empty: `AWS_REGION`/`AWS_DEFAULT_REGION`, else `us-east-1`"),
  };
  return kFields;
}

const std::vector<SpecField>& LoraFields() {
  static const std::vector<SpecField> kFields = {
      Int("r", SPEC_MEMBER(lora->r), 1).Doc("adapter rank"),
      Number("alpha", SPEC_MEMBER(lora->alpha), 0.0, 1e6)
          .AboveMin()
          .Doc("`lora_alpha`: the update is scaled by alpha / r"),
      Number("dropout", SPEC_MEMBER(lora->dropout), 0.0, 0.99).Doc("dropout on the adapter's input"),
      Bool("use_rslora", SPEC_MEMBER(lora->use_rslora))
          .Doc("scale by alpha / sqrt(r) (rank-stabilised LoRA)"),
      String("base_dtype", SPEC_MEMBER(lora->base_dtype))
          .Choices({"auto", "fp32", "bf16"})
          .WhenSet()
          .Doc("storage of the frozen base weights: `auto` (bf16 on CUDA and MPS, fp32 on CPU); adapters, "
               "their optimizer state and the saved adapter files stay fp32 ([memory.md](memory.md))"),
      List("target_modules", SPEC_MEMBER(lora->target_modules))
          .Items("module name", "module names")
          .Choices({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
          .AllAlias("all-linear", "is not a projection of llama/qwen2/qwen3/mistral/gemma/phi3")
          .ListNonEmpty()
          .Dedupe()
          .Doc("projections to adapt; `all-linear`: all seven (phi3 fuses them as PEFT does: `q_proj`, "
               "`k_proj` or `v_proj` adapt its `qkv_proj`, `gate_proj` or `up_proj` its `gate_up_proj`)"),
  };
  return kFields;
}

const std::vector<SpecField>& DistributedFields() {
  static const std::vector<SpecField> kFields = {
      Number("timeout_s", SPEC_MEMBER(distributed.timeout_s), 1.0, 86400.0)
          .Doc("multi-rank jobs: the rendezvous and every collective; a dead or hung rank makes the others "
               "fail after at most this long"),
      Number("bucket_mb", SPEC_MEMBER(distributed.bucket_mb), 0.0, 4096.0)
          .AboveMin()
          .Doc("multi-rank jobs: gradient all-reduce bucket size in MB, overlapped with backward"),
      String("shard", SPEC_MEMBER(distributed.shard))
          .Choices({"none", "optimizer", "gradients"})
          .WhenSet()
          .Doc(
              "multi-rank jobs: `none`: every rank holds all gradients and AdamW moments; `optimizer` "
              "(ZeRO-1): "
              "each rank keeps the moments of its 1/N of the parameters, updates that part and all-gathers "
              "the weights; `gradients` (ZeRO-2): also only its 1/N of the gradients, each bucket reduced to "
              "the ranks that own it. Same results as `none`; a single rank ignores it "
              "([distributed.md](distributed.md), [memory.md](memory.md))"),
  };
  return kFields;
}

const std::vector<SpecField>& MetricsFields() {
  static const std::vector<SpecField> kFields = {
      Bool("tensorboard", SPEC_MEMBER(metrics.tensorboard))
          .WhenSet()
          .Doc("also write every scalar of metrics.jsonl as TensorBoard event files into `<run>/tb/` "
               "([observability.md](observability.md))"),
      Number("gpu_peak_tflops", SPEC_MEMBER(metrics.gpu_peak_tflops), 0.0, 1e6)
          .WhenSet()
          .Doc("the GPU's dense bf16 peak in TFLOP/s used for MFU; `0`: the trainer's table of common GPUs "
               "(no MFU for a GPU it does not know)"),
      Bool("phase_times", SPEC_MEMBER(metrics.phase_times))
          .WhenSet()
          .Doc(
              "add `forward_ms`, `loss_ms`, `backward_ms` and `optimizer_ms` to every step record: where the "
              "step's time goes (CUDA events on a GPU, the host clock elsewhere; micro-batches summed; "
              "[observability.md](observability.md))"),
  };
  return kFields;
}

const std::vector<SpecField>& SlurmFields() {
  static const std::vector<SpecField> kFields = {
      Int("nodes", SPEC_MEMBER(slurm->nodes), 0).Doc("nodes the job runs on"),
      Int("gpus_per_node", SPEC_MEMBER(slurm->gpus_per_node), 0)
          .Doc("> 0: a GPU job, one rank per GPU; 0: a CPU job"),
      Int("cpu_ranks_per_node", SPEC_MEMBER(slurm->cpu_ranks_per_node), 0).Doc("a CPU job's ranks per node"),
      String("partition", SPEC_MEMBER(slurm->partition)).Doc("empty: the cluster's default partition"),
      String("account", SPEC_MEMBER(slurm->account)).Doc("empty: the user's default account"),
      String("qos", SPEC_MEMBER(slurm->qos)).Doc("empty: the default QOS"),
      String("time", SPEC_MEMBER(slurm->time))
          .Doc("time limit in one of sbatch's forms (`30`, `4:00:00`, `1-12`); empty: the partition's limit"),
      String("constraint", SPEC_MEMBER(slurm->constraint))
          .Doc("a node feature expression (`a100&ib`); empty: none"),
      List("extra_args", SPEC_MEMBER(slurm->extra_args))
          .Items("sbatch option", "sbatch options")
          .Doc("more sbatch options, each `--name[=value]`"),
      Bool("requeue", SPEC_MEMBER(slurm->requeue))
          .Doc("preemption and a failed node put the job back in the queue; it resumes from its newest "
               "checkpoint"),
  };
  return kFields;
}

}  // namespace

const std::vector<SpecField>& SpecFields() {
  static const std::vector<SpecField> kFields = {
      String("name", SPEC_MEMBER(name)).Default("the file's stem").Doc("run name"),
      String("output_dir", SPEC_MEMBER(output_dir))
          .Path()
          .Default("`runs/<name>`")
          .Doc("the run folder (spec.json, metrics.jsonl, checkpoints)"),
      String("resume", SPEC_MEMBER(resume))
          .Path({"auto", "never", "s3://"})
          .Doc("`auto`: continue from the newest complete checkpoint in `output_dir`; `never`; a checkpoint "
               "folder; or `s3://BUCKET/PREFIX`: the newest complete checkpoint there, downloaded into the "
               "run folder first ([object-storage.md](object-storage.md))"),
      Int("seed", SPEC_MEMBER(seed), 0).Doc("initialisation and data order"),
      Bool("deterministic", SPEC_MEMBER(deterministic))
          .WhenSet()
          .Doc("deterministic kernels: LibTorch's deterministic algorithms, cuDNN autotuning off, "
               "`CUBLAS_WORKSPACE_CONFIG=:4096:8`; makes a resumed CUDA run bit-identical to an "
               "uninterrupted one, at some speed cost (CPU runs are deterministic already; "
               "[precision.md](precision.md))"),
      String("device", SPEC_MEMBER(device))
          .Check(DeviceProblem)
          .Doc("`auto` (CUDA, else MPS, else CPU), `cpu`, `cuda`, `cuda:N`, `mps`"),
      String("precision", SPEC_MEMBER(precision))
          .Choices({"auto", "fp32", "bf16", "fp16"})
          .Doc("`auto`: CUDA: bf16 on compute capability 8.0+, fp16 with dynamic loss scaling below it, e.g. "
               "T4 and V100; MPS: fp32; CPU: bf16 where the CPU has native bf16, else fp32. `fp16`: CUDA "
               "only"),
      Int("threads", SPEC_MEMBER(threads), 0)
          .Doc("LibTorch CPU threads; 0 = all cores (divided by the ranks on the host in a multi-rank job)"),
      String("tokenizer", SPEC_MEMBER(tokenizer))
          .Path({"auto", "byte"})
          .Hub(SpecHub::kTokenizer)
          .Doc("`auto` (the model folder's tokenizer.json, else `byte`), `byte`, or a folder with "
               "tokenizer.json"),
      Section("model", ModelFields())
          .Required("is required (give model.path or model.config)")
          .SectionCheck(ModelProblem, "path"),
      Section("data", DataFields()).Required("is required (data.train lists JSONL files)"),
      Section("train", TrainFields()),
      Section("eval", EvalFields()),
      Section("checkpoint", CheckpointFields()),
      Section("lora", LoraFields())
          .Optional([](const JobSpec& s) { return s.lora.has_value(); }, [](JobSpec& s) { s.lora.emplace(); },
                    /*null_when_absent=*/true)
          .Default("absent")
          .Doc("present (even `lora: {}`): train LoRA adapters on frozen base weights instead of all "
               "weights; checkpoints hold a PEFT adapter ([hf-compat.md](hf-compat.md))"),
      Section("distributed", DistributedFields()),
      Section("metrics", MetricsFields()).WhenSet(),
      List("hosts", SPEC_MEMBER(hosts))
          .Items("host name", "host names")
          .ItemsNonEmpty()
          .Doc("SSH host names of a multi-node job, read by the client; the trainer ignores it"),
      Section("slurm", SlurmFields())
          .Optional([](const JobSpec& s) { return s.slurm.has_value(); },
                    [](JobSpec& s) { s.slurm.emplace(); }, /*null_when_absent=*/false)
          .Default("absent")
          .Doc("present: a Slurm job — the agent submits the ranks with sbatch (`sftctl submit --slurm`, "
               "whose flags override these fields; [slurm.md](slurm.md)); the values are checked by the "
               "agent; the trainer ignores the section"),
  };
  return kFields;
}

#undef SPEC_MEMBER

const SpecField* FindSpecField(const std::string& path) {
  const std::vector<SpecField>* fields = &SpecFields();
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const SpecField* found = nullptr;
    for (const auto& f : *fields) {
      if (f.name == key) found = &f;
    }
    if (found == nullptr || dot == std::string::npos) return found;
    if (found->kind != SpecKind::kSection) return nullptr;
    fields = found->fields;
    start = dot + 1;
  }
}

const JobSpec& SpecDefaults() {
  static const JobSpec kDefaults = [] {
    JobSpec d;
    for (const auto& f : SpecFields()) {
      if (f.enable != nullptr) f.enable(d);
    }
    return d;
  }();
  return kDefaults;
}

namespace {

// 0.0002, 1e-08, 604800, 1000000000: whole numbers in full, others as the shortest %g.
std::string DocNumber(double d) {
  if (d == std::trunc(d) && std::fabs(d) < 1e15) return std::to_string(static_cast<int64_t>(d));
  std::ostringstream os;
  os << d;
  return os.str();
}

std::string Ticked(const std::vector<std::string>& values, const std::string& sep) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "`" : sep + "`") + v + "`";
  return out;
}

std::string TypeText(const SpecField& f) {
  switch (f.kind) {
    case SpecKind::kInt:
      return "integer >= " + std::to_string(f.int_min);
    case SpecKind::kNumber:
      return std::string("number in ") + (f.above_min ? "(" : "[") + DocNumber(f.min) + ", " +
             DocNumber(f.max) + "]";
    case SpecKind::kBool:
      return "true/false";
    case SpecKind::kString:
      if (!f.choices.empty()) return "one of " + Ticked(f.choices, ", ");
      return f.is_path ? "path" : "string";
    case SpecKind::kList: {
      std::string t = f.one_string_ok ? "a " + f.item + " or a list of " + f.items : "list of " + f.items;
      if (!f.all_alias.empty()) t += " (" + Ticked(f.choices, ", ") + ") or `" + f.all_alias + "`";
      return t;
    }
    case SpecKind::kJson:
    case SpecKind::kSection:
      return "mapping";
  }
  return "";
}

std::string DefaultText(const SpecField& f) {
  if (!f.default_doc.empty()) return f.default_doc;
  JobSpec& d = const_cast<JobSpec&>(SpecDefaults());  // read only: the accessor points into it
  return std::visit(
      [](auto* v) -> std::string {
        using T = std::decay_t<decltype(*v)>;
        if constexpr (std::is_same_v<T, int64_t>) return "`" + std::to_string(*v) + "`";
        if constexpr (std::is_same_v<T, double>) return "`" + DocNumber(*v) + "`";
        if constexpr (std::is_same_v<T, bool>) return *v ? "`true`" : "`false`";
        if constexpr (std::is_same_v<T, std::string>) return v->empty() ? "`\"\"`" : "`" + *v + "`";
        if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          std::string list;
          for (const auto& e : *v) list += (list.empty() ? "" : ", ") + e;
          return "`[" + list + "]`";
        }
        return "—";
      },
      f.value(d));
}

void AddRows(const std::vector<SpecField>& fields, const std::string& prefix,
             std::vector<SpecFieldRow>* rows) {
  for (const auto& f : fields) {
    const std::string path = prefix + f.name;
    if (f.kind != SpecKind::kSection || !f.doc.empty()) {
      rows->push_back(
          {path, TypeText(f), f.kind == SpecKind::kSection ? f.default_doc : DefaultText(f), f.doc});
    }
    if (f.kind == SpecKind::kSection) AddRows(*f.fields, path + ".", rows);
  }
}

}  // namespace

std::vector<SpecFieldRow> SpecFieldRows() {
  std::vector<SpecFieldRow> rows;
  AddRows(SpecFields(), "", &rows);
  return rows;
}

std::string SpecFieldsMarkdown() {
  std::string out = "| field | type | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const auto& r : SpecFieldRows()) {
    out += "| `" + r.path + "` | " + r.type + " | " + r.default_value + " | " + r.doc + " |\n";
  }
  return out;
}

}  // namespace sftctl
