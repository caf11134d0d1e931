#include "agent/slurm/slurm_options.h"

#include <cctype>
#include <string_view>

namespace sftctl::agent::slurm {
namespace {

bool AllOf(std::string_view s, std::string_view extra) {
  for (char c : s) {
    const bool ok =
        std::isalnum(static_cast<unsigned char>(c)) != 0 || extra.find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool Digits(std::string_view s, size_t max_len) {
  return !s.empty() && s.size() <= max_len && s.find_first_not_of("0123456789") == std::string_view::npos;
}

// "A:B:C" split on ':' into at most three all-digit parts; returns the count, 0 when malformed.
int ClockParts(std::string_view s) {
  int parts = 0;
  for (;;) {
    const size_t colon = s.find(':');
    if (!Digits(s.substr(0, colon), 6) || ++parts > 3) return 0;
    if (colon == std::string_view::npos) return parts;
    s.remove_prefix(colon + 1);
  }
}

Status Check(bool ok, const std::string& where, const std::string& field, const std::string& problem) {
  return ok ? Status() : FieldError(where.empty() ? "slurm" : where + ": slurm", field, problem);
}

Status CheckName(const std::string& value, const std::string& where, const std::string& field,
                 std::string_view extra) {
  return Check(value.size() <= 128 && AllOf(value, extra), where, field,
               "'" + value + "' is not a Slurm name (letters, digits and " + std::string(extra) + ")");
}

}  // namespace

bool IsSlurmTime(const std::string& time) {
  if (time == "UNLIMITED" || time == "INFINITE" || time == "unlimited" || time == "infinite") return true;
  const size_t dash = time.find('-');
  if (dash == std::string::npos) return ClockParts(time) > 0;  // M, M:S, H:M:S
  if (!Digits(std::string_view(time).substr(0, dash), 4)) return false;
  return ClockParts(std::string_view(time).substr(dash + 1)) > 0;  // D-H, D-H:M, D-H:M:S
}

Status ValidateSlurmOptions(const SlurmOptions& o, const std::string& where) {
  SFT_RETURN_IF_ERROR(Check(o.nodes >= 1 && o.nodes <= 1024, where, "nodes",
                            std::to_string(o.nodes) + " is not within 1..1024"));
  SFT_RETURN_IF_ERROR(Check(o.gpus_per_node <= 64, where, "gpus_per_node",
                            std::to_string(o.gpus_per_node) + " is not within 0..64"));
  SFT_RETURN_IF_ERROR(Check(o.cpu_ranks_per_node >= 1 && o.cpu_ranks_per_node <= 64, where,
                            "cpu_ranks_per_node",
                            std::to_string(o.cpu_ranks_per_node) + " is not within 1..64"));
  SFT_RETURN_IF_ERROR(CheckName(o.partition, where, "partition", "_.-,"));
  SFT_RETURN_IF_ERROR(CheckName(o.account, where, "account", "_.-"));
  SFT_RETURN_IF_ERROR(CheckName(o.qos, where, "qos", "_.-"));
  SFT_RETURN_IF_ERROR(Check(o.time.empty() || IsSlurmTime(o.time), where, "time",
                            "'" + o.time + "' is not a Slurm time (M, H:M:S, D-H:M:S, UNLIMITED)"));
  SFT_RETURN_IF_ERROR(CheckName(o.constraint, where, "constraint", "_.-&|,*[]():"));
  for (const std::string& arg : o.extra_args) {
    const bool ok = arg.size() > 2 && arg.size() <= 256 && arg.compare(0, 2, "--") == 0 &&
                    arg.find_first_of(" \t\r\n'\"\\`$") == std::string::npos;
    SFT_RETURN_IF_ERROR(Check(ok, where, "slurm_args",
                              "'" + arg +
                                  "' is not one sbatch option (--name or --name=value, no spaces "
                                  "or quotes)"));
    const std::string name = arg.substr(0, arg.find('='));
    SFT_RETURN_IF_ERROR(Check(name != "--export" && name != "--export-file" && name != "--get-user-env",
                              where, "slurm_args",
                              "'" + arg +
                                  "' would change the job's environment, which the agent sets itself (the "
                                  "rank allowlist, docs/slurm.md)"));
  }
  return Status();
}

}  // namespace sftctl::agent::slurm
