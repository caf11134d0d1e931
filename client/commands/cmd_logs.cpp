// `sftctl logs JOB [-f] [--tail N]`: a job's rank output and metrics, resumed across dropped
// connections.
// With -f it waits for the job to end and exits with its final state (0 SUCCEEDED, 1 FAILED,
// 3 CANCELLED). A multi-node job shows node 0 (where global rank 0 runs).
#include <iostream>

#include "client/commands/commands.h"
#include "client/metrics/tensorboard_export.h"
#include "client/remote/job_target.h"
#include "client/remote/job_usage.h"
#include "client/remote/log_follower.h"

namespace sftctl::client {
namespace {

struct LogsArgs {
  RemoteOptions ro;
  std::string job;
  bool follow = false;
  uint64_t after_seq = 0;
  uint64_t tail = 0;        // 0: from after_seq on
  std::string tensorboard;  // --tensorboard DIR (client/metrics/tensorboard_export.h)
};

int Logs(const LogsArgs& a) {
  JobRegistry registry;
  auto rec = ResolveJob(a.job, a.ro, registry);
  if (!rec.ok()) return ReportError(rec.status(), a.ro.json);
  const NodeRecord& node = rec->nodes.front();
  auto rc = ConnectNode(node);
  if (!rc.ok()) return ReportError(rc.status(), a.ro.json);
  auto result = !a.tensorboard.empty()
                    ? FollowToTensorBoard(rc->get(), node.id, a.after_seq, a.follow, a.ro.json, a.tensorboard)
                : a.tail > 0 ? PrintEventsTail(rc->get(), node.id, a.tail, a.follow, a.ro.json)
                             : PrintEvents(rc->get(), node.id, a.after_seq, a.follow, a.ro.json);
  NoteReconnects(**rc);
  if (!result.ok()) return ReportError(result.status(), a.ro.json);
  if (!a.follow) return kExitOk;
  const v1::JobState state = result->final_state.value_or(v1::FAILED);
  if (!a.ro.json) {
    const auto usage = FetchJobUsage(rc->get(), node.id);  // client/remote/job_usage.h
    std::cerr << rec->Ref() << ": " << StateName(state) << (usage ? "; " + UsageText(*usage) : "") << "\n";
  }
  return ExitCodeForState(state);
}

}  // namespace

void RegisterLogsCommand(CLI::App& app, CommandContext& ctx) {
  auto a = std::make_shared<LogsArgs>();
  auto* cmd = app.add_subcommand("logs", "Show a job's output and metrics (-f: follow until it ends)");
  cmd->add_option("job", a->job, "JOB, HOST/JOB or a job name (see `sftctl list`)")->required();
  cmd->add_flag("-f,--follow", a->follow,
                "Wait for new events until the job ends; exit 0 SUCCEEDED, 1 FAILED, 3 CANCELLED");
  auto* after = cmd->add_option("--after-seq", a->after_seq, "Start after this event number");
  auto* tail = cmd->add_option("-n,--tail", a->tail,
                               "Show only the last N lines (with --json: events), then follow with -f")
                   ->check(CLI::PositiveNumber)
                   ->excludes(after);
  cmd->add_option("--tensorboard", a->tensorboard,
                  "Also write the job's metrics (all of them, from its start) as TensorBoard event files "
                  "into DIR")
      ->type_name("DIR")
      ->excludes(tail);
  AddRemoteOptions(cmd, &a->ro, "The host of JOB (default: from the job registry)");
  cmd->callback([a, &ctx] { ctx.exit_code = Logs(*a); });
}

}  // namespace sftctl::client
