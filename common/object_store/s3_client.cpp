#include "common/object_store/s3_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <thread>

#include "common/object_store/s3_xml.h"
#include "common/terminal_text.h"

namespace sftctl {

namespace {

constexpr const char* kUnsignedPayload = "x-amz-content-sha256: UNSIGNED-PAYLOAD";

struct Transfer {
  std::string_view upload;  // remaining request body
  const S3Sink* sink = nullptr;
  std::string* collect = nullptr;
  uint64_t max_body = 0;
  uint64_t body_bytes = 0;
  bool overflow = false, sink_stopped = false;
  long status = 0;
  std::map<std::string, std::string> headers;
};

size_t ReadBody(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t k = std::min(size * n, t->upload.size());
  std::copy_n(t->upload.data(), k, buf);
  t->upload.remove_prefix(k);
  return k;
}

size_t WriteBody(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const std::string_view data(buf, size * n);
  if (t->status >= 300 || t->sink == nullptr) {  // error bodies are always collected (bounded)
    if (t->collect->size() + data.size() > t->max_body) {
      t->overflow = true;
      return 0;
    }
    t->collect->append(data);
  } else if (!(*t->sink)(data)) {
    t->sink_stopped = true;
    return 0;
  }
  t->body_bytes += data.size();
  return data.size();
}

size_t ReadHeader(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string line(buf, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after 100 Continue): start over
    t->headers.clear();
    const size_t sp = line.find(' ');
    t->status = sp == std::string::npos ? 0 : std::atol(line.c_str() + sp + 1);
  } else if (const size_t colon = line.find(':'); colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    const size_t v = line.find_first_not_of(' ', colon + 1);
    t->headers[name] = v == std::string::npos ? "" : line.substr(v);
  }
  return size * n;
}

std::string Unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

bool IsMd5Hex(std::string_view s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(c) != 0; });
}

StatusCode CodeOf(long http, const std::string& code) {
  if (code == "BadDigest" || code == "InvalidDigest") return StatusCode::kDataLoss;
  if (code == "QuotaExceeded" || code == "EntityTooLarge" || code == "ServiceQuotaExceeded" || http == 507)
    return StatusCode::kResourceExhausted;
  if (http == 401 || http == 403) return StatusCode::kPermissionDenied;
  if (http == 404) return StatusCode::kNotFound;
  if (http == 416) return StatusCode::kOutOfRange;
  if (http == 409 || http == 412) return StatusCode::kFailedPrecondition;
  if (http == 429 || http >= 500) return StatusCode::kUnavailable;
  return StatusCode::kInvalidArgument;
}

}  // namespace

std::string S3ObjectName(const std::string& bucket, std::string_view key) {
  return "s3://" + bucket + (key.empty() ? "" : "/" + std::string(key));
}

std::string Md5Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) (out += kHex[md[i] >> 4]) += kHex[md[i] & 15];
  return out;
}

std::string Md5Base64(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE], b64[64];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr);
  const int len = EVP_EncodeBlock(b64, md, static_cast<int>(n));
  return std::string(reinterpret_cast<char*>(b64), static_cast<size_t>(len));
}

S3Client::S3Client(S3Endpoint endpoint, AwsCredentials credentials)
    : endpoint_(std::move(endpoint)), credentials_(std::move(credentials)) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

StatusOr<S3Client::Response> S3Client::Perform(const Request& r, const S3Sink& sink) const {
  SFT_ASSIGN_OR_RETURN(const std::string url, S3RequestUrl(endpoint_, r.bucket, r.key, r.query));
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return InternalError("curl_easy_init failed");
  Response resp;
  Transfer t;
  t.upload = r.body;
  t.sink = sink ? &sink : nullptr;
  t.collect = &resp.body;
  t.max_body = r.max_body;
  curl_slist* hdrs = curl_slist_append(nullptr, kUnsignedPayload);
  // (No "Expect:" to skip 100-continue: libcurl 7.88 would sign the header it then does not send.)
  if (!credentials_.session_token.empty())
    hdrs = curl_slist_append(hdrs, ("x-amz-security-token: " + credentials_.session_token).c_str());
  for (const std::string& h : r.headers) hdrs = curl_slist_append(hdrs, h.c_str());
  const std::string sigv4 = "aws:amz:" + endpoint_.Region() + ":s3";
  const long stall = static_cast<long>(stall_timeout_.count());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
#if LIBCURL_VERSION_NUM >= 0x074B00
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4.c_str());
#else  // libcurl signs AWS requests from 7.75 on (Debian 11 has 7.74): no S3 with an older one
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(curl);
  return FailedPreconditionError("s3://" + r.bucket + ": S3 needs libcurl 7.75 or newer (its AWS SigV4 " +
                                 "signing); this program was built with libcurl " + LIBCURL_VERSION);
#endif
  curl_easy_setopt(curl, CURLOPT_USERNAME, credentials_.access_key_id.c_str());
  curl_easy_setopt(curl, CURLOPT_PASSWORD, credentials_.secret_access_key.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, stall);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, stall);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, ReadHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  if (r.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadBody);
    curl_easy_setopt(curl, CURLOPT_READDATA, &t);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  } else if (r.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, r.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  } else if (r.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (r.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (!r.range.empty()) curl_easy_setopt(curl, CURLOPT_RANGE, r.range.c_str());
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(curl);
  resp.status = t.status;
  resp.headers = std::move(t.headers);
  resp.body_bytes = t.body_bytes;
  const std::string what = S3ObjectName(r.bucket, r.key) + ": " + r.method;
  if (t.sink_stopped) return CancelledError(what + ": stopped by the reader");
  if (t.overflow)
    return DataLossError(what + ": response body over " + std::to_string(r.max_body) + " bytes");
  if (rc != CURLE_OK)
    return UnavailableError(what + " " + endpoint_.endpoint_url + ": " + curl_easy_strerror(rc) + " (after " +
                            std::to_string(t.body_bytes) + " body bytes)");
  return resp;
}

StatusOr<S3Client::Response> S3Client::Send(const Request& r, const S3Sink& sink) const {
  const std::string what = S3ObjectName(r.bucket, r.key) + ": " + r.method;
  for (int attempt = 1;; ++attempt) {
    StatusOr<Response> resp = Perform(r, sink);
    Status st = resp.status();
    if (st.ok() && resp->status >= 300) {
      // (The endpoint's words, decoded entities included: escaped before they reach a message.)
      const std::string code = EscapeForTerminal(XmlText(resp->body, "Code")),
                        message = EscapeForTerminal(XmlText(resp->body, "Message"));
      std::string text = what + ": HTTP " + std::to_string(resp->status);
      if (!code.empty()) text += " " + code;
      if (!message.empty()) text += ": " + message;
      st = Status(CodeOf(resp->status, code), text);
    }
    if (st.ok()) return resp;
    const bool delivered = sink && resp.ok() && resp->body_bytes > 0;
    if (st.code() != StatusCode::kUnavailable || attempt >= kAttempts || delivered) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(200 << attempt));
  }
}

Status S3Client::CreateBucket(const std::string& bucket) const {
  Request r{"PUT", bucket, "", ""};
  StatusOr<Response> resp = Send(r);
  if (!resp.ok() && resp.status().message().find("BucketAlreadyOwnedByYou") != std::string::npos)
    return Status();
  return resp.status();
}

Status S3Client::PutBody(const Request& base, std::string_view data, std::string* etag) const {
  Request r = base;
  r.method = "PUT";
  r.body = data;
  r.headers.push_back("Content-MD5: " + Md5Base64(data));
  r.headers.push_back("Content-Type: application/octet-stream");
  SFT_ASSIGN_OR_RETURN(Response resp, Send(r));
  const std::string got = Unquote(resp.headers["etag"]), want = Md5Hex(data);
  if (IsMd5Hex(got) && got != want)
    return DataLossError(S3ObjectName(r.bucket, r.key) + ": PUT: the server's ETag " + got +
                         " is not the MD5 of the bytes sent (" + want + ")");
  *etag = got;
  return Status();
}

Status S3Client::PutObject(const std::string& bucket, const std::string& key, std::string_view data) const {
  std::string etag;
  return PutBody(Request{"PUT", bucket, key, ""}, data, &etag);
}

StatusOr<S3ObjectInfo> S3Client::HeadObject(const std::string& bucket, const std::string& key) const {
  SFT_ASSIGN_OR_RETURN(Response resp, Send(Request{"HEAD", bucket, key, ""}));
  S3ObjectInfo info;
  info.key = key;
  info.size = std::strtoull(resp.headers["content-length"].c_str(), nullptr, 10);
  info.etag = Unquote(resp.headers["etag"]);
  return info;
}

StatusOr<std::string> S3Client::GetObject(const std::string& bucket, const std::string& key,
                                          uint64_t max_bytes) const {
  Request r{"GET", bucket, key, ""};
  r.max_body = max_bytes;
  StatusOr<Response> resp = Send(r);
  if (!resp.ok() && resp.status().code() == StatusCode::kDataLoss)
    return OutOfRangeError(S3ObjectName(bucket, key) + ": larger than " + std::to_string(max_bytes) +
                           " bytes");
  if (!resp.ok()) return resp.status();
  return std::move(resp->body);
}

Status S3Client::GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t length,
                          const S3Sink& sink) const {
  Request r{"GET", bucket, key, ""};
  r.range = std::to_string(offset) + "-" + std::to_string(offset + length - 1);
  // The sink never sees a byte past the range: an endpoint that sends more (a whole object for a
  // range) is stopped before the excess is written, not found out after.
  uint64_t taken = 0;
  bool too_long = false;
  const S3Sink bounded = [&](std::string_view data) {
    if (data.size() > length - taken) {
      too_long = true;
      return false;
    }
    taken += data.size();
    return sink(data);
  };
  StatusOr<Response> sent = Send(r, bounded);
  if (too_long)
    return DataLossError(S3ObjectName(bucket, key) + ": GET range " + r.range + ": more than the " +
                         std::to_string(length) + " bytes asked for");
  SFT_ASSIGN_OR_RETURN(Response resp, std::move(sent));
  if (resp.status != 206 && !(resp.status == 200 && offset == 0))
    return DataLossError(S3ObjectName(bucket, key) + ": GET range " + r.range + ": HTTP " +
                         std::to_string(resp.status) + " instead of 206");
  if (resp.body_bytes != length)
    return DataLossError(S3ObjectName(bucket, key) + ": GET range " + r.range + ": " +
                         std::to_string(resp.body_bytes) + " bytes instead of " + std::to_string(length));
  return Status();
}

Status S3Client::DeleteObject(const std::string& bucket, const std::string& key) const {
  StatusOr<Response> resp = Send(Request{"DELETE", bucket, key, ""});
  if (!resp.ok() && resp.status().code() == StatusCode::kNotFound &&
      resp.status().message().find("NoSuchKey") != std::string::npos)
    return Status();
  return resp.status();
}

}  // namespace sftctl
