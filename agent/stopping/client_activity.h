// ClientActivity: what the stop policy (agent/stopping/auto_stop.h) needs to know of the clients: how many
// authenticated calls are open (a `logs -f`, a pull, an upload), when a client was last heard from
// (the lease every client contact renews), and which final-checkpoint markers were pulled. A gRPC
// server interceptor (agent/serving/activity_interceptor.h) feeds it for every RPC, so no handler
// changes.
//
// Thread safety: all methods are safe to call concurrently and never block beyond a short mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/os/clock.h"

namespace sftctl::agent {

class ClientActivity {
 public:
  explicit ClientActivity(const Clock* clock) : clock_(clock), last_contact_ns_(NowNs()) {}

  // An authenticated call began / ended; both renew the lease.
  void CallStarted();
  void CallEnded();
  // PullArtifact sent the whole of `path` ("run/checkpoint-000008/DONE") of `job_id`. Only DONE
  // markers are kept: the client pulls a checkpoint's DONE last, after its other files verified.
  void NotePulled(const std::string& job_id, const std::string& path) EXCLUDES(mu_);
  bool WasPulled(const std::string& job_id, const std::string& path) const EXCLUDES(mu_);
  // "DONE" or ".../DONE": the markers NotePulled keeps.
  static bool IsDoneMarker(const std::string& path);

  uint32_t open_calls() const { return open_.load(); }
  Clock::TimePoint last_contact() const;

 private:
  int64_t NowNs() const { return clock_->Now().time_since_epoch().count(); }

  const Clock* clock_;
  std::atomic<uint32_t> open_{0};
  std::atomic<int64_t> last_contact_ns_;
  mutable Mutex mu_;
  std::set<std::pair<std::string, std::string>> pulled_ GUARDED_BY(mu_);  // (job, DONE path)
};

}  // namespace sftctl::agent
