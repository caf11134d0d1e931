#include "agent/state/artifacts.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "common/checkpoint_name.h"
#include "common/sha256.h"

namespace sftctl::agent {
namespace fs = std::filesystem;

namespace {

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

}  // namespace

StatusOr<std::string> ResolveInside(const std::string& root, const std::string& rel) {
  if (rel.empty()) return InvalidArgumentError("path: empty");
  if (rel.front() == '/')
    return InvalidArgumentError("path: '" + rel + "' is absolute; give it relative to the job folder");
  size_t start = 0;
  while (start <= rel.size()) {
    size_t slash = rel.find('/', start);
    if (slash == std::string::npos) slash = rel.size();
    if (rel.compare(start, slash - start, "..") == 0 && slash - start == 2) {
      return InvalidArgumentError("path: '" + rel + "' contains a '..' component");
    }
    start = slash + 1;
  }
  char real_root[PATH_MAX];
  if (::realpath(root.c_str(), real_root) == nullptr) return ErrnoError("cannot resolve", root, errno);
  std::string joined = std::string(real_root) + "/" + rel;
  char real[PATH_MAX];
  if (::realpath(joined.c_str(), real) == nullptr) {
    if (errno == ENOENT || errno == ENOTDIR)
      return NotFoundError("path: '" + rel + "' not found in the job folder");
    return ErrnoError("cannot resolve", joined, errno);
  }
  std::string prefix = std::string(real_root) + "/";
  if (std::string(real).compare(0, prefix.size(), prefix) != 0) {
    return PermissionDeniedError("path: '" + rel + "' resolves outside the job folder");
  }
  struct stat st;
  if (::stat(real, &st) != 0) return ErrnoError("cannot stat", real, errno);
  if (!S_ISREG(st.st_mode)) return FailedPreconditionError("path: '" + rel + "' is not a regular file");
  return std::string(real);
}

StatusOr<std::string> Artifacts::Hash(const std::string& job_id, const std::string& rel,
                                      const std::string& abs) {
  struct stat st;
  if (::stat(abs.c_str(), &st) != 0) return ErrnoError("cannot stat", abs, errno);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (auto cached = store_->CachedHash(job_id, rel, size, MtimeNs(st))) return *cached;
  SFT_ASSIGN_OR_RETURN(std::string sha, Sha256File(abs));
  struct stat after;
  // Only cache when the file did not change while hashing.
  if (::stat(abs.c_str(), &after) == 0 && static_cast<uint64_t>(after.st_size) == size &&
      MtimeNs(after) == MtimeNs(st)) {
    SFT_RETURN_IF_ERROR(store_->PutCachedHash(job_id, rel, size, MtimeNs(st), sha));
  }
  return sha;
}

StatusOr<std::vector<ArtifactInfo>> Artifacts::List(const std::string& job_id, const std::string& job_dir) {
  std::vector<ArtifactInfo> out;
  fs::path run = fs::path(job_dir) / "run";
  std::error_code ec;
  if (!fs::is_directory(run, ec)) return out;
  std::vector<std::string> rels;
  // A folder the trainer removes while it is walked (checkpoint rotation) ends the walk with
  // ENOENT: walk again, a few times.
  for (int attempt = 1;; ++attempt) {
    try {
      rels.clear();
      for (auto it = fs::recursive_directory_iterator(run, fs::directory_options::skip_permission_denied);
           it != fs::recursive_directory_iterator(); ++it) {
        if (it->is_symlink() || !it->is_regular_file()) continue;
        rels.push_back("run/" + fs::relative(it->path(), run).string());
      }
      break;
    } catch (const fs::filesystem_error& e) {
      if (e.code() != std::errc::no_such_file_or_directory || attempt == 5)
        return InternalError(std::string("cannot list '") + run.string() + "': " + e.what());
    }
  }
  std::sort(rels.begin(), rels.end());
  for (const std::string& rel : rels) {
    std::string abs = job_dir + "/" + rel;
    struct stat st;
    if (::lstat(abs.c_str(), &st) != 0) continue;  // vanished meanwhile
    ArtifactInfo a;
    a.path = rel;
    a.size = static_cast<uint64_t>(st.st_size);
    a.mtime_ms = MtimeNs(st) / 1000000;
    // "run/<top>/..." -> a checkpoint when <top> is a checkpoint folder.
    size_t slash = rel.find('/', 4);
    if (slash != std::string::npos) {
      std::string top = rel.substr(4, slash - 4);
      a.checkpoint_step = CheckpointStep(top);
      if (a.checkpoint_step >= 0) {
        struct stat done;
        a.checkpoint_complete = ::stat((job_dir + "/run/" + top + "/DONE").c_str(), &done) == 0;
      }
    }
    StatusOr<std::string> sha = Hash(job_id, rel, abs);
    if (sha.status().code() == StatusCode::kNotFound) continue;  // the trainer rotated it away meanwhile
    SFT_RETURN_IF_ERROR(sha.status());
    a.sha256 = std::move(*sha);
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace sftctl::agent
