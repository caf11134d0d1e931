// PeriodicThread: runs a task on a thread of its own, once at Start and then every `interval`, until
// Stop (or destruction). Stop wakes the wait between runs, so it returns as soon as the run in
// progress (if any) returns; it never interrupts a run.
//
//   PeriodicThread loop(std::chrono::seconds(60), [this] { CheckOnce(); });
//   loop.Start();
//   ...
//   loop.Stop();  // or let it go out of scope
//
// The interval is measured from the end of one run to the start of the next (a slow run delays the
// next, runs never overlap), on std::chrono::steady_clock.
//
// Thread safety: Start and Stop from one thread (the owner's); the task runs on the loop's thread only.
// Not copyable or movable. The task must not call Stop (it would wait for itself).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace sftctl {

class PeriodicThread {
 public:
  // Does not start the thread. REQUIRES: interval > 0, task not empty.
  PeriodicThread(std::chrono::nanoseconds interval, std::function<void()> task);
  ~PeriodicThread();  // Stop()
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Starts the thread, which runs the task at once. REQUIRES: not started before. A PeriodicThread
  // stopped before Start never runs the task.
  void Start() EXCLUDES(mu_);
  // Stops the loop and joins its thread: returns once the run in progress, if any, returned, and the
  // task runs no more. Idempotent; a no-op before Start.
  void Stop() EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  const std::chrono::nanoseconds interval_;
  const std::function<void()> task_;
  Mutex mu_;
  CondVar stop_cv_;  // stop_ was set
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // Start and Stop only (the owner's thread)
};

}  // namespace sftctl
