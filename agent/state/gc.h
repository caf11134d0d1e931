// Garbage collection of an agent's data dir (`sftd gc`, and automatically when the store grows past
// a threshold): blobs (uploaded inputs) that no queued or running job references, partial uploads
// nobody resumed, and the folders of jobs that finished long ago.
//
// What is never removed: a blob named by a job that is not final (its spec, or a symlink in its
// inputs/ folder), a blob or partial upload in use right now (BlobStore refuses), anything used more
// recently than GcPolicy::min_age_s (a blob's mtime is its last use: StatBlob and SubmitJob touch it),
// and the folder of a job that is not final. A blob can always be uploaded again; a job folder holds
// the user's checkpoints, so it goes only by age, never to make room.
//
// PlanGc is a pure function of a snapshot (tests build snapshots by hand); GarbageCollector scans the
// data dir, plans, and removes. A job's blobs are read from its typed spec (JobRecord::spec), not its
// JSON text: see JobSpecLookup.
//
// Thread safety: PlanGc is a pure function. GarbageCollector::Run may be called from any thread; runs
// are serialised.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/state/blob_store.h"
#include "agent/state/state_store.h"
#include "common/mutex.h"
#include "common/os/periodic_thread.h"
#include "common/spec/spec_types.h"
#include "common/status.h"
#include "sftctl/v1/agent.pb.h"

namespace sftctl::agent {

struct GcPolicy {
  int64_t blob_max_age_s = 7 * 86400;     // unreferenced blobs unused for longer are removed
  int64_t partial_max_age_s = 2 * 86400;  // partial uploads untouched for longer are removed
  int64_t job_max_age_s = 30 * 86400;     // folders of jobs finished longer ago are removed; <= 0: never
  // > 0: when blobs and partial uploads together hold more, the least recently used unreferenced blobs
  // (and then partial uploads) older than min_age_s are removed until they fit.
  uint64_t max_store_bytes = 0;
  int64_t min_age_s = 3600;  // nothing used more recently is removed, whatever the ages above say
};

enum class GcKind { kBlob, kPartial, kJobFolder };
const char* GcKindName(GcKind kind);  // "blob", "partial", "job"

// One file or folder as the scan saw it.
struct GcEntry {
  std::string name;  // sha256 for blobs and partial uploads, the job id for job folders
  std::string path;
  uint64_t bytes = 0;
  int64_t mtime_s = 0;  // blobs, partials: last use; job folders: when the job finished
};

struct GcSnapshot {
  std::vector<GcEntry> blobs;
  std::vector<GcEntry> partials;
  std::vector<GcEntry> finished_jobs;  // folders of final jobs only
  std::set<std::string> referenced;    // sha256 of blobs a job that is not final names
};

struct GcRemoval {
  GcKind kind = GcKind::kBlob;
  GcEntry entry;
  std::string why;  // "unused for 9 days", "store over 10 GiB"
};

// What `policy` removes from `snap` at `now_s`: age rules first, then the size cap (oldest first).
std::vector<GcRemoval> PlanGc(const GcSnapshot& snap, const GcPolicy& policy, int64_t now_s);

struct GcResult {
  std::vector<GcRemoval> removed;  // dry run: what would be removed
  uint64_t bytes_freed = 0;
  size_t referenced_blobs = 0;      // blobs kept because a queued or running job needs them
  uint64_t store_bytes = 0;         // blobs + partial uploads before the run
  std::vector<std::string> errors;  // entries that could not be removed (they are kept)
};

// The typed spec of a job that is not final, or null: in a running agent the Supervisor's
// (Supervisor::SpecOf), which parsed it when it took the job; the collector then never parses a
// spec's text. A job the lookup holds none of is one whose submit is still being recorded (its record
// has no spec text yet either): its blobs were touched by that submit, so min_age_s keeps them. With
// no lookup (no agent runs: `sftd gc` offline) the collector parses each stored text itself, once per
// run (agent/state/job_spec.h ParseStoredSpec; a spec that does not parse names no blob).
using JobSpecLookup = std::function<std::shared_ptr<const JobSpec>(const std::string& job_id)>;

class GarbageCollector {
 public:
  // `data_dir` holds jobs/<id>/; `blobs` is the store under it. Both pointers, and whatever `specs`
  // calls, must outlive this. `specs` may be empty (offline: every spec is parsed from its text); given,
  // it is the only source of specs.
  GarbageCollector(std::string data_dir, StateStore* store, BlobStore* blobs, JobSpecLookup specs = nullptr);

  // Scans the data dir and the job table. Errors: INTERNAL naming the folder that cannot be read.
  StatusOr<GcSnapshot> Scan();
  // Scans, plans and (unless `dry_run`) removes. A blob or partial upload that became busy or was
  // used since the scan is kept; a job folder is removed only when it is <data_dir>/jobs/<id> of a
  // final job. Per-entry failures go to GcResult::errors; the run goes on.
  StatusOr<GcResult> Run(const GcPolicy& policy, bool dry_run) EXCLUDES(run_mu_);

  // Bytes held by blobs and partial uploads (a directory listing; no hashing).
  StatusOr<uint64_t> StoreBytes();

 private:
  Status RemoveJobFolder(const GcEntry& job) REQUIRES(run_mu_);
  // The job's spec from `specs_` when given (null when it holds none), else parsed from its text (null
  // when it does not parse).
  std::shared_ptr<const JobSpec> SpecOf(const JobRecord& job) const;

  const std::string data_dir_;
  StateStore* store_;
  BlobStore* blobs_;
  const JobSpecLookup specs_;
  Mutex run_mu_;  // one Run at a time (it guards no field: the store and the folders are shared)
};

// `defaults` with the request's non-zero fields. INVALID_ARGUMENT naming the field for a negative
// age (job_max_age_s may be -1: keep every job folder).
StatusOr<GcPolicy> GcPolicyFromRequest(const ::sftctl::v1::CollectGarbageRequest& req, GcPolicy defaults);

// The wire form of a result (CollectGarbage), and its rendering for `sftd gc` (one line per entry,
// then a total; names are hex digests and job ids, so nothing needs escaping).
void ToProto(const GcResult& result, ::sftctl::v1::CollectGarbageResponse* out);
std::string FormatGcReport(const ::sftctl::v1::CollectGarbageResponse& resp, bool dry_run);

// Automatic collection: every `interval`, when blobs and partial uploads hold more than
// policy.max_store_bytes (> 0) or the data dir's file system has less than `min_free_pct` percent free,
// runs the collector with `policy`, tightening its size cap by the bytes missing to `min_free_pct`.
// Job folders still go by age only.
//
// Thread safety: Start and Stop from one thread; CheckOnce from any.
class AutoGc {
 public:
  AutoGc(GarbageCollector* gc, std::string data_dir, GcPolicy policy, std::chrono::seconds interval,
         int min_free_pct);
  ~AutoGc() { Stop(); }
  // The checking thread: CheckOnce at once, then every `interval` (common/os/periodic_thread.h).
  void Start() { checks_.Start(); }
  // Returns once a collection in progress ended.
  void Stop() { checks_.Stop(); }
  // One check; true when it found the store over its threshold and ran the collector.
  bool CheckOnce();

 private:
  GarbageCollector* gc_;
  const std::string data_dir_;
  const GcPolicy policy_;
  const std::chrono::seconds interval_;
  const int min_free_pct_;
  PeriodicThread checks_;  // last: stopped before the members CheckOnce reads go
};

}  // namespace sftctl::agent
