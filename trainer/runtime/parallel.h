// The parallel-for seam of the fused CPU kernels (trainer/model/fused_ops.cpp).
//
// Two backends, chosen at build time and, for tests and benches, at run time:
// - kAten: at::parallel_for on LibTorch's own intra-op threads. Available when at::parallel_for
//   really runs in parallel in this build: LibTorch built with OpenMP and this file's translation
//   unit compiled with the same OpenMP ("openmp": Linux, Homebrew's pytorch with its libomp), or
//   LibTorch built with its native thread pool ("aten-native"). It is the default where available:
//   with OpenMP no second set of threads competes with the OpenMP threads that LibTorch's own ops
//   keep spinning between ops.
// - kPool: a small persistent pool owned by this file, sized by at::get_num_threads() at each
//   call ("pool"). Used where kAten is not available (AppleClang without libomp against an
//   OpenMP-built LibTorch, where at::parallel_for would silently run on one thread).
// SFTCTL_PARALLEL=pool (or =aten) in the environment, read once at the first call, overrides the
// default; an unknown value or an unavailable backend keeps the default.
//
// Determinism: For() calls `fn` on disjoint subranges that together cover [begin, end); how
// the range is split and on which threads depends on the backend and the thread count. Callers
// keep results independent of both by writing each index's result separately and by combining
// partial results in a fixed order after For() returns (see fused_ops.cpp).
//
// Thread safety: For() may be called from any thread, also from inside `fn` (nested calls run
// inline on the calling thread). While one call uses the pool, a concurrent call from another
// thread runs its chunks on its own thread. SetBackend() is meant for tests and benches.
#pragma once

#include <c10/util/C++17.h>  // LibTorch 1.13's FunctionRef.h uses c10::invoke_result_t without it
#include <c10/util/FunctionRef.h>

#include <cstdint>

#include "common/status.h"

namespace sftctl::trainer::parallel {

enum class Backend { kAten, kPool };

// Whether kAten runs in parallel in this build (see above).
bool AtenAvailable();

// "openmp" or "aten-native" for kAten (whichever LibTorch uses), "pool" for kPool.
const char* BackendName(Backend backend);

// The backend For() uses now.
Backend CurrentBackend();

// Makes For() use `backend` from now on. InvalidArgument for kAten where !AtenAvailable().
// REQUIRES: no For() call in flight on another thread.
Status SetBackend(Backend backend);

// Runs fn(b, e) over subranges of [begin, end) of at least about `grain` indices each, in
// parallel when the range exceeds `grain` and more than one thread is configured
// (at::get_num_threads()), and returns when all have run. An exception thrown by `fn` is
// rethrown here after the other subranges have finished or been skipped (the first one wins).
// `fn` must not use tensor operations (only data pointers): LibTorch's thread-local state is not
// copied to the worker threads.
void For(int64_t begin, int64_t end, int64_t grain, c10::function_ref<void(int64_t, int64_t)> fn);

}  // namespace sftctl::trainer::parallel
