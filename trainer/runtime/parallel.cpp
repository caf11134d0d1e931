#include "trainer/runtime/parallel.h"

#include <ATen/Parallel.h>
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "common/mutex.h"

// INTRA_OP_PARALLEL is ATen's own signal that at::parallel_for runs in parallel: always with its
// native pool, and with OpenMP only where this file is compiled with OpenMP (_OPENMP). CMake
// (trainer/runtime/parallel.cmake) defines SFTCTL_PARALLEL_ATEN when it chose that backend; a mismatch
// would silently run the fused kernels on one thread, so it stops the build.
#if defined(SFTCTL_PARALLEL_ATEN) && !defined(INTRA_OP_PARALLEL)
#error "CMake chose at::parallel_for for the fused kernels, but it is serial in this compile (no OpenMP?)"
#endif

namespace sftctl::trainer::parallel {
namespace {

using ChunkFn = c10::function_ref<void(int64_t, int64_t)>;

// Subranges per configured thread: more than one, so a thread the OS deschedules (a shared or
// busy machine) holds up less than 1/threads of the work; the others claim what it leaves.
constexpr int64_t kChunksPerThread = 4;
// How long a thread busy-waits before it blocks: the fused kernels run many short parallel loops
// per training step, back to back, and waking a blocked thread costs tens of microseconds. Short,
// because a spinning worker takes a core from LibTorch's own threads between the loops.
constexpr std::chrono::microseconds kSpinTime{50};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Busy-waits until done() or kSpinTime has passed; returns done().
template <typename Pred>
bool SpinUntil(const Pred& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    if (done()) return true;
    CpuRelax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return done();
  }
}

int64_t DivUp(int64_t a, int64_t b) { return (a + b - 1) / b; }

// True on the pool's workers, and on a caller while it runs chunks: For() then runs inline.
thread_local bool t_inside = false;
// Set in a child process after fork(): the pool's threads did not survive it.
std::atomic<bool> g_forked{false};

// One For() call on the pool: `chunks` subranges of `chunk` indices, claimed in any order.
struct Job {
  Job(ChunkFn f, int64_t b, int64_t e, int64_t c)
      : fn(f), begin(b), end(e), chunk(c), chunks(DivUp(e - b, c)) {}
  const ChunkFn fn;
  const int64_t begin, end, chunk, chunks;
  int helpers = 0;                  // pool workers 0..helpers-1 may join
  std::atomic<int64_t> next{0};     // next unclaimed subrange
  std::atomic<int> active{0};       // workers that joined and have not left
  std::atomic<bool> failed{false};  // set once, by whoever stores `error`
  std::exception_ptr error;
};

// Claims and runs subranges until none is left or one has thrown.
void Work(Job& job) {
  while (!job.failed.load(std::memory_order_relaxed)) {
    const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.chunks) return;
    const int64_t b = job.begin + c * job.chunk;
    try {
      job.fn(b, std::min(job.end, b + job.chunk));
    } catch (...) {
      if (!job.failed.exchange(true)) job.error = std::current_exception();
    }
  }
}

// Persistent workers that help whichever thread calls TryRun(); one job at a time.
class Pool {
 public:
  // Never destroyed: its detached workers may still be waiting when the process exits.
  static Pool& Get() {
    static Pool* pool = [] {
      pthread_atfork(nullptr, nullptr, [] { g_forked = true; });
      return new Pool();
    }();
    return *pool;
  }

  // Runs `job` on the calling thread with up to job.helpers workers and returns once every
  // subrange has run; false (nothing run) while another thread's job holds the pool.
  bool TryRun(Job& job) {
    if (!run_mu_.TryLock()) return false;
    {
      MutexLock lk(&mu_);
      StartWorkers(job.helpers);
      job.helpers = std::min(job.helpers, workers_);
      job_ = &job;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_cv_.NotifyAll();
    t_inside = true;
    Work(job);  // (catches what the chunks throw: nothing leaves run_mu_ held)
    t_inside = false;
    MutexLock lk(&mu_);
    job_ = nullptr;  // workers that have not joined yet stay out
    lk.Unlock();
    SpinUntil([&] { return job.active.load(std::memory_order_acquire) == 0; });
    lk.Lock();
    done_cv_.Wait(&mu_, [&] { return job.active.load(std::memory_order_acquire) == 0; });
    lk.Unlock();
    run_mu_.Unlock();
    return true;
  }

 private:
  Pool() = default;

  // Fewer workers than asked if the OS refuses threads.
  void StartWorkers(int n) REQUIRES(mu_) {
    for (; workers_ < n; ++workers_) {
      try {
        std::thread(&Pool::WorkerLoop, this, workers_, generation_.load()).detach();
      } catch (const std::system_error&) {
        return;
      }
    }
  }

  void WorkerLoop(int index, uint64_t seen) {
    t_inside = true;
    for (;;) {
      SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; });
      Job* job = nullptr;
      {
        MutexLock lk(&mu_);
        wake_cv_.Wait(&mu_, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        seen = generation_.load(std::memory_order_relaxed);
        if (job_ != nullptr && index < job_->helpers) {
          job = job_;
          job->active.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (job == nullptr) continue;
      Work(*job);
      // The caller may return (and free the job) as soon as `active` reaches 0.
      if (job->active.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        MutexLock lk(&mu_);
        done_cv_.NotifyAll();
      }
    }
  }

  Mutex run_mu_;  // held by the thread whose job runs
  Mutex mu_;
  CondVar wake_cv_, done_cv_;
  std::atomic<uint64_t> generation_{0};  // bumped (under mu_) for each job
  Job* job_ GUARDED_BY(mu_) = nullptr;
  int workers_ GUARDED_BY(mu_) = 0;
};

void PoolFor(int64_t begin, int64_t end, int64_t grain, ChunkFn fn) {
  const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
  const int threads = at::get_num_threads();
  if (n <= grain || threads <= 1 || t_inside || g_forked || at::in_parallel_region()) {
    fn(begin, end);
    return;
  }
  const int64_t chunks = std::min(DivUp(n, grain), threads * kChunksPerThread);
  Job job(fn, begin, end, DivUp(n, chunks));
  job.helpers = static_cast<int>(std::min<int64_t>(threads - 1, job.chunks - 1));
  if (!Pool::Get().TryRun(job)) {
    fn(begin, end);  // another thread's job holds the pool
    return;
  }
  if (job.error) std::rethrow_exception(job.error);
}

Backend DefaultBackend() {
  const Backend fallback = AtenAvailable() ? Backend::kAten : Backend::kPool;
  const char* env = std::getenv("SFTCTL_PARALLEL");
  if (env == nullptr || *env == '\0') return fallback;
  const std::string v = env;
  if (v == "pool") return Backend::kPool;
  if ((v == "aten" || v == BackendName(Backend::kAten)) && AtenAvailable()) return Backend::kAten;
  spdlog::warn("SFTCTL_PARALLEL={}: not a backend of this build (pool{}); using {}", v,
               AtenAvailable() ? std::string(", aten, ") + BackendName(Backend::kAten) : "",
               BackendName(fallback));
  return fallback;
}

std::atomic<Backend>& Current() {
  static std::atomic<Backend> current{DefaultBackend()};
  return current;
}

}  // namespace

bool AtenAvailable() {
#ifdef INTRA_OP_PARALLEL
  return true;
#else
  return false;
#endif
}

const char* BackendName(Backend backend) {
  if (backend == Backend::kPool) return "pool";
#if AT_PARALLEL_OPENMP
  return "openmp";
#else
  return "aten-native";
#endif
}

Backend CurrentBackend() { return Current().load(std::memory_order_relaxed); }

Status SetBackend(Backend backend) {
  if (backend == Backend::kAten && !AtenAvailable()) {
    return InvalidArgumentError(std::string("parallel backend ") + BackendName(backend) +
                                " is not available in this build (at::parallel_for is serial here)");
  }
  Current().store(backend, std::memory_order_relaxed);
  return OkStatus();
}

void For(int64_t begin, int64_t end, int64_t grain, ChunkFn fn) {
  if (begin >= end) return;
  if (CurrentBackend() == Backend::kAten) {
    at::parallel_for(begin, end, grain, fn);
  } else {
    PoolFor(begin, end, grain, fn);
  }
}

}  // namespace sftctl::trainer::parallel
