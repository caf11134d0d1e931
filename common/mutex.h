// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable with the annotations clang's
// thread-safety analysis reads (common/thread_annotations.h), so that `GUARDED_BY(mu_)` fields are
// checked at compile time. libstdc++'s std::mutex carries none, and a field guarded by it cannot be
// checked.
//
//   Mutex mu_;
//   CondVar changed_;
//   int n_ GUARDED_BY(mu_) = 0;
//   ...
//   MutexLock l(&mu_);
//   changed_.Wait(&mu_, [&]() REQUIRES(mu_) { return n_ > 0; });
//
// A predicate passed to a CondVar runs with the mutex held: annotate it REQUIRES(the mutex) when it
// reads guarded fields (the analysis cannot see into std::condition_variable, so it takes the
// predicate's annotation on trust).
//
// Thread safety: all of it is for use from several threads; none of it is copyable or movable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace sftctl {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // Tells the analysis the caller holds this mutex (checked by nothing at run time): for a function
  // that is only ever called with it held but cannot say so in its signature (a callback).
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to destruction; Unlock/Lock let go of it and take it again inside the
// scope (it must be held again, or not, consistently on every path to the end of the scope).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    mu_->Unlock();
    held_ = false;
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// std::condition_variable over a Mutex. Every wait REQUIRES the mutex, which is held again when it
// returns (spurious wake-ups included: wait in a loop, or pass a predicate).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();
  }
  // False when `timeout` passed without a notification.
  template <class Rep, class Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout) REQUIRES(mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    const bool notified = cv_.wait_for(l, timeout) == std::cv_status::no_timeout;
    l.release();
    return notified;
  }
  // Until `pred()` (called with `mu` held) is true.
  template <class Pred>
  void Wait(Mutex* mu, Pred pred) REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l, pred);
    l.release();
  }
  // Until `pred()` or `timeout` passed: pred()'s last value.
  template <class Rep, class Period, class Pred>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> timeout, Pred pred)
      REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    const bool ok = cv_.wait_for(l, timeout, pred);
    l.release();
    return ok;
  }
  template <class Clock, class Duration, class Pred>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Duration> deadline, Pred pred)
      REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    const bool ok = cv_.wait_until(l, deadline, pred);
    l.release();
    return ok;
  }

  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace sftctl
