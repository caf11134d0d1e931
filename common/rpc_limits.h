// Message-size and concurrency limits shared by the agent's server and every client channel, so
// that no message one side may send is refused by the other (a 4 MiB default on one channel broke
// `logs` after a burst of long lines).
#pragma once

namespace sftctl {

// The largest gRPC message either side accepts. The agent never sends more than about 1 MiB of
// event text per StreamEvents message, and PullArtifact chunks are smaller still.
constexpr int kMaxRpcMessageBytes = 16 << 20;
// Streams one client connection may have open at once on the agent.
constexpr int kMaxConcurrentStreamsPerConnection = 64;

}  // namespace sftctl
