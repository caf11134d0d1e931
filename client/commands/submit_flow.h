// `sftctl submit --host H SPEC` (and `resubmit`): the spec loaded, its files uploaded and the job queued
// on the hosts' agents.
//
// The spec is loaded like `run --local` loads it; its local files travel as sha256-addressed blobs
// (an unchanged file is not sent again, an interrupted upload resumes); the job is recorded in the
// job registry. Several hosts (repeated --host, or the spec's `hosts`) make one multi-node job:
// node 0 is submitted first and reports the rendezvous the other nodes join.
//
// Following the job after (--follow, --sync-to) is submit_follow.h's; renting the host first
// (--provider) is submit_rented.h's; the command's flags and its one report of an error are
// cmd_submit.cpp's. Errors come back as Status, never printed here.
//
// Thread safety: one submission per call; nothing is shared between calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/commands/rent_flags.h"
#include "client/commands/spec_flags.h"
#include "client/remote/agent_session.h"
#include "client/remote/job_registry.h"
#include "client/remote/remote_options.h"
#include "client/transfer/remote_spec.h"
#include "client/transfer/uploader.h"
#include "common/status.h"

namespace sftctl::client {

// What `submit` and `resubmit` were asked (their flags, cmd_submit.cpp).
struct SubmitArgs {
  RemoteOptions ro;
  std::string spec_path;
  SpecFlags spec;  // --name, --max-steps, --set, --slurm, ... (client/commands/spec_flags.h)
  bool follow = false;
  std::string sync_to;  // --sync-to: keep this folder in step with the job's checkpoints
  double sync_interval_s = 10;
  int sync_keep = 0;
  int gpus = -1;
  int cpu_ranks = -1;
  unsigned max_restarts = 0;
  unsigned heartbeat_s = 0;
  bool stop_when_done = false;
  bool bootstrap = false;         // --bootstrap: bring each host to this client's version first
  bool forward_hf_token = false;  // --forward-hf-token: send this machine's HF token for hf:// paths
  // --forward-aws-credentials: send this machine's for s3:// (client/transfer/bucket_transfer.h)
  bool forward_aws = false;
  bool allow_changed_spec = false;  // resubmit --allow-changed-spec: continue with a spec edited since
  RentFlags rent;                   // --provider ...: rent the host first (client/commands/rent_flags.h)
  bool down_when_done = false;      // --down-when-done: follow, pull, then give the rented host back
  int replace_lost = 0;             // --replace-lost N: rent another host when the provider took this one
};

// The spec as `submit` loads it: every spec flag an override applied with the --set ones as the spec
// loads, before its files are collected (a --resume-from folder travels too).
struct SubmitSpec {
  std::vector<std::string> overrides;  // recorded for `resubmit`, which applies them all again
  RemoteSpec remote;
};

// Loads `a.spec_path` with `a.spec`'s overrides (SpecOverrides, LoadRemoteSpec). Errors: theirs.
StatusOr<SubmitSpec> LoadSubmitSpec(const SubmitArgs& a);

// One host of a job: how it was reached, its connection, what was uploaded to it, its job there.
struct SubmitNode {
  ConnectOptions opts;
  std::unique_ptr<Reconnector> rc;
  UploadStats stats;
  v1::Job job;
  bool submitted = false;
};

// A job queued on every node: its registry record, and the nodes' connections (node 0 first), which
// the follow after uses.
struct SubmittedJob {
  JobRecord rec;
  std::vector<SubmitNode> nodes;
};

// The spec checked against the hosts (--host wins over the spec's `hosts`; a Slurm job goes to one),
// its bucket and Hub targets checked, its files hashed; every host connected (bootstrapped first with
// --bootstrap), the ranks chosen (--gpus, --cpu-ranks, else one GPU when node 0 has any), the files
// uploaded to each, every node submitted (when one fails, those submitted before it are cancelled
// and the error names them), the job recorded in the job registry (a failure there only warns) and
// reported: its id (or --json's object) on stdout, a summary on stderr. Notes of the spec, forwarded
// tokens and the upload's progress go to stderr as it runs. Errors: the spec's, the connections', the
// uploads', the agents'; INVALID_ARGUMENT for no host, a host twice, a multi-host Slurm job.
StatusOr<SubmittedJob> SubmitToHosts(const SubmitArgs& a, SubmitSpec spec);

}  // namespace sftctl::client
