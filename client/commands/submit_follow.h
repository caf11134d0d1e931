// Following a job `submit` queued: --follow streams its logs (as `logs -f`), --sync-to keeps a folder
// in step with its checkpoints (as `pull --follow`); both at once run the sync on its own connection
// beside the logs. Also the submit-then-follow that `submit --host`, `resubmit` and each host of
// `submit --provider` run.
//
// The exit code of a follow is the job's final state (log_follower.h's ExitCodeForState), or the first
// error's (remote_options.h's ExitCodeFor): 4 when the host cannot be reached.
//
// Thread safety: one follow per call; a --sync-to beside --follow runs on a thread of its own, joined
// before the call returns.
#pragma once

#include <cstdint>

#include "client/commands/submit_flow.h"
#include "client/remote/agent_session.h"
#include "client/remote/job_registry.h"
#include "common/status.h"

namespace sftctl::client {

// Follows the submitted job `rec` on node 0's connection `rc` as `a` asks (neither --follow nor
// --sync-to: exit 0 at once). `printed`: the seq of the last event printed (0: none), kept up to date
// for a later call. An error while the logs stream is reported as it happens (the checkpoint sync
// beside them may go on until the job ends) and its exit code returned. Errors: the sync's own
// connection could not be made (before anything was followed).
StatusOr<int> FollowSubmitted(const SubmitArgs& a, const JobRecord& rec, Reconnector* rc, uint64_t* printed);

// Follows `rec` again after a lost connection, from the event after `printed` (the checkpoint sync
// too), as FollowSubmitted; exit 4, with a line on stderr, when its host cannot be reached.
StatusOr<int> FollowAgain(const SubmitArgs& a, const JobRecord& rec, uint64_t* printed);

// SubmitToHosts, then FollowSubmitted on node 0's connection (every node's kept open until it ends).
// `record` (may be null) gets the job's record once it is submitted, and `printed` (may be null) the
// seq of the last event the follow printed. Errors: SubmitToHosts's and FollowSubmitted's.
StatusOr<int> SubmitThenFollow(const SubmitArgs& a, SubmitSpec spec, JobRecord* record = nullptr,
                               uint64_t* printed = nullptr);

}  // namespace sftctl::client
