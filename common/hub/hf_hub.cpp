#include "common/hub/hf_hub.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "common/os/file_lock.h"
#include "common/safe_path.h"
#include "common/sha256.h"

namespace sftctl {

struct HubDownloader::FileMeta {
  std::string file;    // path in the repository
  std::string commit;  // X-Repo-Commit
  std::string etag;    // X-Linked-Etag (LFS: sha256) or ETag, without quotes and W/
  uint64_t size = 0;   // X-Linked-Size or Content-Length
  bool size_known = false;
  std::string location;  // where the content is fetched from
};

namespace {

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
}

bool IsHexDigits(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string TrimSpace(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

std::string NormalizeEtag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

std::string Header(const HttpResponse& r, const std::string& name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? "" : it->second;
}

bool ParseSize(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  *out = std::strtoull(s.c_str(), nullptr, 10);
  return true;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string BaseName(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace

std::string HubRef::PageUrl(const std::string& endpoint) const {
  return endpoint + (dataset ? "/datasets/" : "/") + repo_id;
}

StatusOr<HubRef> ParseHubRef(std::string_view text) {
  HubRef ref;
  ref.text = std::string(text);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("Hub reference '" + ref.text + "': " + why +
                                " (expected hf://[datasets/]ORG/NAME[@REVISION][/PATH])");
  };
  if (!IsHubPath(text)) return bad("does not start with hf://");
  std::string_view rest = text.substr(kHubScheme.size());
  if (rest.rfind("datasets/", 0) == 0) {
    ref.dataset = true;
    rest = rest.substr(9);
  }
  const size_t slash1 = rest.find('/');
  if (slash1 == std::string_view::npos || slash1 == 0) return bad("names no ORG/NAME");
  const std::string org(rest.substr(0, slash1));
  rest = rest.substr(slash1 + 1);
  const size_t end = rest.find('/');
  std::string name(rest.substr(0, end));
  ref.path = end == std::string_view::npos ? "" : std::string(rest.substr(end + 1));
  const size_t at = name.find('@');
  if (at != std::string::npos) {
    ref.revision = name.substr(at + 1);
    name = name.substr(0, at);
    if (ref.revision.empty()) return bad("empty revision after '@'");
  }
  for (const std::string& part : {org, name}) {
    if (part.empty()) return bad("names no ORG/NAME");
    if (part == "." || part == "..") return bad("'" + part + "' is not a repository name");
    for (char c : part)
      if (!IsNameChar(c)) return bad("'" + part + "' has a character the Hub does not allow in names");
  }
  for (char c : ref.revision)
    if (!IsNameChar(c))
      return bad("revision '" + ref.revision + "' has a character other than A-Z a-z 0-9 - _ .");
  while (!ref.path.empty() && ref.path.back() == '/') ref.path.pop_back();
  if (!ref.path.empty()) {
    if (Status s = CheckRelativePath(ref.path); !s.ok()) return bad(s.message());
  }
  ref.repo_id = org + "/" + name;
  return ref;
}

HubOptions HubOptionsFromEnvironment() {
  HubOptions o;
  std::string endpoint = Getenv("HF_ENDPOINT");
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (!endpoint.empty()) o.endpoint = endpoint;
  std::string home = Getenv("HF_HOME");
  if (home.empty()) {
    std::string xdg = Getenv("XDG_CACHE_HOME");
    home = (xdg.empty() ? Getenv("HOME") + "/.cache" : xdg) + "/huggingface";
  }
  o.cache_dir = Getenv("HF_HUB_CACHE");
  if (o.cache_dir.empty()) o.cache_dir = home + "/hub";
  o.token = TrimSpace(Getenv("HF_TOKEN"));
  if (o.token.empty()) {
    std::string token_path = Getenv("HF_TOKEN_PATH");
    if (token_path.empty()) token_path = home + "/token";
    auto content = FileSystem::Default()->ReadFile(token_path);
    if (content.ok()) o.token = TrimSpace(*content);
  }
  return o;
}

bool HubFileWanted(const std::string& path) {
  const std::string base = BaseName(path);
  if (base == "config.json" || base == "generation_config.json" || base == "special_tokens_map.json" ||
      base == "vocab.json" || base == "merges.txt" || base == "chat_template.jinja" ||
      base == "model.safetensors.index.json") {
    return true;
  }
  if (base.rfind("tokenizer", 0) == 0) return true;
  return EndsWith(base, ".safetensors");
}

bool HubPatternMatch(std::string_view pattern, std::string_view path) {
  size_t p = 0, s = 0, star = std::string_view::npos, mark = 0;
  while (s < path.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == path[s])) {
      ++p, ++s;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = s;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      s = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

HubDownloader::HubDownloader(HubOptions options) : opt_(std::move(options)) {
  if (opt_.http == nullptr) opt_.http = CurlHttpClient();
  if (opt_.fs == nullptr) opt_.fs = FileSystem::Default();
  while (!opt_.endpoint.empty() && opt_.endpoint.back() == '/') opt_.endpoint.pop_back();
}

// The token goes only to the Hub's own origin: never to a CDN the Hub redirects content to.
std::vector<std::pair<std::string, std::string>> HubDownloader::Headers(const std::string& url) const {
  std::vector<std::pair<std::string, std::string>> h = {{"Accept-Encoding", "identity"}};
  if (!opt_.token.empty() && UrlOrigin(url) == UrlOrigin(opt_.endpoint))
    h.push_back({"Authorization", "Bearer " + opt_.token});
  return h;
}

Status HubDownloader::HttpError(const HubRef& ref, const HttpResponse& r, const std::string& what) const {
  const std::string code = Header(r, "x-error-code");
  const std::string page = ref.PageUrl(opt_.endpoint);
  if (r.status == 401 || r.status == 403) {
    std::string why = code == "GatedRepo" ? "is gated" : "needs access (gated or private)";
    return PermissionDeniedError(
        ref.text + ": " + ref.Kind().substr(0, ref.Kind().size() - 1) + " " + ref.repo_id + " " + why +
        (opt_.token.empty() ? " and no token was sent" : " and the token sent was refused") +
        ": accept the licence at " + page + " and " +
        (opt_.token_advice.empty() ? "set HF_TOKEN (or run `huggingface-cli login`)" : opt_.token_advice));
  }
  if (r.status == 404) {
    if (code == "RevisionNotFound")
      return NotFoundError(ref.text + ": revision '" + ref.revision + "' not found in " + ref.repo_id);
    if (code == "EntryNotFound")
      return NotFoundError(ref.text + ": " + what + " not found in " + ref.repo_id);
    return NotFoundError(ref.text + ": " + what + ": " + ref.Kind().substr(0, ref.Kind().size() - 1) + " " +
                         ref.repo_id + " not found at " + page + " (or revision '" + ref.revision +
                         "' does not exist)");
  }
  return UnavailableError(ref.text + ": " + what + ": HTTP " + std::to_string(r.status) + " from " + r.url);
}

// The repository's commit at the revision and its file list.
StatusOr<std::pair<std::string, std::vector<std::string>>> HubDownloader::ListRepo(const HubRef& ref) {
  HttpRequest req;
  req.url = opt_.endpoint + "/api/" + ref.Kind() + "/" + ref.repo_id + "/revision/" +
            UrlEncode(ref.revision, false);
  req.headers = Headers(req.url);
  SFT_ASSIGN_OR_RETURN(HttpResponse r, opt_.http->Send(req));
  if (r.status != 200) return HttpError(ref, r, "listing the repository");
  SFT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(r.body, ref.text + ": the Hub's listing"));
  const auto sha = j.find("sha");
  const auto siblings = j.find("siblings");
  if (!j.is_object() || sha == j.end() || !sha->is_string() || !IsHexDigits(sha->get<std::string>(), 40) ||
      siblings == j.end() || !siblings->is_array()) {
    return UnavailableError(ref.text + ": the Hub's listing has no 'sha' commit or 'siblings' list");
  }
  std::vector<std::string> files;
  for (const auto& s : *siblings) {
    if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string()) continue;
    std::string f = s["rfilename"].get<std::string>();
    if (CheckRelativePath(f).ok()) files.push_back(f);  // a name that could escape the snapshot: never
  }
  return std::make_pair(sha->get<std::string>(), files);
}

StatusOr<HubDownloader::FileMeta> HubDownloader::Head(const HubRef& ref, const std::string& commit,
                                                      const std::string& file) {
  HttpRequest req;
  req.method = "HEAD";
  req.url = opt_.endpoint + (ref.dataset ? "/datasets/" : "/") + ref.repo_id + "/resolve/" + commit + "/" +
            UrlEncode(file, true);
  req.headers = Headers(req.url);
  req.follow_redirects = false;
  SFT_ASSIGN_OR_RETURN(HttpResponse r, opt_.http->Send(req));
  const bool redirect = r.status >= 300 && r.status < 400;
  if (r.status != 200 && !redirect) return HttpError(ref, r, "file '" + file + "'");
  FileMeta m;
  m.file = file;
  m.commit = Header(r, "x-repo-commit");
  m.etag = NormalizeEtag(Header(r, "x-linked-etag"));
  if (m.etag.empty()) m.etag = NormalizeEtag(Header(r, "etag"));
  m.size_known = ParseSize(Header(r, "x-linked-size"), &m.size) ||
                 (!redirect && ParseSize(Header(r, "content-length"), &m.size));
  m.location = redirect ? ResolveUrl(req.url, Header(r, "location")) : req.url;
  if (m.etag.empty() || !CheckRelativePath(m.etag).ok() || m.etag.find('/') != std::string::npos)
    return UnavailableError(ref.text + ": the Hub sent no usable ETag for '" + file + "'");
  if (m.commit.empty()) m.commit = commit;
  if (m.commit != commit) {
    return UnavailableError(ref.text + ": '" + file + "' resolved to commit " + m.commit + ", not " + commit +
                            " (the repository changed during the download; run it again)");
  }
  return m;
}

StatusOr<HubSnapshot> HubDownloader::Download(const HubRef& ref, const std::vector<std::string>& include) {
  SFT_ASSIGN_OR_RETURN(auto listing, ListRepo(ref));
  HubSnapshot snap;
  snap.commit = listing.first;
  std::string repo_dir = opt_.cache_dir + "/" + ref.Kind() + "--" + ref.repo_id;
  repo_dir.replace(repo_dir.rfind('/'), 1, "--");
  snap.folder = repo_dir + "/snapshots/" + snap.commit;
  snap.path = ref.path.empty() ? snap.folder : snap.folder + "/" + ref.path;
  if (ref.dataset && ref.path.empty() && include.empty())
    return InvalidArgumentError(ref.text + ": name a file of the data set (hf://datasets/ORG/NAME/FILE)");
  for (const std::string& f : listing.second) {
    const bool inside = ref.path.empty() || f == ref.path || f.rfind(ref.path + "/", 0) == 0;
    bool wanted = inside && (ref.dataset || f == ref.path || HubFileWanted(f));
    if (!include.empty()) {
      wanted = false;
      for (const auto& p : include) wanted |= inside && HubPatternMatch(p, f);
    }
    if (wanted) snap.files.push_back(f);
  }
  if (snap.files.empty()) {
    return NotFoundError(ref.text + ": no " +
                         (ref.path.empty() ? "matching files" : "file '" + ref.path + "'") + " in " +
                         ref.repo_id + " at revision '" + ref.revision + "'");
  }
  for (const std::string& f : snap.files) {
    SFT_ASSIGN_OR_RETURN(FileMeta meta, Head(ref, snap.commit, f));
    SFT_RETURN_IF_ERROR(Fetch(ref, repo_dir, meta, &snap));
  }
  if (ref.revision != snap.commit) {
    SFT_RETURN_IF_ERROR(opt_.fs->CreateDirs(repo_dir + "/refs"));
    SFT_RETURN_IF_ERROR(WriteFileAtomic(opt_.fs, repo_dir + "/refs/" + ref.revision, snap.commit));
  }
  return snap;
}

// One file: skipped when its blob is present, else fetched into blobs/<etag>.incomplete (resumed
// after a dropped connection), verified and renamed; then linked from the snapshot.
Status HubDownloader::Fetch(const HubRef& ref, const std::string& repo_dir, const FileMeta& meta,
                            HubSnapshot* snap) {
  const std::string blob = repo_dir + "/blobs/" + meta.etag;
  if (!opt_.fs->Exists(blob)) {
    // The lock every HF client takes for this blob; the blob may be whole once we hold it.
    const size_t slash = repo_dir.rfind('/');
    const std::string locks = repo_dir.substr(0, slash) + "/.locks/" + repo_dir.substr(slash + 1);
    SFT_RETURN_IF_ERROR(opt_.fs->CreateDirs(locks));
    SFT_ASSIGN_OR_RETURN(FileLock lock,
                         FileLock::Acquire(locks + "/" + meta.etag + ".lock", opt_.cancelled, [&] {
                           if (opt_.progress)
                             opt_.progress(meta.file + " (waiting for another download)", 0, meta.size);
                         }));
    if (opt_.fs->Exists(blob)) return Link(repo_dir, snap->commit, meta);
    SFT_RETURN_IF_ERROR(opt_.fs->CreateDirs(repo_dir + "/blobs"));
    const std::string part = blob + ".incomplete";
    uint64_t have = 0;
    Status st;
    for (int attempt = 0; attempt < std::max(1, opt_.max_attempts); ++attempt) {
      st = FetchAttempt(part, meta, &have, snap);
      if (st.code() != StatusCode::kUnavailable) break;
    }
    if (!st.ok()) return st.WithContext(ref.text + ": '" + meta.file + "'");
    SFT_RETURN_IF_ERROR(Verify(ref, part, meta));
    SFT_RETURN_IF_ERROR(opt_.fs->Rename(part, blob));
    ++snap->files_downloaded;
  }
  return Link(repo_dir, snap->commit, meta);
}

// One GET of the content from the bytes `part` holds; *have follows the file's size.
Status HubDownloader::FetchAttempt(const std::string& part, const FileMeta& meta, uint64_t* have,
                                   HubSnapshot* snap) {
  SFT_ASSIGN_OR_RETURN(std::unique_ptr<AppendableFile> out, opt_.fs->NewAppendableFile(part));
  SFT_ASSIGN_OR_RETURN(*have, out->Size());
  if (meta.size_known && *have == meta.size) return out->Close();
  if (meta.size_known && *have > meta.size) {
    SFT_RETURN_IF_ERROR(out->Truncate(0));
    *have = 0;
  }
  HttpRequest req;
  req.url = meta.location;
  req.headers = Headers(req.url);
  if (*have > 0) req.headers.push_back({"Range", "bytes=" + std::to_string(*have) + "-"});
  Status write_error, overflow;  // overflow: the content ran past the size the Hub declared
  auto check = [&](const HttpResponse& r) -> Status {
    if (r.status == 206 && *have > 0) return OkStatus();
    if (r.status != 200) return UnavailableError("HTTP " + std::to_string(r.status) + " from " + r.url);
    if (*have > 0) {  // the server ignored Range: start over
      *have = 0;
      return out->Truncate(0);
    }
    return OkStatus();
  };
  auto sink = [&](std::string_view data) {
    if (meta.size_known && data.size() > meta.size - *have) {
      overflow = DataLossError("the content runs past the " + std::to_string(meta.size) +
                               " bytes the Hub declared for it (X-Linked-Size / Content-Length); "
                               "nothing past them was written and the partial download was deleted");
      return false;
    }
    write_error = out->Append(data);
    if (!write_error.ok()) return false;
    *have += data.size();
    snap->bytes_downloaded += data.size();
    if (opt_.progress) opt_.progress(meta.file, *have, meta.size);
    return !(opt_.cancelled && opt_.cancelled());
  };
  StatusOr<HttpResponse> r = opt_.http->Send(req, sink, check);
  Status closed = out->Close();
  if (!write_error.ok()) return write_error;
  if (!overflow.ok() || r.status().code() == StatusCode::kDataLoss) {
    Status removed = opt_.fs->RemoveAll(part);
    (void)removed;  // the overflow is the error to report
    return overflow.ok() ? r.status() : overflow;
  }
  if (!r.ok()) return r.status();
  return closed;
}

Status HubDownloader::Verify(const HubRef& ref, const std::string& part, const FileMeta& meta) {
  struct stat st;
  if (::stat(part.c_str(), &st) != 0) return ErrnoError("cannot stat", part, errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Status bad;
  if (meta.size_known && size != meta.size) {
    bad = DataLossError(ref.text + ": '" + meta.file + "' has " + std::to_string(size) +
                        " bytes, the Hub said " + std::to_string(meta.size));
  } else if (IsHexDigits(meta.etag, 64)) {  // an LFS file: its etag is the content's sha256
    SFT_ASSIGN_OR_RETURN(std::string sha, Sha256File(part));
    if (sha != meta.etag) {
      bad = DataLossError(ref.text + ": '" + meta.file + "' is corrupted: sha256 " + sha +
                          " but the Hub says " + meta.etag +
                          "; the partial download was deleted, run it again");
    }
  }
  if (!bad.ok()) {
    Status removed = opt_.fs->RemoveAll(part);
    (void)removed;  // the mismatch is the error to report
  }
  return bad;
}

Status HubDownloader::Link(const std::string& repo_dir, const std::string& commit, const FileMeta& meta) {
  const std::string link = repo_dir + "/snapshots/" + commit + "/" + meta.file;
  const size_t slash = link.rfind('/');
  SFT_RETURN_IF_ERROR(opt_.fs->CreateDirs(link.substr(0, slash)));
  std::string target;
  for (size_t i = 0, depth = 2 + static_cast<size_t>(std::count(meta.file.begin(), meta.file.end(), '/'));
       i < depth; ++i) {
    target += "../";
  }
  target += "blobs/" + meta.etag;
  char existing[4096];
  const ssize_t n = ::readlink(link.c_str(), existing, sizeof(existing));
  if (n > 0 && std::string(existing, static_cast<size_t>(n)) == target) return OkStatus();
  ::unlink(link.c_str());
  if (::symlink(target.c_str(), link.c_str()) != 0) return ErrnoError("cannot create the link", link, errno);
  return OkStatus();
}

}  // namespace sftctl
