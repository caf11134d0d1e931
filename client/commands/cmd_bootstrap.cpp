// `sftctl bootstrap --host H`: build, install and start this sftctl's agent and trainer on a GPU host
// (client/bootstrap/bootstrap.h; docs/remote.md, "A fresh host").
#include <iostream>

#include "client/bootstrap/bootstrap.h"
#include "client/commands/commands.h"
#include "client/remote/remote_options.h"
#include "common/cli/duration_option.h"

namespace sftctl::client {
namespace {

struct BootstrapArgs {
  RemoteOptions ro;
  BootstrapOptions bo;
  bool no_install_deps = false, no_smoke = false, no_systemd = false;
  std::string stop_when_idle, stop_action;
  std::string shared_dir;  // --shared-dir: a Slurm login node's folder for job folders (docs/slurm.md)
  double price_per_hour = 0;
  double max_cost = 0;
  int64_t billing_since = 0;
};

int RunBootstrap(const BootstrapArgs& a) {
  if (a.ro.hosts.empty())
    return ReportError(InvalidArgumentError("give the host: --host [user@]host[:port]"), false);
  const std::string& host = a.ro.hosts.front();
  if (IsLocalAgentHost(host)) {
    return ReportError(InvalidArgumentError("bootstrap sets up a remote host over SSH; for this machine use "
                                            "deploy/setup.sh (or `sftctl run --local`)"),
                       false);
  }
  auto opts = MakeConnectOptions(a.ro, host);
  if (!opts.ok()) return ReportError(opts.status(), false);
  BootstrapOptions bo = a.bo;
  bo.install_deps = !a.no_install_deps;
  bo.smoke = !a.no_smoke;
  bo.systemd = !a.no_systemd;
  if (!a.stop_when_idle.empty())
    bo.agent_args.insert(bo.agent_args.end(), {"--stop-when-idle", a.stop_when_idle});
  if (!a.stop_action.empty()) bo.agent_args.insert(bo.agent_args.end(), {"--stop-action", a.stop_action});
  if (!a.shared_dir.empty()) bo.agent_args.insert(bo.agent_args.end(), {"--shared-dir", a.shared_dir});
  if (a.price_per_hour > 0) {
    bo.agent_args.insert(bo.agent_args.end(), {"--price-per-hour", std::to_string(a.price_per_hour)});
  }
  if (a.max_cost > 0) bo.agent_args.insert(bo.agent_args.end(), {"--max-cost", std::to_string(a.max_cost)});
  if (a.billing_since > 0) {
    bo.agent_args.insert(bo.agent_args.end(), {"--billing-since", std::to_string(a.billing_since)});
  }
  auto r = Bootstrap(*opts, bo);
  if (!r.ok()) return ReportError(r.status(), false);
  return kExitOk;
}

}  // namespace

void RegisterBootstrapCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<BootstrapArgs>();
  auto* cmd = app.add_subcommand(
      "bootstrap", "Build, install and start this sftctl's agent and trainer on a GPU host over SSH");
  AddRemoteOptions(cmd, &a->ro, "Host to set up: [user@]host[:port] or an ssh config alias");
  cmd->remove_option(cmd->get_option("--json"));  // bootstrap reports progress lines, no JSON
  cmd->add_flag("--no-install-deps", a->no_install_deps,
                "Do not apt-get install missing packages (fail listing them instead)");
  auto* no_smoke = cmd->add_flag("--no-smoke", a->no_smoke, "Skip the smoke job after installing");
  auto* agent_only = cmd->add_flag(
      "--agent-only", a->bo.agent_only,
      "Build and install sftd only, no trainer (no LibTorch needed): a login node, or a host whose "
      "sftctl-trainer is installed another way; no smoke job");
  cmd->add_flag("--install-torch", a->bo.install_torch,
                "Where the host has no usable PyTorch: install it into a venv of sftctl's own there "
                "(a CUDA wheel matching the GPU driver; needs the host to reach download.pytorch.org)")
      ->excludes(agent_only);
  cmd->add_flag("--smoke", a->bo.smoke_always, "Run the smoke job even when the host is already up to date")
      ->excludes(no_smoke)
      ->excludes(agent_only);
  cmd->add_option("--smoke-steps", a->bo.smoke_steps, "Steps of the smoke job (default 20)")
      ->check(CLI::Range(1, 100000));
  cmd->add_flag("--force", a->bo.force,
                "Run the host-side build and install even when the host is up to date");
  cmd->add_flag("--no-systemd", a->no_systemd, "Start sftd detached even where PID 1 is systemd");
  cmd->add_option("--jobs", a->bo.jobs, "Parallel build jobs on the host (default: its core count)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("-v,--verbose", a->bo.verbose, "Show every line of the host-side log");
  cmd->add_option("--stop-when-idle", a->stop_when_idle,
                  "Start the agent with --stop-when-idle DURATION (e.g. 2h): the host stops itself when idle")
      ->type_name("DURATION")  // sftd's syntax, checked before connecting
      ->check(cli::DurationValidator(cli::DurationUnit::kSeconds));
  cmd->add_option("--stop-action", a->stop_action,
                  "Start the agent with --stop-action (runpod, lambda, shutdown)");
  cmd->add_option("--shared-dir", a->shared_dir,
                  "Start the agent with --shared-dir DIR: a Slurm login node, DIR on the filesystem the "
                  "compute nodes share (`submit --slurm`, docs/slurm.md)");
  cmd->add_option("--price-per-hour", a->price_per_hour,
                  "Start the agent with --price-per-hour (cost estimates)")
      ->check(CLI::Range(0.0, 10000.0));
  cmd->add_option("--max-cost", a->max_cost,
                  "Start the agent with --max-cost USD: it cancels its jobs and stops the host before the "
                  "host's cost passes it (needs a price: --price-per-hour, now or before)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_option(
         "--billing-since", a->billing_since,
         "Start the agent with --billing-since UNIX_SECONDS: when the host's billing began (default: "
         "the agent's first start with a price)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->callback([a, &ctx] { ctx.exit_code = RunBootstrap(*a); });
}

}  // namespace sftctl::client
