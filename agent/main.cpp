// sftd: the sftctl agent daemon. See agent/serving/daemon.h and docs/agent.md.
#include <malloc.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <map>

#include "agent/serving/daemon.h"
#include "common/cli/duration_option.h"
#include "common/source_id.h"

namespace {

using sftctl::agent::DaemonOptions;
using sftctl::cli::AddDurationOption;
using Unit = sftctl::cli::DurationUnit;

// `sftd start`: where the agent keeps its state, how it listens and runs jobs. `gpus` is set only
// when --gpus is given (`gpus_opt` tells).
CLI::Option* AddStartFlags(CLI::App* start, DaemonOptions& opts, std::string& gpus) {
  start->add_flag("--detach", opts.detach, "run in the background (idempotent: finds a running agent)");
  start->add_option("--data-dir", opts.data_dir,
                    "state, blobs and jobs (default $SFTD_DATA_DIR, "
                    "$XDG_DATA_HOME/sftd or ~/.local/share/sftd)");
  start->add_option("--port", opts.port, "TCP port (0: any free port)");
  start->add_option("--listen", opts.listen, "address to listen on (non-loopback requires TLS)");
  auto* gpus_opt =
      start->add_option("--gpus", gpus, "GPU indices to use, e.g. 0,1 or none (default: nvidia-smi)");
  start->add_option("--trainer", opts.trainer, "trainer binary (default: sftctl-trainer next to sftd)");
  start->add_option("--tls-cert", opts.tls_cert,
                    "PEM certificate chain (required for non-loopback --listen)");
  start->add_option("--tls-key", opts.tls_key, "PEM private key");
  // Time flags take one syntax (common/duration.h): 500ms, 30s, 5m, 2h, 1d, 1h30m; a bare number is seconds.
  AddDurationOption(start, "--kill-grace", Unit::kMilliseconds, &opts.kill_grace_ms,
                    "SIGTERM to SIGKILL grace period when stopping a job (default 10s)");
  AddDurationOption(start, "--poll", Unit::kMilliseconds, &opts.poll_ms,
                    "how often running jobs' output and ranks are checked (default 100ms)");
  start->add_option("--shared-dir", opts.shared_dir,
                    "Slurm login node: the folder on the shared filesystem (seen by every compute node) "
                    "that holds the job folders of `submit --slurm` jobs (docs/slurm.md)");
  AddDurationOption(start, "--slurm-poll", Unit::kMilliseconds, &opts.slurm_poll_ms,
                    "how often Slurm is asked for a Slurm job's state (default 2s)");
  AddDurationOption(start, "--heartbeat", Unit::kSeconds, &opts.heartbeat_s,
                    "default step heartbeat timeout (a job may set its own; default 30m)");
  start->add_option("--cpu-slots", opts.cpu_slots,
                    "CPU ranks that may run at once (default: number of CPUs)");
  start->add_option("--rendezvous-addr", opts.rendezvous_addr,
                    "master_addr that node 0 of a multi-node job reports (default: 127.0.0.1 when "
                    "listening on loopback, else the host name or --listen address)");
  start->add_option("--version-override", opts.version_override, "testing only")->group("");
  start
      ->add_option("--gc-max-store-bytes", opts.gc.max_store_bytes,
                   "collect unused blobs automatically when the blob store holds more (e.g. 50GiB; "
                   "0: no cap)")
      ->transform(CLI::AsSizeValue(false));
  start->add_option("--gc-min-free-pct", opts.gc_min_free_pct,
                    "collect unused blobs automatically when the disk has less free (0: never)");
  AddDurationOption(start, "--gc-job-max-age", Unit::kSeconds, &opts.gc.job_max_age_s,
                    "remove folders of jobs finished longer ago (e.g. 30d; -1: keep them)",
                    /*allow_minus_one=*/true);
  AddDurationOption(start, "--gc-check", Unit::kSeconds, &opts.gc_check_s, "testing only")->group("");
  return gpus_opt;
}

// `sftd start`'s flags for stopping the host (docs/agent.md, "Stopping the host"); the flags given
// are remembered in agent.db.
void AddStopFlags(CLI::App* start, DaemonOptions& opts) {
  // Stopping the host (docs/agent.md, "Stopping the host"); the flags given are remembered in agent.db.
  auto* sp = &opts.stop;
  AddDurationOption(
      start, "--stop-when-idle", Unit::kSeconds, [sp](int64_t v) { sp->idle_s = v; },
      "stop the host after this long with no job and no client contact (e.g. 2h; 0: never)");
  AddDurationOption(
      start, "--stop-grace", Unit::kSeconds, [sp](int64_t v) { sp->grace_s = v; },
      "quiet time after a `submit --stop-when-done` job ended before the host stops (default 1m)");
  AddDurationOption(
      start, "--stop-pull-timeout", Unit::kSeconds, [sp](int64_t v) { sp->pull_timeout_s = v; },
      "longest wait for `sftctl pull` of a stop-when-done job's final checkpoint (default 30m)");
  start->add_option_function<std::string>(
      "--stop-action", [sp](const std::string& v) { sp->action = v; },
      "runpod | lambda | shutdown | command (default: detect RunPod, then Lambda)");
  start->add_option_function<std::string>(
      "--stop-command", [sp](const std::string& v) { sp->command = v; },
      "shell command that stops the host (implies --stop-action command; \"\": none)");
  start->add_option_function<std::string>(
      "--stop-storage", [sp](const std::string& v) { sp->storage = v; },
      "auto | survives | lost: whether the data dir outlives the stop (survives: no wait for pulls)");
  start->add_option_function<double>(
      "--price-per-hour", [sp](double v) { sp->price_per_hour = v; },
      "what the host costs per hour, for the estimate `sftctl status` shows and --max-cost");
  start->add_option_function<double>(
      "--max-cost", [sp](double v) { sp->max_cost = v; },
      "cost cap in USD (needs --price-per-hour): before price x hours since billing began passes it, "
      "every job is cancelled and the host stopped (0: no cap)");
  start->add_option_function<int64_t>(
      "--billing-since", [sp](int64_t v) { sp->billing_since_unix_s = v; },
      "when the host's billing began, Unix seconds (default: the first start of an agent with a price "
      "on this data dir)");
  AddDurationOption(start, "--stop-check", Unit::kMilliseconds, &opts.stop_check_ms, "testing only")
      ->group("");
}

// `sftd gc`: what to collect, into `*req` (which must outlive the parse).
void AddGcFlags(CLI::App* gc, ::sftctl::v1::CollectGarbageRequest* req) {
  sftctl::cli::DurationLimits keep_all;  // --job-max-age -1: keep every job folder
  keep_all.allow_minus_one = true;
  gc->add_flag(
      "--dry-run", [req](int64_t) { req->set_dry_run(true); }, "report, remove nothing");
  AddDurationOption(
      gc, "--blob-max-age", Unit::kSeconds, [req](int64_t v) { req->set_blob_max_age_s(v); },
      "remove unreferenced blobs unused for longer (default 7d)");
  AddDurationOption(
      gc, "--partial-max-age", Unit::kSeconds, [req](int64_t v) { req->set_partial_max_age_s(v); },
      "remove partial uploads untouched for longer (default 2d)");
  AddDurationOption(
      gc, "--job-max-age", Unit::kSeconds, [req](int64_t v) { req->set_job_max_age_s(v); },
      "remove folders of jobs finished longer ago (default 30d; -1: keep them)", keep_all);
  gc->add_option_function<uint64_t>(
        "--max-store-bytes", [req](uint64_t v) { req->set_max_store_bytes(v); },
        "then remove the least recently used unreferenced blobs until the store fits (e.g. 20GiB)")
      ->transform(CLI::AsSizeValue(false));
}

}  // namespace

int main(int argc, char** argv) {
  // Few malloc arenas: gRPC, the pool and the event thread would otherwise each keep their own and
  // hold on to freed chunk buffers (idle RSS matters on a rented host).
  mallopt(M_ARENA_MAX, 2);
  CLI::App app{"sftd: the sftctl agent daemon (runs fine-tuning jobs on this host)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sftd " + sftctl::agent::AgentVersion() + " (source " +
                                        sftctl::ShortSourceId(sftctl::SourceId()) + ")");

  DaemonOptions opts;
  std::string gpus;
  auto* start =
      app.add_subcommand("start", "start the agent (or report the running one) and print SFTD_READY {json}");
  CLI::Option* gpus_opt = AddStartFlags(start, opts, gpus);
  AddStopFlags(start, opts);

  std::string data_dir;
  bool json = false;
  auto* status = app.add_subcommand("status", "is the agent running? (exit 0 yes, 3 no)");
  status->add_option("--data-dir", data_dir, "data dir of the agent");
  status->add_flag("--json", json, "one JSON object");
  bool with_token = false;
  status->add_flag("--with-token", with_token,
                   "with --json: include the agent's token (what sftctl reads over SSH, in one command)");
  int timeout_s = 15;
  auto* stop =
      app.add_subcommand("stop", "stop the agent (running jobs keep running; a restart re-attaches)");
  stop->add_option("--data-dir", data_dir, "data dir of the agent");
  AddDurationOption(stop, "--timeout", Unit::kSeconds, &timeout_s,
                    "wait this long before SIGKILL (default 15s)");
  auto* bridge = app.add_subcommand("bridge", "copy stdin/stdout to and from the agent's TCP socket");
  bridge->add_option("--data-dir", data_dir, "data dir of the agent");

  ::sftctl::v1::CollectGarbageRequest gc_req;
  auto* gc = app.add_subcommand("gc", "remove blobs, partial uploads and old job folders no job needs");
  gc->add_option("--data-dir", data_dir, "data dir of the agent");
  gc->add_flag("--json", json, "one JSON object");
  AddGcFlags(gc, &gc_req);

  CLI11_PARSE(app, argc, argv);
  // stdout carries exactly the one SFTD_READY line; logs go to stderr (sftd.log when detached).
  spdlog::set_default_logger(spdlog::stderr_color_mt("sftd"));
  try {
    if (*start) {
      if (gpus_opt->count() > 0) opts.gpus = gpus;
      return sftctl::agent::RunStart(opts);
    }
    if (*status) return sftctl::agent::RunStatus(data_dir, json, with_token);
    if (*stop) return sftctl::agent::RunStop(data_dir, timeout_s);
    if (*bridge) return sftctl::agent::RunBridge(data_dir);
    if (*gc) return sftctl::agent::RunGc(data_dir, gc_req, json);
  } catch (const std::exception& e) {
    std::cerr << "sftd: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
