// HubFetcher: downloads the hf:// paths of queued jobs (common/hub/hub_spec.h) into the host's Hugging
// Face cache on its own thread, one job at a time, so that neither gRPC reactions nor the
// supervisor's event and blocking threads wait for the network.
//
// A job's Hugging Face token travels in its task only: it is used for the download and dropped with
// the task, never written or logged. On success `done` gets a new JobSpec with the local paths (the
// Supervisor saves it as the job's spec.json); the fetcher writes nothing into the job's folder.
//
// Thread safety: Fetch and Cancel may be called from any thread. `done` runs on the fetcher's thread
// and must not block (post it on). Stop cancels the download in progress, drops the queued ones
// without calling their `done`, and joins the thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "common/hub/hf_hub.h"
#include "common/mutex.h"
#include "common/spec/spec_types.h"
#include "common/status.h"

namespace sftctl::agent {

// What a job's Hub error tells the user when the agent has no token: forward theirs for the job's
// `use` ("downloads", "uploads"), or give the agent its own. For HubOptions::token_advice.
std::string ForwardHfTokenAdvice(const std::string& use);

struct HubFetchTask {
  std::string job_id;
  std::shared_ptr<const JobSpec> spec;  // the job's spec, with hf:// paths; not null
  std::string token;                    // the client's token; "" = the host's (HubOptions::token)
};

class HubFetcher {
 public:
  // StatusOr<the resolved spec>.
  using Done = std::function<void(const std::string& job_id, StatusOr<std::shared_ptr<const JobSpec>> spec)>;

  // `options`: endpoint, cache and the host's token (HubOptionsFromEnvironment()).
  explicit HubFetcher(HubOptions options);
  ~HubFetcher();
  HubFetcher(const HubFetcher&) = delete;
  HubFetcher& operator=(const HubFetcher&) = delete;

  void Fetch(HubFetchTask task, Done done) EXCLUDES(mu_);
  // Stops `job_id`'s download (CANCELLED) or drops it from the queue (`done` is then not called).
  void Cancel(const std::string& job_id) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  // How far `job_id`'s download is, e.g. "model.safetensors: 1.2 of 3.1 GiB" or "model.safetensors
  // (waiting for another download)"; "" when it is not downloading now.
  std::string Progress(const std::string& job_id) const EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);
  StatusOr<std::shared_ptr<const JobSpec>> Resolve(const HubFetchTask& task) EXCLUDES(mu_);

  HubOptions options_;
  mutable Mutex mu_;
  CondVar cv_;  // queued, or stopping
  std::deque<std::pair<HubFetchTask, Done>> queue_ GUARDED_BY(mu_);
  std::set<std::string> cancelled_ GUARDED_BY(mu_);
  std::string current_ GUARDED_BY(mu_);  // the job being downloaded
  std::string file_ GUARDED_BY(mu_);     // its file now, with the bytes below
  uint64_t done_bytes_ GUARDED_BY(mu_) = 0, total_bytes_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace sftctl::agent
