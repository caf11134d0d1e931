// `submit --provider P ...`: a host rented (rent_flags.h), the job submitted to it.
//
// Without --down-when-done the host stays up after the submit (`sftctl down` ends it). With it the job
// is followed, its final checkpoint pulled (to --sync-to, by default ./<host name>, unless it goes to
// checkpoint.upload_to), and the host given back whatever the outcome; Ctrl-C gives it back too
// (HostReturnGuard), and the host stops itself when this machine is gone, where it can
// (rent_flags.h's HostStopsItself). A lost connection to a host that still runs is followed again; with
// --replace-lost, a host the provider took away is replaced and the job continues on the replacement
// from the newest checkpoint that survived (the bucket's, or the newest pulled into --sync-to), within
// what is left of --max-cost (client/cloud/rental.h's renting policy decides both).
//
// Errors that end the command come back as Status; what goes wrong with one host on the way (its
// submit or follow failing, giving it back failing) is reported as it happens, as the run goes on to
// give the host back.
//
// Thread safety: one call at a time (HostReturnGuard holds the process's signals while it runs).
#pragma once

#include "client/commands/submit_flow.h"
#include "common/status.h"

namespace sftctl::client {

// Rents the host, submits `spec` (loaded once, from `a`, before anything is rented) to it and, with
// --down-when-done, follows the job, pulls and gives the host back, replacing a lost one as asked (a
// replacement's spec is loaded again, to resume from what survived). Returns the exit code (the job's,
// or the first error's). REQUIRES: a.rent.provider set, a.ro.hosts empty, not a dry run. Errors:
// HostStopsItself's, renting's (the first host's or a replacement's).
StatusOr<int> SubmitRented(SubmitArgs a, SubmitSpec spec);

}  // namespace sftctl::client
