#include "agent/stopping/client_activity.h"

namespace sftctl::agent {

bool ClientActivity::IsDoneMarker(const std::string& path) {
  return path == "DONE" || (path.size() > 5 && path.compare(path.size() - 5, 5, "/DONE") == 0);
}

void ClientActivity::CallStarted() {
  ++open_;
  last_contact_ns_.store(NowNs());
}

void ClientActivity::CallEnded() {
  last_contact_ns_.store(NowNs());
  --open_;
}

void ClientActivity::NotePulled(const std::string& job_id, const std::string& path) {
  if (!IsDoneMarker(path)) return;
  MutexLock lock(&mu_);
  pulled_.emplace(job_id, path);
}

bool ClientActivity::WasPulled(const std::string& job_id, const std::string& path) const {
  MutexLock lock(&mu_);
  return pulled_.count({job_id, path}) > 0;
}

Clock::TimePoint ClientActivity::last_contact() const {
  return Clock::TimePoint(Clock::TimePoint::duration(last_contact_ns_.load()));
}

}  // namespace sftctl::agent
