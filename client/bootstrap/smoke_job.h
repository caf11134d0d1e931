// The smoke job `sftctl bootstrap` runs to prove a host works: the built-in demo task (client/local/demo.h)
// cut to a few steps, submitted to the host's agent like `sftctl submit` would (files uploaded as
// blobs, one GPU when the host has one, else one CPU rank), recorded in the job registry, and waited
// for.
//
// Thread safety: none needed (no shared state); blocks until the job ends or the timeout passes.
#pragma once

#include <string>

#include "client/remote/agent_connection.h"
#include "common/status.h"

namespace sftctl::client {

struct SmokeJobOptions {
  int steps = 20;
};

// Returns "job-N: 20 steps, loss A -> B". FAILED_PRECONDITION naming the job and its reason when
// it did not succeed; FAILED_PRECONDITION when the agent runs another source id than this client;
// connection errors as ConnectHost.
StatusOr<std::string> RunSmokeJob(const ConnectOptions& opts, const SmokeJobOptions& so);

}  // namespace sftctl::client
