#include "common/hub/hub_commit.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include "common/json_parse.h"
#include "common/safe_path.h"
#include "common/sha256.h"

namespace sftctl {

// One file of a commit, as it is sent.
struct HubCommitter::Entry {
  HubCommitFile file;
  uint64_t size = 0;
  bool lfs = false;    // the Hub said "lfs" in the preupload answer
  std::string sha256;  // LFS files only
};

namespace {

constexpr uint64_t kSampleBytes = 512;  // what preupload sees of a file

std::string Base64(std::string_view in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    for (int s : {18, 12, 6}) out += kAlphabet[(v >> s) & 63];
    out += '=';
  }
  return out;
}

StatusOr<std::string> ReadPrefix(const std::string& path, uint64_t n) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return ErrnoError("cannot open", path, errno);
  std::string buf(n, '\0');
  buf.resize(std::fread(buf.data(), 1, n, f));
  std::fclose(f);
  return buf;
}

// The Hub's own message of an error answer ({"error": "..."}), "" if it has none.
std::string HubMessage(const HttpResponse& r) {
  StatusOr<nlohmann::json> j = ParseJson(r.body, "the Hub's error");
  if (j.ok() && j->is_object() && j->contains("error") && (*j)["error"].is_string())
    return (*j)["error"].get<std::string>();
  return "";
}

bool Retryable(long status) { return status >= 500 || status == 429; }

}  // namespace

HubCommitter::HubCommitter(HubOptions options) : opt_(std::move(options)) {
  if (opt_.http == nullptr) opt_.http = CurlHttpClient();
  if (opt_.max_attempts < 1) opt_.max_attempts = 1;
}

std::vector<std::pair<std::string, std::string>> HubCommitter::Headers(const std::string& url) const {
  std::vector<std::pair<std::string, std::string>> h;
  if (!opt_.token.empty() && UrlOrigin(url) == UrlOrigin(opt_.endpoint))
    h.emplace_back("Authorization", "Bearer " + opt_.token);
  return h;
}

StatusOr<HttpResponse> HubCommitter::Send(const HttpRequest& req, const std::string& what) {
  StatusOr<HttpResponse> r = UnavailableError(what + ": not sent");
  for (int attempt = 1; attempt <= opt_.max_attempts; ++attempt) {
    if (attempt > 1) std::this_thread::sleep_for(std::chrono::milliseconds(250 << std::min(attempt, 6)));
    r = opt_.http->Send(req);
    if (r.ok() && !Retryable(r->status)) return r;
    if (!r.ok() && r.status().code() != StatusCode::kUnavailable) return r;
  }
  if (!r.ok()) return r.status().WithContext(what + " (" + std::to_string(opt_.max_attempts) + " attempts)");
  return r;  // a 5xx or 429 after the last attempt: HttpError says so
}

Status HubCommitter::HttpError(const std::string& repo_id, const HttpResponse& r,
                               const std::string& what) const {
  const std::string hub = HubMessage(r);
  const std::string tail = hub.empty() ? "" : " (the Hub says: " + hub + ")";
  const std::string repo = "hf://" + repo_id;
  if (r.status == 401 || r.status == 403) {
    return PermissionDeniedError(repo + ": " + what + ": HTTP " + std::to_string(r.status) + ": " +
                                 (opt_.token.empty()
                                      ? "no token was sent; uploading needs a token with write access to " +
                                            repo_id + ": set HF_TOKEN (or run `huggingface-cli login`)"
                                      : "the token was refused: it needs write access to " + repo_id) +
                                 tail);
  }
  if (r.status == 404) return NotFoundError(repo + ": " + what + ": not found (HTTP 404)" + tail);
  if (Retryable(r.status)) {
    return UnavailableError(repo + ": " + what + ": HTTP " + std::to_string(r.status) + " after " +
                            std::to_string(opt_.max_attempts) + " attempts" + tail);
  }
  return FailedPreconditionError(repo + ": " + what + ": HTTP " + std::to_string(r.status) + tail);
}

Status HubCommitter::EnsureRepo(const std::string& repo_id, bool private_repo) {
  const size_t slash = repo_id.find('/');
  nlohmann::json body = {{"type", "model"}, {"private", private_repo}};
  body["name"] = slash == std::string::npos ? repo_id : repo_id.substr(slash + 1);
  if (slash != std::string::npos) body["organization"] = repo_id.substr(0, slash);
  HttpRequest req;
  req.method = "POST";
  req.url = opt_.endpoint + "/api/repos/create";
  req.headers = Headers(req.url);
  req.headers.emplace_back("Content-Type", "application/json");
  req.body = body.dump();
  SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(req, "hf://" + repo_id + ": creating the repository"));
  if (r.status == 200 || r.status == 201 || r.status == 409) return OkStatus();
  return HttpError(repo_id, r, "creating the repository");
}

StatusOr<std::vector<std::string>> HubCommitter::ListFiles(const std::string& repo_id,
                                                           const std::string& revision) {
  HttpRequest req;
  req.url = opt_.endpoint + "/api/models/" + repo_id + "/revision/" + UrlEncode(revision, false);
  req.headers = Headers(req.url);
  SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(req, "hf://" + repo_id + ": listing the repository"));
  if (r.status != 200) return HttpError(repo_id, r, "listing the repository");
  SFT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(r.body, "hf://" + repo_id + ": the Hub's listing"));
  std::vector<std::string> files;
  if (!j.is_object() || !j.contains("siblings") || !j["siblings"].is_array())
    return UnavailableError("hf://" + repo_id + ": the Hub's listing has no 'siblings' list");
  for (const auto& s : j["siblings"])
    if (s.is_object() && s.contains("rfilename") && s["rfilename"].is_string())
      files.push_back(s["rfilename"].get<std::string>());
  return files;
}

// Asks the Hub which files go to LFS.
Status HubCommitter::Preupload(const std::string& repo_id, const std::string& revision,
                               std::vector<Entry>* entries) {
  nlohmann::json files = nlohmann::json::array();
  for (const Entry& e : *entries) {
    SFT_ASSIGN_OR_RETURN(std::string sample, ReadPrefix(e.file.local_path, kSampleBytes));
    files.push_back({{"path", e.file.path_in_repo}, {"size", e.size}, {"sample", Base64(sample)}});
  }
  HttpRequest req;
  req.method = "POST";
  req.url = opt_.endpoint + "/api/models/" + repo_id + "/preupload/" + UrlEncode(revision, false);
  req.headers = Headers(req.url);
  req.headers.emplace_back("Content-Type", "application/json");
  req.body = nlohmann::json{{"files", files}}.dump();
  const std::string what = "asking which files go to LFS";
  SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(req, "hf://" + repo_id + ": " + what));
  if (r.status != 200) return HttpError(repo_id, r, what);
  SFT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(r.body, "hf://" + repo_id + ": the preupload answer"));
  if (!j.is_object() || !j.contains("files") || !j["files"].is_array())
    return UnavailableError("hf://" + repo_id + ": the preupload answer has no 'files' list");
  for (const auto& f : j["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string()) continue;
    SFT_ASSIGN_OR_RETURN(
        const std::string mode,
        JsonFieldOr<std::string>(f, "uploadMode", "", "hf://" + repo_id + ": the preupload answer"));
    for (Entry& e : *entries)
      if (e.file.path_in_repo == f["path"].get<std::string>()) e.lfs = mode == "lfs";
  }
  return OkStatus();
}

// PUTs one LFS object to where the batch answer said (with only the headers it gave: the href is
// usually another origin), then asks the Hub to verify it when the answer has a `verify` action.
Status HubCommitter::PutLfsObject(const std::string& repo_id, const Entry& e, const nlohmann::json& actions) {
  const std::string what = "uploading '" + e.file.path_in_repo + "'";
  const nlohmann::json& up = actions["upload"];
  if (!up.is_object() || !up.contains("href") || !up["href"].is_string())
    return UnavailableError("hf://" + repo_id + ": " + what + ": the LFS answer has no upload href");
  if (up.contains("header") && up["header"].is_object() && up["header"].contains("chunk_size")) {
    SFT_RETURN_IF_ERROR(PutLfsParts(repo_id, e, up));
  } else {
    HttpRequest put;
    put.method = "PUT";
    put.url = up["href"].get<std::string>();
    put.body_file = e.file.local_path;
    put.headers = Headers(put.url);
    if (up.contains("header") && up["header"].is_object())
      for (const auto& [k, v] : up["header"].items())
        if (v.is_string()) put.headers.emplace_back(k, v.get<std::string>());
    SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(put, "hf://" + repo_id + ": " + what));
    if (r.status != 200 && r.status != 201) return HttpError(repo_id, r, what);
  }
  if (!actions.contains("verify") || !actions["verify"].is_object()) return OkStatus();
  const nlohmann::json& ver = actions["verify"];
  if (!ver.contains("href") || !ver["href"].is_string())
    return UnavailableError("hf://" + repo_id + ": " + what + ": the LFS answer has no verify href");
  HttpRequest post;
  post.method = "POST";
  post.url = ver["href"].get<std::string>();
  post.headers = Headers(post.url);
  post.headers.emplace_back("Content-Type", "application/vnd.git-lfs+json");
  post.headers.emplace_back("Accept", "application/vnd.git-lfs+json");
  post.body = nlohmann::json{{"oid", e.sha256}, {"size", e.size}}.dump();
  SFT_ASSIGN_OR_RETURN(HttpResponse v,
                       Send(post, "hf://" + repo_id + ": verifying '" + e.file.path_in_repo + "'"));
  if (v.status != 200) return HttpError(repo_id, v, "verifying '" + e.file.path_in_repo + "'");
  return OkStatus();
}

// The "multipart" transfer: the upload action's header has chunk_size and one URL per part (keys
// "1", "2", ... or zero-padded); each chunk is PUT to its URL, then the parts' ETags are POSTed to the
// action's href, which completes the object.
Status HubCommitter::PutLfsParts(const std::string& repo_id, const Entry& e, const nlohmann::json& up) {
  const std::string what = "uploading '" + e.file.path_in_repo + "'";
  const nlohmann::json& header = up["header"];
  uint64_t chunk = 0;
  if (header["chunk_size"].is_string())
    chunk = std::strtoull(header["chunk_size"].get<std::string>().c_str(), nullptr, 10);
  if (header["chunk_size"].is_number_unsigned()) chunk = header["chunk_size"].get<uint64_t>();
  std::map<uint64_t, std::string> urls;  // part number -> URL
  for (const auto& [k, v] : header.items()) {
    if (!k.empty() && k.find_first_not_of("0123456789") == std::string::npos && v.is_string())
      urls[std::strtoull(k.c_str(), nullptr, 10)] = v.get<std::string>();
  }
  if (chunk == 0 || urls.empty() || urls.begin()->first != 1 || urls.rbegin()->first != urls.size() ||
      (urls.size() - 1) * chunk >= std::max<uint64_t>(e.size, 1) || urls.size() * chunk < e.size) {
    return UnavailableError("hf://" + repo_id + ": " + what + ": the multipart answer's parts (" +
                            std::to_string(urls.size()) + " of " + std::to_string(chunk) +
                            " bytes) do not cover the file's " + std::to_string(e.size) + " bytes");
  }
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& [n, url] : urls) {
    HttpRequest put;
    put.method = "PUT";
    put.url = url;
    put.body_file = e.file.local_path;
    put.body_offset = (n - 1) * chunk;
    put.body_length = chunk;
    put.headers = Headers(put.url);
    const std::string part =
        what + " (part " + std::to_string(n) + " of " + std::to_string(urls.size()) + ")";
    SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(put, "hf://" + repo_id + ": " + part));
    if (r.status != 200 && r.status != 201) return HttpError(repo_id, r, part);
    auto etag = r.headers.find("etag");
    if (etag == r.headers.end() || etag->second.empty())
      return UnavailableError("hf://" + repo_id + ": " + part + ": the storage sent no ETag");
    parts.push_back({{"partNumber", n}, {"etag", etag->second}});
  }
  HttpRequest done;
  done.method = "POST";
  done.url = up["href"].get<std::string>();
  done.headers = Headers(done.url);
  done.headers.emplace_back("Content-Type", "application/vnd.git-lfs+json");
  done.headers.emplace_back("Accept", "application/vnd.git-lfs+json");
  done.body = nlohmann::json{{"oid", e.sha256}, {"parts", parts}}.dump();
  SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(done, "hf://" + repo_id + ": completing the " + what));
  if (r.status != 200 && r.status != 201) return HttpError(repo_id, r, "completing the " + what);
  return OkStatus();
}

// The LFS batch API: which objects the Hub wants, then each of those sent.
Status HubCommitter::UploadLfs(const std::string& repo_id, std::vector<Entry>* entries,
                               const std::atomic<bool>* cancel, HubCommitResult* result) {
  nlohmann::json objects = nlohmann::json::array();
  for (Entry& e : *entries) {
    if (!e.lfs) continue;
    SFT_ASSIGN_OR_RETURN(e.sha256, Sha256File(e.file.local_path));
    struct stat st;
    if (::stat(e.file.local_path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_size) != e.size)
      return FailedPreconditionError(e.file.local_path + " changed while it was being uploaded");
    objects.push_back({{"oid", e.sha256}, {"size", e.size}});
  }
  if (objects.empty()) return OkStatus();
  HttpRequest req;
  req.method = "POST";
  req.url = opt_.endpoint + "/" + repo_id + ".git/info/lfs/objects/batch";
  req.headers = Headers(req.url);
  req.headers.emplace_back("Content-Type", "application/vnd.git-lfs+json");
  req.headers.emplace_back("Accept", "application/vnd.git-lfs+json");
  req.body = nlohmann::json{
      {"operation", "upload"},
      {"transfers", nlohmann::json::array({"basic", "multipart"})},
      {"hash_algo", "sha256"},
      {"objects",
       objects}}.dump();
  const std::string what = "LFS batch";
  SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(req, "hf://" + repo_id + ": " + what));
  if (r.status != 200) return HttpError(repo_id, r, what);
  SFT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(r.body, "hf://" + repo_id + ": the LFS batch answer"));
  if (!j.is_object() || !j.contains("objects") || !j["objects"].is_array())
    return UnavailableError("hf://" + repo_id + ": the LFS batch answer has no 'objects' list");
  for (const Entry& e : *entries) {
    if (!e.lfs) continue;
    if (cancel != nullptr && cancel->load()) return CancelledError("hf://" + repo_id + ": upload cancelled");
    const nlohmann::json* obj = nullptr;
    for (const auto& o : j["objects"]) {
      if (!o.is_object()) continue;
      SFT_ASSIGN_OR_RETURN(
          const std::string oid,
          JsonFieldOr<std::string>(o, "oid", "", "hf://" + repo_id + ": the LFS batch answer"));
      if (oid == e.sha256) obj = &o;
    }
    if (obj == nullptr)
      return UnavailableError("hf://" + repo_id + ": the LFS batch answer leaves out '" +
                              e.file.path_in_repo + "'");
    if (obj->contains("error")) {
      return FailedPreconditionError("hf://" + repo_id + ": LFS refused '" + e.file.path_in_repo +
                                     "': " + (*obj)["error"].dump());
    }
    if (!obj->contains("actions") || !(*obj)["actions"].is_object() ||
        !(*obj)["actions"].contains("upload")) {
      ++result->lfs_files_skipped;  // the Hub has this content already
      continue;
    }
    SFT_RETURN_IF_ERROR(PutLfsObject(repo_id, e, (*obj)["actions"]));
    result->bytes_sent += e.size;
  }
  return OkStatus();
}

StatusOr<HubCommitResult> HubCommitter::Commit(const std::string& repo_id, const std::string& revision,
                                               const std::string& message,
                                               const std::vector<HubCommitFile>& files,
                                               const std::vector<std::string>& delete_folders,
                                               const std::atomic<bool>* cancel) {
  std::vector<Entry> entries;
  for (const HubCommitFile& f : files) {
    SFT_RETURN_IF_ERROR(CheckRelativePath(f.path_in_repo).WithContext("hf://" + repo_id));
    struct stat st;
    if (::stat(f.local_path.c_str(), &st) != 0) return ErrnoError("cannot read", f.local_path, errno);
    entries.push_back(Entry{f, static_cast<uint64_t>(st.st_size), false, ""});
  }
  HubCommitResult result;
  if (!entries.empty()) {
    SFT_RETURN_IF_ERROR(Preupload(repo_id, revision, &entries));
    SFT_RETURN_IF_ERROR(UploadLfs(repo_id, &entries, cancel, &result));
  }
  if (cancel != nullptr && cancel->load()) return CancelledError("hf://" + repo_id + ": upload cancelled");
  std::string ndjson =
      nlohmann::json{{"key", "header"}, {"value", {{"summary", message}, {"description", ""}}}}.dump() + "\n";
  for (const Entry& e : entries) {
    if (e.lfs) {
      ndjson +=
          nlohmann::json{
              {"key", "lfsFile"},
              {"value",
               {{"path", e.file.path_in_repo}, {"algo", "sha256"}, {"oid", e.sha256}, {"size", e.size}}}}
              .dump() +
          "\n";
      continue;
    }
    SFT_ASSIGN_OR_RETURN(std::string content, ReadPrefix(e.file.local_path, e.size));
    result.bytes_sent += content.size();
    ndjson +=
        nlohmann::json{
            {"key", "file"},
            {"value", {{"path", e.file.path_in_repo}, {"encoding", "base64"}, {"content", Base64(content)}}}}
            .dump() +
        "\n";
  }
  for (const std::string& d : delete_folders)
    ndjson += nlohmann::json{{"key", "deletedFolder"}, {"value", {{"path", d + "/"}}}}.dump() + "\n";
  HttpRequest req;
  req.method = "POST";
  req.url = opt_.endpoint + "/api/models/" + repo_id + "/commit/" + UrlEncode(revision, false);
  req.headers = Headers(req.url);
  req.headers.emplace_back("Content-Type", "application/x-ndjson");
  req.body = std::move(ndjson);
  SFT_ASSIGN_OR_RETURN(HttpResponse r, Send(req, "hf://" + repo_id + ": commit"));
  if (r.status != 200 && r.status != 201) return HttpError(repo_id, r, "commit '" + message + "'");
  StatusOr<nlohmann::json> j = ParseJson(r.body, "hf://" + repo_id + ": the commit answer");
  if (j.ok() && j->is_object() && j->contains("commitOid") && (*j)["commitOid"].is_string())
    result.commit = (*j)["commitOid"].get<std::string>();
  return result;
}

}  // namespace sftctl
