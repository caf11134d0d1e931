#include "client/commands/spec_flags.h"

#include <iostream>

#include "common/object_store/hub_destination.h"
#include "common/object_store/s3_location.h"
#include "common/spec/hub_path.h"
#include "common/spec/spec_yaml.h"

namespace sftctl::client {
namespace {

// --upload-to / --resume-from (checkpoint.upload_to / resume); `remote`: the host's agent uploads and
// downloads.
void AddBucketFlags(CLI::App* cmd, SpecFlags* f, bool remote) {
  const std::string who = remote ? "Have the host upload" : "Upload";
  cmd->add_option("--upload-to", f->upload_to,
                  who +
                      " each complete checkpoint to s3://BUCKET/PREFIX or the Hub repository hf://ORG/NAME "
                      "while training (checkpoint.upload_to; checkpoint.upload=final: only the last one)");
  cmd->add_option("--resume-from", f->resume_from,
                  remote
                      ? "Continue from the newest complete checkpoint in s3://BUCKET/PREFIX (resume), e.g. a "
                        "run whose host went away; the host downloads it before the job starts"
                      : "Resume from s3://BUCKET/PREFIX (its newest complete checkpoint) or a checkpoint "
                        "folder");
}

// --slurm and the flags of its `slurm:` section (docs/slurm.md); each given one overrides the spec.
void AddSlurmFlags(CLI::App* cmd, SlurmFlags* f) {
  auto* slurm = cmd->add_flag("--slurm", f->slurm,
                              "Run through Slurm: the host is a cluster's login node whose agent has "
                              "--shared-dir; sbatch places the ranks (docs/slurm.md)");
  const char* group = "Slurm (with --slurm; override the spec's slurm: section)";
  auto count = [&](const char* name, std::optional<int64_t>* to, const char* help) {
    auto set = [to](int64_t v) { *to = v; };
    cmd->add_option_function<int64_t>(name, set, help)
        ->check(CLI::PositiveNumber)
        ->needs(slurm)
        ->group(group);
  };
  count("--nodes", &f->nodes, "Nodes (default 1)");
  count("--gpus-per-node", &f->gpus_per_node, "GPUs per node, one rank each (default 0: a CPU job)");
  count("--cpu-ranks-per-node", &f->cpu_ranks_per_node, "CPU ranks per node of a CPU job (default 1)");
  auto text = [&](const char* name, std::optional<std::string>* to, const char* help) {
    auto set = [to](const std::string& v) { *to = v; };
    cmd->add_option_function<std::string>(name, set, help)->needs(slurm)->group(group);
  };
  text("--partition", &f->partition, "Partition (default: the cluster's)");
  text("--account", &f->account, "Account to charge");
  text("--qos", &f->qos, "Quality of service");
  text("--time", &f->time, "Time limit in Slurm's form: 30, 4:00:00, 1-12");
  text("--constraint", &f->constraint, "Node features: a100&ib, v100|a100");
  cmd->add_option("--slurm-arg", f->extra_args, "One more sbatch option, --name[=value] (repeatable)")
      ->needs(slurm)
      ->group(group);
  cmd->add_flag("--no-requeue", f->no_requeue, "Do not requeue after a preemption or node failure")
      ->needs(slurm)
      ->group(group);
}

// The host's agent uploads and downloads: what it would refuse later is refused now.
Status CheckRemoteBucketFlags(const SpecFlags& f) {
  if (!f.resume_from.empty()) {  // resume: s3://... (docs/object-storage.md)
    SFT_RETURN_IF_ERROR(ParseS3Url(f.resume_from).status().WithContext("--resume-from"));
  }
  if (!f.upload_to.empty()) {  // checkpoint.upload_to (docs/object-storage.md, docs/hub.md)
    const Status bad = IsHubPath(f.upload_to) ? ParseHubUploadTarget(f.upload_to).status()
                                              : ParseS3Url(f.upload_to).status();
    SFT_RETURN_IF_ERROR(bad.WithContext("--upload-to"));
  }
  return OkStatus();
}

void AddSlurmOverrides(const SlurmFlags& f, std::vector<std::string>* out) {
  if (f.slurm) out->push_back("slurm+={}");  // on, keeping the spec's own slurm: fields
  for (const auto& [field, flag] : {std::pair{"nodes", &f.nodes},
                                    {"gpus_per_node", &f.gpus_per_node},
                                    {"cpu_ranks_per_node", &f.cpu_ranks_per_node}}) {
    if (*flag) out->push_back(std::string("slurm.") + field + "=" + std::to_string(**flag));
  }
  for (const auto& [field, flag] : {std::pair{"partition", &f.partition},
                                    {"account", &f.account},
                                    {"qos", &f.qos},
                                    {"time", &f.time},
                                    {"constraint", &f.constraint}}) {
    if (*flag) out->push_back(std::string("slurm.") + field + "=" + YamlQuoted(**flag));
  }
  for (const std::string& arg : f.extra_args) out->push_back("slurm.extra_args+=" + YamlQuoted(arg));
  if (f.no_requeue) out->push_back("slurm.requeue=false");
}

}  // namespace

void AddSpecFlags(CLI::App* cmd, SpecCommand command, SpecFlags* f) {
  const bool remote = command == SpecCommand::kSubmit;
  if (remote) {
    cmd->add_option("--name", f->name, "Job name (default: the spec's name)");
  } else {
    cmd->add_option("-o,--output", f->output_dir, "Run folder (overrides the spec's output_dir)");
  }
  cmd->add_option("--max-steps", f->max_steps, "Override train.max_steps")->check(CLI::PositiveNumber);
  cmd->add_option("--device", f->device, "Override device: auto, cpu, cuda, cuda:N, mps");
  cmd->add_option("--precision", f->precision, "Override precision: auto, fp32, bf16, fp16 (CUDA)");
  cmd->add_option("--seed", f->seed, "Override the seed")->check(CLI::NonNegativeNumber);
  cmd->add_option("--set", f->sets, "Override any spec field: --set train.lr=1e-4 (repeatable)")
      ->allow_extra_args(false);
  AddBucketFlags(cmd, f, remote);
  cmd->add_flag("--dry-run", f->dry_run,
                remote ? "Print the job spec that would be sent (canonical JSON, every flag applied) and "
                         "exit without connecting"
                       : "Print the job spec the run would use (canonical JSON, every flag applied) and "
                         "exit without training");
  if (remote) AddSlurmFlags(cmd, &f->slurm);
}

StatusOr<std::vector<std::string>> SpecOverrides(SpecCommand command, const SpecFlags& f) {
  if (command == SpecCommand::kSubmit) SFT_RETURN_IF_ERROR(CheckRemoteBucketFlags(f));
  std::vector<std::string> out = f.sets;
  auto text = [&out](const char* field, const std::string& value) {
    if (!value.empty()) out.push_back(std::string(field) + "=" + YamlQuoted(value));
  };
  text("output_dir", f.output_dir);
  text("name", f.name);
  if (f.max_steps > 0) out.push_back("train.max_steps=" + std::to_string(f.max_steps));
  text("device", f.device);
  text("precision", f.precision);
  if (f.seed >= 0) out.push_back("seed=" + std::to_string(f.seed));
  text("checkpoint.upload_to", f.upload_to);
  text("resume", f.resume_from);
  AddSlurmOverrides(f.slurm, &out);
  return out;
}

void PrintDryRunSpec(const nlohmann::json& spec) { std::cout << spec.dump(2) << std::endl; }

}  // namespace sftctl::client
