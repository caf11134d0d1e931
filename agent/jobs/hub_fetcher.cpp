#include "agent/jobs/hub_fetcher.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "agent/state/job_spec.h"
#include "common/hub/hub_spec.h"
#include "common/os/file_system.h"
#include "common/spec/spec.h"
#include "common/spec/spec_paths.h"

namespace sftctl::agent {

HubFetcher::HubFetcher(HubOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

HubFetcher::~HubFetcher() { Stop(); }

void HubFetcher::Fetch(HubFetchTask task, Done done) {
  MutexLock lock(&mu_);
  cancelled_.erase(task.job_id);
  queue_.emplace_back(std::move(task), std::move(done));
  cv_.NotifyOne();
}

void HubFetcher::Cancel(const std::string& job_id) {
  MutexLock lock(&mu_);
  for (auto it = queue_.begin(); it != queue_.end();) {
    it = it->first.job_id == job_id ? queue_.erase(it) : std::next(it);
  }
  if (current_ == job_id) cancelled_.insert(job_id);
}

void HubFetcher::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
    cv_.NotifyOne();
  }
  if (thread_.joinable()) thread_.join();
}

void HubFetcher::Loop() {
  for (;;) {
    std::pair<HubFetchTask, Done> item;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || !queue_.empty(); });
      if (stop_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      current_ = item.first.job_id;
    }
    StatusOr<std::shared_ptr<const JobSpec>> spec = Resolve(item.first);
    item.first.token.clear();
    bool dropped = false;
    {
      MutexLock lock(&mu_);
      current_.clear();
      file_.clear();
      dropped = stop_ || cancelled_.erase(item.first.job_id) > 0;
    }
    if (!spec.ok())
      spdlog::warn("{}: Hugging Face download failed: {}", item.first.job_id, spec.status().message());
    if (!dropped) item.second(item.first.job_id, std::move(spec));
  }
}

namespace {

std::string Amount(uint64_t bytes) {
  char buf[32];
  if (bytes >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return buf;
}

}  // namespace

std::string HubFetcher::Progress(const std::string& job_id) const {
  MutexLock lock(&mu_);
  if (current_ != job_id || file_.empty()) return "";
  if (file_.find("(waiting") != std::string::npos) return file_;
  return file_ + ": " + Amount(done_bytes_) + (total_bytes_ > 0 ? " of " + Amount(total_bytes_) : "");
}

std::string ForwardHfTokenAdvice(const std::string& use) {
  return "submit again with `sftctl submit --forward-hf-token` (your token then goes to this host for this "
         "job's " +
         use + ", never stored), or put HF_TOKEN in the agent's ~/.config/sftd/env";
}

StatusOr<std::shared_ptr<const JobSpec>> HubFetcher::Resolve(const HubFetchTask& task) {
  HubOptions o = options_;
  if (!task.token.empty()) o.token = task.token;
  if (o.token.empty()) {
    o.token_advice = ForwardHfTokenAdvice("downloads");
  }
  const std::string id = task.job_id;
  o.cancelled = [this, id] {
    MutexLock lock(&mu_);
    return stop_ || cancelled_.count(id) > 0;
  };
  o.progress = [this](const std::string& file, uint64_t done, uint64_t total) {
    MutexLock lock(&mu_);
    file_ = file;
    done_bytes_ = done;
    total_bytes_ = total;
  };
  HubDownloader downloader(std::move(o));
  auto resolved = std::make_shared<JobSpec>(*task.spec);
  spdlog::info("{}: downloading {} path(s) from the Hugging Face Hub", id, HubPaths(*resolved).size());
  SFT_RETURN_IF_ERROR(ResolveHubSpec(resolved.get(), &downloader));
  return std::shared_ptr<const JobSpec>(std::move(resolved));
}

}  // namespace sftctl::agent
