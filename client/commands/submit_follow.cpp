// Following a submitted job: contracts in submit_follow.h.
#include "client/commands/submit_follow.h"

#include <iostream>
#include <thread>
#include <utility>

#include "client/remote/job_target.h"
#include "client/remote/log_follower.h"
#include "client/remote/remote_options.h"
#include "client/transfer/checkpoint_sync.h"
#include "common/terminal_text.h"

namespace sftctl::client {

StatusOr<int> FollowSubmitted(const SubmitArgs& a, const JobRecord& rec, Reconnector* rc, uint64_t* printed) {
  const bool json = a.ro.json;
  SyncOptions sync{a.sync_to, a.sync_interval_s, a.sync_keep, /*streams=*/0, /*force=*/false, json};
  if (a.sync_to.empty() && !a.follow) return static_cast<int>(kExitOk);
  if (!a.follow) return SyncCheckpoints(sync, rec, rec.nodes.front(), rc);
  int sync_code = kExitOk;
  std::thread syncer;
  if (!a.sync_to.empty()) {
    SFT_ASSIGN_OR_RETURN(std::unique_ptr<Reconnector> own, ConnectNode(rec.nodes.front()));
    syncer = std::thread([&sync, &rec, &sync_code, own = std::move(own)] {
      sync_code = SyncCheckpoints(sync, rec, rec.nodes.front(), own.get());
    });
  }
  auto result = PrintEvents(rc, rec.id, *printed, /*follow=*/true, json, printed);
  // Reported now, not after the join: the sync may run on until the job ends.
  const int code = result.ok() ? ExitCodeForState(result->final_state.value_or(v1::FAILED))
                               : ReportError(result.status(), json);
  if (syncer.joinable()) syncer.join();  // it ends with the job, after its final checkpoint
  return code != kExitOk ? code : sync_code;
}

StatusOr<int> FollowAgain(const SubmitArgs& a, const JobRecord& rec, uint64_t* printed) {
  auto rc = ConnectNode(rec.nodes.front());
  if (!rc.ok()) {
    std::cerr << "submit: " << EscapeForTerminal(rc.status().message()) << "\n";
    return static_cast<int>(kExitUnreachable);
  }
  return FollowSubmitted(a, rec, rc->get(), printed);
}

StatusOr<int> SubmitThenFollow(const SubmitArgs& a, SubmitSpec spec, JobRecord* record, uint64_t* printed) {
  SFT_ASSIGN_OR_RETURN(SubmittedJob job, SubmitToHosts(a, std::move(spec)));
  if (record != nullptr) *record = job.rec;
  uint64_t own = 0;
  return FollowSubmitted(a, job.rec, job.nodes[0].rc.get(), printed != nullptr ? printed : &own);
}

}  // namespace sftctl::client
