#include "common/net/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "common/version.h"

namespace sftctl {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

bool IsRedirect(long status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

bool ParseLength(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

// The state of one transfer (one hop of a redirect chain), shared with libcurl's callbacks.
struct Transfer {
  CURL* curl = nullptr;
  bool follow = false;
  const HttpSink* sink = nullptr;
  const HttpHeadersCheck* check = nullptr;
  uint64_t max_body = 0;       // HttpRequest::max_body_bytes
  bool collect_error = false;  // HttpRequest::collect_error_body
  HttpResponse resp;
  bool checked = false;
  bool limited = false;   // `limit` is set (at the final response's first body byte)
  uint64_t limit = 0;     // body bytes accepted
  std::string limit_why;  // what set `limit`, for the error
  Status abort;           // why a callback stopped the transfer

  // The final response's status and headers are known at its first body byte (or at its end).
  bool Final() const { return !(follow && IsRedirect(resp.status)); }
  // An error response's body is collected rather than sunk when the request says so.
  bool ErrorCollected() const { return collect_error && resp.status >= 300; }
  bool HasSink() const { return sink != nullptr && *sink && !ErrorCollected(); }

  Status RunCheck() {
    checked = true;
    if (check == nullptr || !*check || !Final()) return OkStatus();
    return (*check)(resp);
  }

  // The most body bytes the final response may have: what it declared, and what the caller allows.
  void SetLimit() {
    limited = true;
    if (ErrorCollected()) {
      limit = HttpClient::kMaxErrorBodyBytes;
      limit_why = "the most an error response's body may have";
    } else {
      limit = max_body > 0 ? max_body : HasSink() ? UINT64_MAX : HttpClient::kMaxCollectedBodyBytes;
      limit_why = max_body > 0 || !HasSink() ? "the most this request accepts" : "";
    }
    auto cl = resp.headers.find("content-length");
    uint64_t declared = 0;
    if (cl != resp.headers.end() && ParseLength(cl->second, &declared) && declared <= limit) {
      limit = declared;
      limit_why = "its Content-Length";
    }
  }

  // Hands `data` to the sink (or the collected body). False: stop (abort says why).
  bool Deliver(std::string_view data) {
    resp.body_bytes += data.size();
    if (!HasSink()) {
      resp.body.append(data.data(), data.size());
      return true;
    }
    if ((*sink)(data)) return true;
    abort = CancelledError("download of " + resp.url + " stopped");
    return false;
  }
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after 1xx): start over
    t->resp.headers.clear();
    t->resp.status = 0;
    size_t sp = line.find(' ');
    if (sp != std::string_view::npos) t->resp.status = std::atol(std::string(line.substr(sp + 1, 3)).c_str());
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    t->resp.headers[Lower(Trim(line.substr(0, colon)))] = Trim(line.substr(colon + 1));
  }
  return size * n;
}

// Body bytes: the final response's go to the sink, never past its limit (then DATA_LOSS).
size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (!t->checked) {
    t->abort = t->RunCheck();
    if (!t->abort.ok()) return 0;
  }
  if (!t->Final()) return bytes;  // a redirect's body: discarded
  if (!t->limited) t->SetLimit();
  const uint64_t room = t->limit - t->resp.body_bytes;
  const size_t take = static_cast<size_t>(std::min<uint64_t>(bytes, room));
  if (take > 0 && !t->Deliver(std::string_view(data, take))) return 0;
  if (take < bytes) {
    t->abort =
        DataLossError(t->resp.url + ": the body runs past " + std::to_string(t->limit) + " bytes (" +
                      (t->limit_why.empty() ? "the limit" : t->limit_why) + "); the rest was not accepted");
    return 0;
  }
  return bytes;
}

// libcurl speaks only http and https for us, whatever the URL or a redirect says (Send also checks
// the URLs itself). CURLOPT_PROTOCOLS_STR is 7.85's; older libcurl (Debian 11: 7.74) has the bitmask.
void RestrictToHttp(CURL* curl) {
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
}

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// The request body of a POST or PUT, handed to libcurl as it asks: from memory or from a file.
struct Upload {
  std::string_view data;  // when file is null
  FILE* file = nullptr;
  uint64_t size = 0;
  uint64_t sent = 0;
};

size_t OnRead(char* buf, size_t size, size_t n, void* user) {
  auto* u = static_cast<Upload*>(user);
  const size_t want = static_cast<size_t>(std::min<uint64_t>(size * n, u->size - u->sent));
  size_t got = want;
  if (u->file != nullptr) {
    got = std::fread(buf, 1, want, u->file);
    if (got < want && std::ferror(u->file)) return CURL_READFUNC_ABORT;
  } else {
    std::memcpy(buf, u->data.data() + u->sent, want);
  }
  u->sent += got;
  return got;
}

// Sets the body of a POST or PUT on `curl`; `u` must outlive the transfer.
Status SetBody(CURL* curl, const HttpRequest& req, Upload* u) {
  if (req.method != "POST" && req.method != "PUT") return OkStatus();
  if (!req.body_file.empty()) {
    u->file = std::fopen(req.body_file.c_str(), "rb");
    if (u->file == nullptr)
      return NotFoundError("cannot open " + req.body_file + ": " + std::strerror(errno));
    std::fseek(u->file, 0, SEEK_END);
    const uint64_t end = static_cast<uint64_t>(std::ftell(u->file));
    const uint64_t from = std::min(req.body_offset, end);
    u->size = std::min(req.body_length, end - from);
    std::fseek(u->file, static_cast<long>(from), SEEK_SET);
  } else {
    u->data = req.body_view.empty() ? std::string_view(req.body) : req.body_view;
    u->size = u->data.size();
  }
  curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);  // PUT, or the method below
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  curl_easy_setopt(curl, CURLOPT_READFUNCTION, OnRead);
  curl_easy_setopt(curl, CURLOPT_READDATA, u);
  curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(u->size));
  return OkStatus();
}

class Curl final : public HttpClient {
 public:
  StatusOr<HttpResponse> Send(const HttpRequest& req, const HttpSink& sink,
                              const HttpHeadersCheck& check) override {
    GlobalInit();
    std::string url = req.url;
    const std::string origin = UrlOrigin(req.url);
    if (!IsHttpUrl(url)) return InvalidArgumentError("not an http:// or https:// URL: " + url);
#if LIBCURL_VERSION_NUM < 0x074B00
    if (req.aws_sigv4) {
      return FailedPreconditionError(std::string("AWS SigV4 signing (S3) needs libcurl 7.75 or newer; ") +
                                     "this program was built with libcurl " + LIBCURL_VERSION);
    }
#endif
    for (int hop = 0;; ++hop) {
      SFT_ASSIGN_OR_RETURN(HttpResponse r, SendOnce(req, url, UrlOrigin(url) == origin, sink, check));
      if (!req.follow_redirects || !IsRedirect(r.status)) return r;
      auto loc = r.headers.find("location");
      if (loc == r.headers.end()) return r;
      if (hop + 1 >= kMaxRedirects) return UnavailableError("too many redirects from " + req.url);
      url = ResolveUrl(url, loc->second);
      if (UrlOrigin(url).empty())
        return InvalidArgumentError("bad redirect from " + r.url + ": " + loc->second);
      if (!IsHttpUrl(url)) {
        return InvalidArgumentError("refused a redirect from " + r.url + " to " + loc->second +
                                    ": only http:// and https:// are followed");
      }
    }
  }

 private:
  // One hop. The Authorization header, or the SigV4 signature, goes only to the request's own origin.
  StatusOr<HttpResponse> SendOnce(const HttpRequest& req, const std::string& url, bool same_origin,
                                  const HttpSink& sink, const HttpHeadersCheck& check) {
    Transfer t;
    t.curl = curl_easy_init();
    if (t.curl == nullptr) return InternalError("libcurl: cannot create a handle");
    t.follow = req.follow_redirects;
    t.sink = &sink;
    t.check = &check;
    t.max_body = req.max_body_bytes;
    t.collect_error = req.collect_error_body;
    t.resp.url = url;
    Upload upload;
    if (Status st = SetBody(t.curl, req, &upload); !st.ok()) {
      curl_easy_cleanup(t.curl);
      return st;
    }
    curl_slist* headers = nullptr;
    for (const auto& [name, value] : req.headers) {
      if (!same_origin && Lower(name) == "authorization") continue;
      headers = curl_slist_append(headers, (name + ": " + value).c_str());
    }
    // No 100-continue wait; but not when signing: libcurl 7.88 would sign the header it then leaves out.
    if (upload.size > 0 && !req.aws_sigv4) headers = curl_slist_append(headers, "Expect:");
    const std::string agent = std::string("sftctl/") + kVersion;
    const long stall = static_cast<long>(req.stall_timeout.count());
    curl_easy_setopt(t.curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(t.curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t.curl, CURLOPT_USERAGENT, agent.c_str());
    curl_easy_setopt(t.curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(t.curl, CURLOPT_FOLLOWLOCATION, 0L);
    RestrictToHttp(t.curl);
    curl_easy_setopt(t.curl, CURLOPT_CONNECTTIMEOUT, stall);
    curl_easy_setopt(t.curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(t.curl, CURLOPT_LOW_SPEED_TIME, stall);
    if (req.method == "HEAD") curl_easy_setopt(t.curl, CURLOPT_NOBODY, 1L);
    if (req.method != "GET" && req.method != "HEAD" && req.method != "POST" && req.method != "PUT")
      curl_easy_setopt(t.curl, CURLOPT_CUSTOMREQUEST, req.method.c_str());  // DELETE
#if LIBCURL_VERSION_NUM >= 0x074B00
    if (req.aws_sigv4 && same_origin) {  // (as the Authorization header: never to another origin)
      curl_easy_setopt(t.curl, CURLOPT_AWS_SIGV4, req.aws_sigv4->provider.c_str());
      curl_easy_setopt(t.curl, CURLOPT_USERNAME, req.aws_sigv4->access_key_id.c_str());
      curl_easy_setopt(t.curl, CURLOPT_PASSWORD, req.aws_sigv4->secret_access_key.c_str());
    }
#endif
    curl_easy_setopt(t.curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(t.curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(t.curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(t.curl, CURLOPT_WRITEDATA, &t);
    const CURLcode rc = curl_easy_perform(t.curl);
    long code = 0;
    curl_easy_getinfo(t.curl, CURLINFO_RESPONSE_CODE, &code);
    if (code != 0) t.resp.status = code;
    curl_slist_free_all(headers);
    curl_easy_cleanup(t.curl);
    if (upload.file != nullptr) std::fclose(upload.file);
    if (!t.abort.ok()) return t.abort;
    if (rc != CURLE_OK) {
      return UnavailableError(req.method + " " + url + ": " + curl_easy_strerror(rc) + " (after " +
                              std::to_string(t.resp.body_bytes) + " body bytes)");
    }
    if (!t.checked) SFT_RETURN_IF_ERROR(t.RunCheck());  // a response without a body
    return t.resp;
  }
};

}  // namespace

HttpClient* CurlHttpClient() {
  static Curl* client = new Curl();
  return client;
}

bool IsHttpUrl(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos || UrlOrigin(url).empty()) return false;
  const std::string s = Lower(std::string(url.substr(0, scheme)));
  return s == "http" || s == "https";
}

std::string UrlOrigin(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos || scheme == 0) return "";
  size_t end = url.find_first_of("/?#", scheme + 3);
  std::string origin = Lower(std::string(url.substr(0, end == std::string_view::npos ? url.size() : end)));
  if (origin.size() == scheme + 3) return "";  // no host
  return origin;
}

std::string ResolveUrl(std::string_view base, std::string_view location) {
  if (!UrlOrigin(location).empty()) return std::string(location);
  const std::string origin = UrlOrigin(base);
  if (location.rfind("//", 0) == 0)
    return std::string(base.substr(0, base.find("://") + 1)) + std::string(location);
  if (!location.empty() && location[0] == '/') return origin + std::string(location);
  std::string_view path = base.substr(origin.size());
  path = path.substr(0, path.find_first_of("?#"));
  const size_t slash = path.rfind('/');
  return origin + std::string(slash == std::string_view::npos ? "/" : path.substr(0, slash + 1)) +
         std::string(location);
}

std::string UrlEncode(std::string_view s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace sftctl
