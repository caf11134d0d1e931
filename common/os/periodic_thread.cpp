#include "common/os/periodic_thread.h"

#include <utility>

namespace sftctl {

PeriodicThread::PeriodicThread(std::chrono::nanoseconds interval, std::function<void()> task)
    : interval_(interval), task_(std::move(task)) {}

PeriodicThread::~PeriodicThread() { Stop(); }

void PeriodicThread::Start() {
  {
    MutexLock lock(&mu_);
    if (stop_) return;
  }
  thread_ = std::thread([this] { Loop(); });
}

void PeriodicThread::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  stop_cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void PeriodicThread::Loop() {
  MutexLock lock(&mu_);
  while (!stop_) {
    lock.Unlock();
    task_();
    lock.Lock();
    stop_cv_.WaitFor(&mu_, interval_, [this]() REQUIRES(mu_) { return stop_; });
  }
}

}  // namespace sftctl
