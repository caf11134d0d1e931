// Never run: compiled by tests/common/thread_safety_probe.sh with clang -Wthread-safety
// -Werror=thread-safety. As it stands it must compile; with -DSFT_PROBE_VIOLATION each misuse below
// must be an error. So the analysis the `thread-safety` preset relies on does see
// common/thread_annotations.h and the Mutex/MutexLock/CondVar wrappers of common/mutex.h.
#include "common/mutex.h"

namespace sftctl {

class Account {
 public:
  void Deposit(int n) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    balance_ += n;
    changed_.NotifyAll();
  }
  int WaitForFunds() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    changed_.Wait(&mu_, [&]() REQUIRES(mu_) { return balance_ > 0; });
    l.Unlock();
    l.Lock();
    return WithdrawLocked();
  }
#ifdef SFT_PROBE_VIOLATION
  int ReadUnlocked() { return balance_; }    // probe: reading balance_ without mu_
  void CallUnlocked() { WithdrawLocked(); }  // probe: calling WithdrawLocked without mu_
  void LockTwice() EXCLUDES(mu_) {           // probe: mu_ taken while held
    MutexLock a(&mu_);
    MutexLock b(&mu_);
  }
  void WaitUnannotated() EXCLUDES(mu_) {  // probe: a predicate that reads balance_ unannotated
    MutexLock l(&mu_);
    changed_.Wait(&mu_, [&] { return balance_ > 0; });
  }
#endif

 private:
  int WithdrawLocked() REQUIRES(mu_) {
    const int n = balance_;
    balance_ = 0;
    return n;
  }

  Mutex mu_;
  CondVar changed_;
  int balance_ GUARDED_BY(mu_) = 0;
};

}  // namespace sftctl

int main() {
  sftctl::Account a;
  a.Deposit(1);
  return a.WaitForFunds() == 1 ? 0 : 1;
}
