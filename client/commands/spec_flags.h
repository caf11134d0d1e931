// The flags that change a job spec, of `run` and `submit` (and so `resubmit`), defined once. Each flag
// given becomes a `--set FIELD=VALUE` override (common/spec/spec_yaml.h), appended after the command's
// own --set ones, and the command loads its spec once with that one list (LoadSpecFile(path,
// overrides), LoadRemoteSpec): a flag means the same in every command, a dedicated flag wins over a
// --set of the same field, and a bad value reads like a bad --set ("command line: field 'device': ...").
//
//   run and submit:  --set, --max-steps, --device, --precision, --seed, --upload-to, --resume-from,
//                    --dry-run (print the spec the flags make and exit)
//   run only:        -o/--output (output_dir; a remote job's folder is the agent's)
//   submit only:     --name, --slurm and the flags of its `slurm:` section (docs/slurm.md)
//
// Thread safety: AddSpecFlags and the parse on one thread (CLI11's rules); the rest is pure.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client {

enum class SpecCommand { kRun, kSubmit };

// `submit --slurm` and its flags; a flag left unset keeps the spec's `slurm:` value (CLI11 refuses one
// given without --slurm).
struct SlurmFlags {
  bool slurm = false;
  std::optional<int64_t> nodes, gpus_per_node, cpu_ranks_per_node;
  std::optional<std::string> partition, account, qos, time, constraint;
  std::vector<std::string> extra_args;  // --slurm-arg: after the spec's extra_args
  bool no_requeue = false;
};

// What the flags hold after the parse; an empty string, 0 max_steps and -1 seed: not given.
struct SpecFlags {
  std::vector<std::string> sets;  // --set FIELD=VALUE, in the order given
  std::string output_dir;         // run: -o
  std::string name;               // submit: --name
  int64_t max_steps = 0;
  std::string device, precision;
  int64_t seed = -1;
  std::string upload_to, resume_from;
  SlurmFlags slurm;  // submit
  bool dry_run = false;
};

// Adds `command`'s spec flags to `cmd`, stored into `flags` (REQUIRES: `flags` outlives the parse).
void AddSpecFlags(CLI::App* cmd, SpecCommand command, SpecFlags* flags);

// The overrides `flags` make: the --set ones as given, then one per flag given (string values quoted,
// so they stay exactly as typed). For kSubmit, --upload-to (s3:// or an hf:// model repository) and
// --resume-from (s3:// only: the host downloads it) are checked first; errors are INVALID_ARGUMENT
// "--upload-to: ..." / "--resume-from: ...".
StatusOr<std::vector<std::string>> SpecOverrides(SpecCommand command, const SpecFlags& flags);

// --dry-run's output: the spec the command would run or send (canonical JSON, 2-space indent, a final
// newline) on stdout.
void PrintDryRunSpec(const nlohmann::json& spec);

}  // namespace sftctl::client
