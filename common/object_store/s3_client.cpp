#include "common/object_store/s3_client.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include "common/object_store/s3_xml.h"
#include "common/terminal_text.h"

namespace sftctl {

namespace {

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

S3Client::S3Client(S3Endpoint endpoint, AwsCredentials credentials, HttpClient* http)
    : endpoint_(std::move(endpoint)), credentials_(std::move(credentials)), http_(http) {}

StatusOr<S3Client::Response> S3Client::Perform(const Request& r, const S3Sink& sink,
                                               uint64_t* delivered) const {
  SFT_ASSIGN_OR_RETURN(const std::string url, S3RequestUrl(endpoint_, r.bucket, r.key, r.query));
  HttpRequest req;
  req.method = r.method;
  req.url = url;
  req.headers = {{"x-amz-content-sha256", "UNSIGNED-PAYLOAD"}};
  if (!credentials_.session_token.empty())
    req.headers.emplace_back("x-amz-security-token", credentials_.session_token);
  req.headers.insert(req.headers.end(), r.headers.begin(), r.headers.end());
  if (!r.range.empty()) req.headers.emplace_back("Range", "bytes=" + r.range);
  req.body_view = r.body;
  req.follow_redirects = false;
  req.stall_timeout = stall_timeout_;
  req.max_body_bytes = sink ? 0 : r.max_body;
  req.collect_error_body = true;  // S3 explains an error in its body (Send reads Code and Message)
  req.aws_sigv4 = AwsSigV4{"aws:amz:" + endpoint_.Region() + ":s3", credentials_.access_key_id,
                           credentials_.secret_access_key};
  bool stopped = false;
  const HttpSink counted = [&](std::string_view data) {
    if (!sink(data)) {
      stopped = true;
      return false;
    }
    *delivered += data.size();
    return true;
  };
  StatusOr<HttpResponse> got = http_->Send(req, sink ? counted : HttpSink());
  const std::string what = S3ObjectName(r.bucket, r.key) + ": " + r.method;
  if (stopped) return CancelledError(what + ": stopped by the reader");
  if (!got.ok()) {
    // (HttpClient's message names the method and the URL, which holds no credential.)
    return Status(got.status().code(), S3ObjectName(r.bucket, r.key) + ": " + got.status().message());
  }
  return got;
}

StatusOr<S3Client::Response> S3Client::Send(const Request& r, const S3Sink& sink) const {
  const std::string what = S3ObjectName(r.bucket, r.key) + ": " + r.method;
  uint64_t delivered = 0;  // body bytes the sink took, over every attempt
  for (int attempt = 1;; ++attempt) {
    StatusOr<Response> resp = Perform(r, sink, &delivered);
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
    // A sink that took bytes would take them again: the caller knows how many arrived.
    if (st.code() != StatusCode::kUnavailable || attempt >= kAttempts || delivered > 0) return st;
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
  r.headers.emplace_back("Content-MD5", Md5Base64(data));
  r.headers.emplace_back("Content-Type", "application/octet-stream");
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
  if (!sent.ok()) return sent.status();
  const Response& resp = *sent;
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
