#include "agent/state/gc.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "agent/state/job_spec.h"
#include "common/os/file_system.h"
#include "common/sha256.h"
#include "common/spec/spec.h"

namespace sftctl::agent {
namespace {

namespace fs = std::filesystem;

int64_t NowS() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string DescribeAge(int64_t s) {
  if (s >= 2 * 86400) return std::to_string(s / 86400) + " days";
  if (s >= 7200) return std::to_string(s / 3600) + " hours";
  return std::to_string(s / 60) + " minutes";
}

// The files named by 64-hex-digit names in `dir` (other names are not the store's and are left alone).
StatusOr<std::vector<GcEntry>> ListShaFiles(const std::string& dir) {
  std::vector<GcEntry> out;
  SFT_ASSIGN_OR_RETURN(std::vector<std::string> names, FileSystem::Default()->ListDir(dir));
  for (const std::string& name : names) {
    if (!IsSha256Hex(name)) continue;
    std::string path = JoinPath(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    out.push_back({name, path, static_cast<uint64_t>(st.st_size), static_cast<int64_t>(st.st_mtime)});
  }
  return out;
}

// Bytes of the regular files below `dir` (links are not followed); errors count as zero.
uint64_t TreeBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    std::error_code fec;
    if (it->is_regular_file(fec) && !it->is_symlink(fec)) total += it->file_size(fec);
  }
  return total;
}

// The blobs a job's rewritten spec names (every string of its canonical JSON, ToJson, that is
// <blobs_dir>/<sha256>: a blob reference may name any string field), and the blobs its inputs/ folder
// links to by symlink (hard links keep their data whatever gc does). `spec` may be null.
void CollectReferences(const JobRecord& job, const JobSpec* spec, const std::string& blobs_dir,
                       std::set<std::string>* out) {
  const std::string prefix = blobs_dir + "/";
  auto note = [&](const std::string& path) {
    if (path.rfind(prefix, 0) == 0 && IsSha256Hex(path.substr(prefix.size()))) {
      out->insert(path.substr(prefix.size()));
    }
  };
  if (spec != nullptr) {
    const nlohmann::json json = ToJson(*spec);
    std::vector<const nlohmann::json*> todo = {&json};
    while (!todo.empty()) {
      const nlohmann::json* j = todo.back();
      todo.pop_back();
      if (j->is_string()) note(j->get_ref<const std::string&>());
      if (j->is_structured()) {
        for (const auto& child : *j) todo.push_back(&child);
      }
    }
  }
  std::error_code ec;
  for (fs::recursive_directory_iterator it(job.job_dir + "/inputs", ec), end; !ec && it != end;
       it.increment(ec)) {
    std::error_code lec;
    if (it->is_symlink(lec)) note(fs::read_symlink(it->path(), lec).string());
  }
}

}  // namespace

const char* GcKindName(GcKind kind) {
  switch (kind) {
    case GcKind::kBlob:
      return "blob";
    case GcKind::kPartial:
      return "partial";
    case GcKind::kJobFolder:
      return "job";
  }
  return "?";
}

std::vector<GcRemoval> PlanGc(const GcSnapshot& snap, const GcPolicy& policy, int64_t now_s) {
  std::vector<GcRemoval> out;
  const int64_t fresh_after = now_s - std::max<int64_t>(0, policy.min_age_s);
  auto idle_for = [&](const GcEntry& e) { return now_s - e.mtime_s; };
  // Candidates for the size cap: unreferenced, not fresh, not already removed by age.
  std::vector<std::pair<GcKind, const GcEntry*>> spare;
  uint64_t store = 0;
  auto by_age = [&](GcKind kind, const std::vector<GcEntry>& entries, int64_t max_age) {
    for (const GcEntry& e : entries) {
      store += e.bytes;
      if (kind == GcKind::kBlob && snap.referenced.count(e.name)) continue;
      if (e.mtime_s >= fresh_after) continue;
      if (idle_for(e) > max_age) {
        out.push_back({kind, e, "unused for " + DescribeAge(idle_for(e))});
        store -= e.bytes;
      } else {
        spare.push_back({kind, &e});
      }
    }
  };
  by_age(GcKind::kBlob, snap.blobs, policy.blob_max_age_s);
  by_age(GcKind::kPartial, snap.partials, policy.partial_max_age_s);
  if (policy.max_store_bytes > 0 && store > policy.max_store_bytes) {
    // Least recently used first; blobs before partial uploads of the same age (a partial is work
    // a client may be about to resume).
    std::stable_sort(spare.begin(), spare.end(), [](const auto& a, const auto& b) {
      if (a.second->mtime_s != b.second->mtime_s) return a.second->mtime_s < b.second->mtime_s;
      return a.first == GcKind::kBlob && b.first != GcKind::kBlob;
    });
    const std::string why = "store over " + std::to_string(policy.max_store_bytes) + " bytes";
    for (const auto& [kind, e] : spare) {
      if (store <= policy.max_store_bytes) break;
      out.push_back({kind, *e, why});
      store -= e->bytes;
    }
  }
  if (policy.job_max_age_s > 0) {
    for (const GcEntry& job : snap.finished_jobs) {
      if (idle_for(job) > policy.job_max_age_s && job.mtime_s < fresh_after) {
        out.push_back({GcKind::kJobFolder, job, "finished " + DescribeAge(idle_for(job)) + " ago"});
      }
    }
  }
  return out;
}

GarbageCollector::GarbageCollector(std::string data_dir, StateStore* store, BlobStore* blobs,
                                   JobSpecLookup specs)
    : data_dir_(std::move(data_dir)), store_(store), blobs_(blobs), specs_(std::move(specs)) {}

std::shared_ptr<const JobSpec> GarbageCollector::SpecOf(const JobRecord& job) const {
  if (specs_) return specs_(job.id);  // the running agent's: never its text again
  StatusOr<std::shared_ptr<const JobSpec>> parsed = ParseStoredSpec(job.spec_json, job.id + " spec");
  return parsed.ok() ? *parsed : nullptr;
}

StatusOr<uint64_t> GarbageCollector::StoreBytes() {
  uint64_t total = 0;
  for (const std::string& dir : {blobs_->dir(), blobs_->PartialDir()}) {
    SFT_ASSIGN_OR_RETURN(std::vector<GcEntry> files, ListShaFiles(dir));
    for (const GcEntry& f : files) total += f.bytes;
  }
  return total;
}

StatusOr<GcSnapshot> GarbageCollector::Scan() {
  GcSnapshot snap;
  // Jobs first: a blob uploaded after this listing is fresh (min_age_s) and so kept.
  SFT_ASSIGN_OR_RETURN(std::vector<JobRecord> jobs, store_->ListJobs());
  for (const JobRecord& job : jobs) {
    if (!IsFinal(job.state)) {
      CollectReferences(job, SpecOf(job).get(), blobs_->dir(), &snap.referenced);
    } else if (!job.job_dir.empty() && FileSystem::Default()->IsDirectory(job.job_dir)) {
      snap.finished_jobs.push_back({job.id, job.job_dir, TreeBytes(job.job_dir), job.finished_ms / 1000});
    }
  }
  SFT_ASSIGN_OR_RETURN(snap.blobs, ListShaFiles(blobs_->dir()));
  SFT_ASSIGN_OR_RETURN(snap.partials, ListShaFiles(blobs_->PartialDir()));
  return snap;
}

Status GarbageCollector::RemoveJobFolder(const GcEntry& job) {
  // Only <data_dir>/jobs/<id>, never a path a damaged database might hold.
  const std::string expected = JoinPath(JoinPath(data_dir_, "jobs"), job.name);
  if (job.path != expected || job.name.empty() || job.name.find('/') != std::string::npos ||
      job.name[0] == '.') {
    return FailedPreconditionError("folder " + job.path + " is not " + expected);
  }
  std::error_code ec;
  fs::remove_all(job.path, ec);  // removes symlinks themselves, never what they point to
  if (ec) return InternalError("cannot remove " + job.path + ": " + ec.message());
  return OkStatus();
}

StatusOr<GcResult> GarbageCollector::Run(const GcPolicy& policy, bool dry_run) {
  MutexLock lock(&run_mu_);
  const int64_t now = NowS();
  SFT_ASSIGN_OR_RETURN(GcSnapshot snap, Scan());
  GcResult result;
  result.referenced_blobs = snap.referenced.size();
  for (const auto* list : {&snap.blobs, &snap.partials}) {
    for (const GcEntry& e : *list) result.store_bytes += e.bytes;
  }
  for (GcRemoval& r : PlanGc(snap, policy, now)) {
    Status s = OkStatus();
    if (!dry_run) {
      s = r.kind == GcKind::kJobFolder
              ? RemoveJobFolder(r.entry)
              : blobs_->RemoveIfUnused(r.entry.name, r.kind == GcKind::kPartial, r.entry.mtime_s + 1);
    }
    if (!s.ok()) {
      result.errors.push_back(std::string(GcKindName(r.kind)) + " " + r.entry.name + ": " + s.message());
      continue;
    }
    result.bytes_freed += r.entry.bytes;
    result.removed.push_back(std::move(r));
  }
  return result;
}

StatusOr<GcPolicy> GcPolicyFromRequest(const ::sftctl::v1::CollectGarbageRequest& req, GcPolicy policy) {
  auto age = [](const char* field, int64_t v, int64_t* out, bool allow_never) -> Status {
    if (v == 0) return OkStatus();
    if (v < 0 && !(allow_never && v == -1)) {
      return InvalidArgumentError(std::string(field) + ": must be positive" + (allow_never ? " or -1" : ""));
    }
    *out = v;
    return OkStatus();
  };
  SFT_RETURN_IF_ERROR(age("blob_max_age_s", req.blob_max_age_s(), &policy.blob_max_age_s, false));
  SFT_RETURN_IF_ERROR(age("partial_max_age_s", req.partial_max_age_s(), &policy.partial_max_age_s, false));
  SFT_RETURN_IF_ERROR(age("job_max_age_s", req.job_max_age_s(), &policy.job_max_age_s, true));
  if (req.max_store_bytes() > 0) policy.max_store_bytes = req.max_store_bytes();
  return policy;
}

void ToProto(const GcResult& result, ::sftctl::v1::CollectGarbageResponse* out) {
  for (const GcRemoval& r : result.removed) {
    auto* p = out->add_removed();
    p->set_kind(GcKindName(r.kind));
    p->set_name(r.entry.name);
    p->set_bytes(r.entry.bytes);
    p->set_why(r.why);
  }
  out->set_bytes_freed(result.bytes_freed);
  out->set_referenced_blobs(static_cast<uint32_t>(result.referenced_blobs));
  out->set_store_bytes(result.store_bytes);
  for (const std::string& e : result.errors) out->add_errors(e);
}

std::string FormatGcReport(const ::sftctl::v1::CollectGarbageResponse& resp, bool dry_run) {
  std::string out;
  for (const auto& r : resp.removed()) {
    out += (dry_run ? "would remove " : "removed ") + r.kind() + " " + r.name() + " (" +
           std::to_string(r.bytes()) + " bytes): " + r.why() + "\n";
  }
  for (const std::string& e : resp.errors()) out += "kept " + e + "\n";
  out += std::string(dry_run ? "would free " : "freed ") + std::to_string(resp.bytes_freed()) + " bytes in " +
         std::to_string(resp.removed_size()) + " entries; kept " + std::to_string(resp.referenced_blobs()) +
         " blobs that queued or running jobs use; blob store held " + std::to_string(resp.store_bytes()) +
         " bytes\n";
  return out;
}

AutoGc::AutoGc(GarbageCollector* gc, std::string data_dir, GcPolicy policy, std::chrono::seconds interval,
               int min_free_pct)
    : gc_(gc),
      data_dir_(std::move(data_dir)),
      policy_(policy),
      interval_(interval),
      min_free_pct_(min_free_pct),
      checks_(interval_, [this] { CheckOnce(); }) {}

bool AutoGc::CheckOnce() {
  auto store = gc_->StoreBytes();
  if (!store.ok()) return false;
  GcPolicy policy = policy_;
  const bool over_cap = policy.max_store_bytes > 0 && *store > policy.max_store_bytes;
  struct statvfs vfs;
  bool low_disk = false;
  if (min_free_pct_ > 0 && ::statvfs(data_dir_.c_str(), &vfs) == 0 && vfs.f_blocks > 0) {
    const uint64_t block = vfs.f_frsize;
    const uint64_t want_free = static_cast<uint64_t>(vfs.f_blocks) * block * min_free_pct_ / 100;
    const uint64_t free = static_cast<uint64_t>(vfs.f_bavail) * block;
    if (free < want_free) {
      low_disk = true;
      const uint64_t need = want_free - free;
      const uint64_t cap = *store > need ? *store - need : 1;
      if (policy.max_store_bytes == 0 || cap < policy.max_store_bytes) policy.max_store_bytes = cap;
    }
  }
  if (!over_cap && !low_disk) return false;
  auto result = gc_->Run(policy, /*dry_run=*/false);
  if (!result.ok()) {
    spdlog::warn("automatic gc: {}", result.status().ToString());
    return true;
  }
  spdlog::info("automatic gc ({}): removed {} entries, {} bytes; {} errors",
               low_disk ? "low disk" : "store over cap", result->removed.size(), result->bytes_freed,
               result->errors.size());
  return true;
}

}  // namespace sftctl::agent
