// Thread-safety annotations: which mutex guards which field, which functions need a lock held or must
// be called without it. Clang checks them at compile time with -Wthread-safety (the `thread-safety`
// preset builds agent/, client/ and common/ that way, warnings as errors); other compilers see nothing.
//
// Use them with sftctl::Mutex / MutexLock (common/mutex.h): std::mutex carries no annotations in
// libstdc++, so the analysis cannot see it being locked.
//
//   class Counter {
//    public:
//     void Add(int n) EXCLUDES(mu_) { MutexLock l(&mu_); AddLocked(n); }
//    private:
//     void AddLocked(int n) REQUIRES(mu_) { total_ += n; }
//     Mutex mu_;
//     int total_ GUARDED_BY(mu_) = 0;
//   };
//
// The names follow clang's documentation ("Thread Safety Analysis"); the macros only wrap its
// attributes. Each is defined only when no other header did (Abseil's internal header defines some of
// the same names the same way).
#pragma once

#ifndef THREAD_ANNOTATION_ATTRIBUTE__
#if defined(__clang__)
#define THREAD_ANNOTATION_ATTRIBUTE__(x) __attribute__((x))
#else
#define THREAD_ANNOTATION_ATTRIBUTE__(x)
#endif
#endif

// A type that is a lock (Mutex).
#ifndef CAPABILITY
#define CAPABILITY(x) THREAD_ANNOTATION_ATTRIBUTE__(capability(x))
#endif
// An RAII type that holds a lock from its constructor to its destructor (MutexLock).
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY THREAD_ANNOTATION_ATTRIBUTE__(scoped_lockable)
#endif

// A field read or written only with the lock held.
#ifndef GUARDED_BY
#define GUARDED_BY(x) THREAD_ANNOTATION_ATTRIBUTE__(guarded_by(x))
#endif
// A pointer field whose pointee is read or written only with the lock held.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) THREAD_ANNOTATION_ATTRIBUTE__(pt_guarded_by(x))
#endif

// Locks that must be taken before / after this one (documents the order; checked with -Wthread-safety-beta).
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) THREAD_ANNOTATION_ATTRIBUTE__(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) THREAD_ANNOTATION_ATTRIBUTE__(acquired_after(__VA_ARGS__))
#endif

// The caller holds the lock(s) (exclusively / at least shared).
#ifndef REQUIRES
#define REQUIRES(...) THREAD_ANNOTATION_ATTRIBUTE__(requires_capability(__VA_ARGS__))
#endif
#ifndef REQUIRES_SHARED
#define REQUIRES_SHARED(...) THREAD_ANNOTATION_ATTRIBUTE__(requires_shared_capability(__VA_ARGS__))
#endif
// The caller must not hold the lock(s): the function takes them itself.
#ifndef EXCLUDES
#define EXCLUDES(...) THREAD_ANNOTATION_ATTRIBUTE__(locks_excluded(__VA_ARGS__))
#endif

// The function takes / gives back the lock(s) and returns holding / not holding them.
#ifndef ACQUIRE
#define ACQUIRE(...) THREAD_ANNOTATION_ATTRIBUTE__(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) THREAD_ANNOTATION_ATTRIBUTE__(release_capability(__VA_ARGS__))
#endif
// The function tries to take the lock and returns `b` when it did.
#ifndef TRY_ACQUIRE
#define TRY_ACQUIRE(...) THREAD_ANNOTATION_ATTRIBUTE__(try_acquire_capability(__VA_ARGS__))
#endif
// The function checks at run time that the lock is held; the analysis assumes it is afterwards.
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) THREAD_ANNOTATION_ATTRIBUTE__(assert_capability(x))
#endif
// The function returns a reference to this lock (an accessor for the mutex).
#ifndef RETURN_CAPABILITY
#define RETURN_CAPABILITY(x) THREAD_ANNOTATION_ATTRIBUTE__(lock_returned(x))
#endif

// Turns the analysis off for one function: only where it cannot follow the locking (say why there).
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS THREAD_ANNOTATION_ATTRIBUTE__(no_thread_safety_analysis)
#endif
