#include "common/object_store/checkpoint_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/json_parse.h"
#include "common/object_store/manifest_key.h"
#include "common/safe_path.h"
#include "common/sha256.h"
#include "common/terminal_text.h"

namespace sftctl {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kManifestFormat = 1;

// The ETag S3 gives `path` uploaded by UploadFile with `part_size` (the MD5 of a single PUT; for a
// multipart upload the MD5 of the parts' binary MD5s, "-" and the part count), and its sha256.
Status LocalDigests(const std::string& path, uint64_t size, uint64_t part_size, std::string* etag,
                    std::string* sha256) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", path, errno);
  Sha256 sha;
  std::string part_md5s, whole;
  const uint64_t part = std::max(part_size, TransferOptions::kMinPartSize);
  std::string buf;
  Status st;
  for (uint64_t off = 0; off < size || (size == 0 && off == 0); off += part) {
    buf.resize(std::min(part, size - off));
    if (!buf.empty() &&
        ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off)) != static_cast<ssize_t>(buf.size())) {
      st = DataLossError(path + ": short read (changed while uploading?)");
      break;
    }
    sha.Update(buf);
    whole = Md5Hex(buf);
    for (size_t i = 0; i < whole.size(); i += 2)
      part_md5s += static_cast<char>(std::stoi(whole.substr(i, 2), nullptr, 16));
    if (size == 0) break;
  }
  ::close(fd);
  SFT_RETURN_IF_ERROR(st);
  const uint64_t parts = size == 0 ? 1 : (size + part - 1) / part;
  *etag = size <= part ? whole : Md5Hex(part_md5s) + "-" + std::to_string(parts);
  *sha256 = sha.HexDigest();
  return Status();
}

// Relative paths of the regular files under `dir`, sorted ("sub/a.json").
StatusOr<std::vector<std::string>> FilesUnder(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) out.push_back(fs::relative(it->path(), dir, ec).generic_string());
  }
  if (ec) return InternalError(dir + ": cannot list: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

namespace {

// The manifest's fields but its signature.
json UnsignedObject(const CheckpointManifest& m) {
  json files = json::array();
  for (const ManifestFile& f : m.files)
    files.push_back({{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}});
  return json{{"format", kManifestFormat}, {"step", m.step}, {"name", m.name}, {"files", files}};
}

}  // namespace

std::string CheckpointManifest::UnsignedJson() const { return UnsignedObject(*this).dump(1) + "\n"; }

std::string CheckpointManifest::ToJson() const {
  json j = UnsignedObject(*this);
  if (!signature.empty()) j["signature"] = signature;
  return j.dump(1) + "\n";
}

namespace {

// One entry of a manifest's "files"; `where` names the manifest. Errors: the field readers'
// (common/json_parse.h), INVALID_ARGUMENT.
StatusOr<ManifestFile> ParseManifestFile(const json& f, const std::string& where) {
  ManifestFile mf;
  SFT_ASSIGN_OR_RETURN(mf.path, JsonField<std::string>(f, "path", where + ": a file entry"));
  const std::string entry = where + ": '" + mf.path + "'";
  SFT_ASSIGN_OR_RETURN(mf.size, JsonField<uint64_t>(f, "size", entry));
  SFT_ASSIGN_OR_RETURN(mf.sha256, JsonField<std::string>(f, "sha256", entry));
  return mf;
}

// ParseManifest's checks, each error INVALID_ARGUMENT naming `where` (ParseManifest makes it DATA_LOSS).
StatusOr<CheckpointManifest> ReadManifest(const json& j, const std::string& where) {
  auto format = OptionalJsonField<int64_t>(j, "format", where);
  if (!format.ok() || *format != kManifestFormat)
    return InvalidArgumentError(where + ": unknown format (this sftctl reads format " +
                                std::to_string(kManifestFormat) + ")");
  CheckpointManifest m;
  SFT_ASSIGN_OR_RETURN(m.name, JsonField<std::string>(j, "name", where));
  SFT_ASSIGN_OR_RETURN(m.step, JsonField<int64_t>(j, "step", where));
  SFT_ASSIGN_OR_RETURN(m.signature, JsonFieldOr<std::string>(j, "signature", std::string(), where));
  if (CheckpointStep(m.name) != m.step)
    return InvalidArgumentError(where + ": name '" + m.name + "' is not step " + std::to_string(m.step));
  SFT_ASSIGN_OR_RETURN(const json files, JsonField<json>(j, "files", where));
  if (!files.is_array()) return InvalidArgumentError(where + ": 'files' is not a list");
  std::set<std::string> seen;
  for (const json& f : files) {
    SFT_ASSIGN_OR_RETURN(ManifestFile mf, ParseManifestFile(f, where));
    if (Status st = CheckRelativePath(mf.path); !st.ok())
      return InvalidArgumentError(where + ": " + st.message());
    if (mf.path == kManifestName || !seen.insert(mf.path).second)
      return InvalidArgumentError(where + ": '" + mf.path + "' listed twice");
    if (!IsSha256Hex(mf.sha256))
      return InvalidArgumentError(where + ": '" + mf.path + "': sha256 is not 64 hex digits");
    m.files.push_back(std::move(mf));
  }
  return m;
}

}  // namespace

StatusOr<CheckpointManifest> ParseManifest(std::string_view text, const std::string& where) {
  auto j = ParseJson(text, where);
  if (!j.ok()) return DataLossError(j.status().message());
  auto m = ReadManifest(*j, where + ": not a checkpoint manifest");
  if (!m.ok()) return DataLossError(m.status().message());
  return m;
}

namespace {

// The manifest at `key` under `loc`, read and checked, naming the folder it sits in.
StatusOr<CheckpointManifest> ReadBucketManifest(const S3Client& s3, const S3Location& loc,
                                                const std::string& key) {
  SFT_ASSIGN_OR_RETURN(std::string text, s3.GetObject(loc.bucket, key, 16ull << 20));
  SFT_ASSIGN_OR_RETURN(CheckpointManifest m, ParseManifest(text, S3ObjectName(loc.bucket, key)));
  if (loc.Key(m.name + "/" + kManifestName) != key)
    return DataLossError(S3ObjectName(loc.bucket, key) + ": the manifest names another folder, '" + m.name +
                         "'");
  return m;
}

}  // namespace

StatusOr<std::optional<CheckpointManifest>> NewestBucketCheckpoint(const S3Client& s3, const S3Location& loc,
                                                                   const std::string& run_key) {
  const std::string base = loc.prefix.empty() ? "" : loc.prefix + "/";
  SFT_ASSIGN_OR_RETURN(auto objects, s3.ListObjects(loc.bucket, base));
  std::map<int64_t, std::string> manifests;  // by step
  for (const S3ObjectInfo& o : objects) {
    const std::string rel = o.key.substr(base.size());
    const size_t slash = rel.find('/');
    if (slash == std::string::npos || rel.substr(slash + 1) != kManifestName) continue;
    const int64_t step = CheckpointStep(rel.substr(0, slash));
    if (step >= 0) manifests[step] = o.key;
  }
  if (manifests.empty()) return std::optional<CheckpointManifest>();
  if (run_key.empty()) {
    SFT_ASSIGN_OR_RETURN(CheckpointManifest m, ReadBucketManifest(s3, loc, manifests.rbegin()->second));
    return std::optional<CheckpointManifest>(std::move(m));
  }
  // Newest first, each manifest one GET: a bucket filled with strangers costs at most kMaxTried of
  // them, and the message names at most kMaxNamed.
  constexpr size_t kMaxTried = 64, kMaxNamed = 5;
  size_t tried = 0;
  std::string names;
  for (auto it = manifests.rbegin(); it != manifests.rend() && tried < kMaxTried; ++it, ++tried) {
    SFT_ASSIGN_OR_RETURN(CheckpointManifest m, ReadBucketManifest(s3, loc, it->second));
    if (SignatureMatches(run_key, m.UnsignedJson(), m.signature))
      return std::optional<CheckpointManifest>(std::move(m));
    if (tried < kMaxNamed) names += (names.empty() ? "" : ", ") + EscapeForTerminal(m.name);
  }
  if (tried > kMaxNamed) names += " and " + std::to_string(tried - kMaxNamed) + " older ones";
  const std::string scope = tried < manifests.size() ? "among its newest " + std::to_string(tried) + " " : "";
  return FailedPreconditionError(loc.Url() + ": no checkpoint there " + scope +
                                 "is signed with this run's key (" + names +
                                 " are not: written by another run or by an older sftctl, or planted); to "
                                 "resume from one anyway: sftctl pull " +
                                 loc.Url() + " DIR, then resume from DIR/checkpoint-N");
}

Status DownloadCheckpoint(const S3Client& s3, const S3Location& loc, const CheckpointManifest& m,
                          const std::string& dest_dir, const TransferOptions& opt,
                          const std::function<void(const std::string&)>& progress) {
  SFT_ASSIGN_OR_RETURN(const std::string folder, PathBeneath(dest_dir, m.name));
  std::vector<const ManifestFile*> order;
  for (const ManifestFile& f : m.files) order.push_back(&f);
  // The completion marker last: the folder is a complete checkpoint only once all else is there.
  std::stable_partition(order.begin(), order.end(), [](const ManifestFile* f) { return f->path != "DONE"; });
  for (const ManifestFile* f : order) {
    SFT_ASSIGN_OR_RETURN(const std::string dest, PathBeneath(folder, f->path));
    std::error_code ec;
    fs::create_directories(fs::path(dest).parent_path(), ec);
    if (ec) return InternalError(fs::path(dest).parent_path().string() + ": cannot create: " + ec.message());
    if (fs::is_regular_file(dest, ec) && fs::file_size(dest, ec) == f->size) {
      auto have = Sha256File(dest);
      if (have.ok() && *have == f->sha256) continue;  // an earlier, interrupted pull's
    }
    SFT_RETURN_IF_ERROR(
        DownloadFile(s3, loc.bucket, loc.Key(m.name + "/" + f->path), f->size, f->sha256, dest, opt));
    if (progress) progress(f->path);
  }
  return Status();
}

Status UploadCheckpoint(const S3Client& s3, const S3Location& loc, const std::string& dir,
                        const TransferOptions& opt, CheckpointManifest* manifest,
                        const std::string& run_key) {
  CheckpointManifest m;
  m.name = fs::path(dir).filename().string();
  m.step = CheckpointStep(m.name);
  if (m.step < 0) return InvalidArgumentError(dir + ": not a checkpoint-<step> folder");
  SFT_ASSIGN_OR_RETURN(auto files, FilesUnder(dir));
  std::map<std::string, S3ObjectInfo> there;  // what an earlier, interrupted upload left
  SFT_ASSIGN_OR_RETURN(auto listed, s3.ListObjects(loc.bucket, loc.Key(m.name + "/")));
  for (S3ObjectInfo& o : listed) there[o.key] = std::move(o);
  for (const std::string& rel : files) {
    if (rel == kManifestName) continue;
    const std::string path = dir + "/" + rel, key = loc.Key(m.name + "/" + rel);
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return InternalError(path + ": " + ec.message());
    std::string etag, sha;
    SFT_RETURN_IF_ERROR(LocalDigests(path, size, opt.part_size, &etag, &sha));
    auto it = there.find(key);
    if (it == there.end() || it->second.size != size || it->second.etag != etag)
      SFT_RETURN_IF_ERROR(UploadFile(s3, loc.bucket, key, path, opt));
    m.files.push_back({rel, size, sha});
  }
  if (!run_key.empty()) m.signature = SignManifest(run_key, m.UnsignedJson());
  SFT_RETURN_IF_ERROR(s3.PutObject(loc.bucket, loc.Key(m.name + "/" + kManifestName), m.ToJson()));
  if (manifest != nullptr) *manifest = std::move(m);
  return Status();
}

StatusOr<std::vector<std::string>> PruneBucketCheckpoints(const S3Client& s3, const S3Location& loc,
                                                          int64_t keep) {
  struct Folder {
    std::string name;
    bool complete = false;
    std::vector<std::string> keys;  // every object but the manifest
  };
  const std::string base = loc.prefix.empty() ? "" : loc.prefix + "/";
  SFT_ASSIGN_OR_RETURN(auto objects, s3.ListObjects(loc.bucket, base));
  std::map<int64_t, Folder> folders;
  for (const S3ObjectInfo& o : objects) {
    const std::string rel = o.key.substr(base.size());
    const size_t slash = rel.find('/');
    const int64_t step = slash == std::string::npos ? -1 : CheckpointStep(rel.substr(0, slash));
    if (step < 0) continue;
    Folder& f = folders[step];
    f.name = rel.substr(0, slash);
    if (rel.substr(slash + 1) == kManifestName)
      f.complete = true;
    else
      f.keys.push_back(o.key);
  }
  std::vector<int64_t> complete;
  for (const auto& [step, f] : folders)
    if (f.complete) complete.push_back(step);
  if (complete.empty()) return std::vector<std::string>();
  const size_t kept = static_cast<size_t>(std::max<int64_t>(keep, 1));
  const std::set<int64_t> keep_steps(complete.end() - std::min(kept, complete.size()), complete.end());
  std::vector<std::string> removed;
  for (const auto& [step, f] : folders) {
    // Kept, or newer than the newest complete one (an upload that may be under way).
    if (keep_steps.count(step) || step > complete.back()) continue;
    if (f.complete) SFT_RETURN_IF_ERROR(s3.DeleteObject(loc.bucket, loc.Key(f.name + "/" + kManifestName)));
    for (const std::string& key : f.keys) SFT_RETURN_IF_ERROR(s3.DeleteObject(loc.bucket, key));
    SFT_ASSIGN_OR_RETURN(auto uploads, s3.ListMultipartUploads(loc.bucket, loc.Key(f.name + "/")));
    for (const S3MultipartUpload& u : uploads)
      SFT_RETURN_IF_ERROR(s3.AbortMultipartUpload(loc.bucket, u.key, u.upload_id));
    removed.push_back(f.name);
  }
  return removed;
}

}  // namespace sftctl
