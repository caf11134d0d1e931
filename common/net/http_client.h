// HttpClient: the one seam through which sftctl speaks HTTP(S): the Hugging Face Hub
// (common/hub/hf_hub.h), S3 (common/object_store/s3_client.h), the GPU providers' APIs
// (client/cloud/) and the agent's terminate request (agent/stopping/stop_action.h).
//
// One request at a time per call: GET, HEAD, or POST/PUT with a body, extra request headers, the
// response's status, its headers (names lower-cased) and its body, either collected or streamed to a
// sink. Redirects are followed by the client itself (at most kMaxRedirects) when the request asks
// for it, and an `Authorization` header is sent only to the origin (scheme, host and port) of the
// request's URL: a redirect to another origin (a CDN) drops it, as the Hub's own clients do.
//
// The server is not trusted: only http:// and https:// URLs are fetched (a redirect to file://,
// ftp://, ... is refused, and libcurl itself is limited to those two), and a body never runs past
// what its response declared (Content-Length) or the request allows (max_body_bytes): the bytes
// past it never reach the sink.
//
// A request may instead be signed with AWS Signature V4 (HttpRequest::aws_sigv4, S3's
// authentication): libcurl computes the signature over the method, URL and headers.
//
// CurlHttpClient is the libcurl implementation (TLS verified, HTTP/1.1 or 2, proxies from the usual
// environment variables). Tests use it against a local server, or wrap the interface to inject faults.
//
// Thread safety: an HttpClient may be used by several threads at once (each Send has its own handle).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace sftctl {

// AWS Signature V4 for one request (libcurl's CURLOPT_AWS_SIGV4): `provider` as libcurl takes it
// ("aws:amz:<region>:<service>"), the key pair it signs with. Neither key is sent.
struct AwsSigV4 {
  std::string provider;
  std::string access_key_id;
  std::string secret_access_key;
};

struct HttpRequest {
  std::string method = "GET";  // GET | HEAD | POST | PUT | DELETE
  std::string url;
  // The body of a POST or PUT: `body`, or `body_view` (not copied: it must outlive Send) when that
  // is not empty, or the content of the file `body_file` (read as it is sent; sent again from its
  // start after a redirect) when that is set.
  std::string body;
  std::string_view body_view;
  std::string body_file;
  uint64_t body_offset = 0;           // of body_file: the bytes [offset, offset + length) are sent
  uint64_t body_length = UINT64_MAX;  // (up to the end of the file)
  std::vector<std::pair<std::string, std::string>> headers;  // {"Range", "bytes=10-"}, ...
  bool follow_redirects = true;
  // No byte for this long (connect included) fails the request with UNAVAILABLE.
  std::chrono::seconds stall_timeout{60};
  // The most body bytes of the final response accepted (DATA_LOSS past it); 0: no limit of its own
  // when the body goes to a sink, kMaxCollectedBodyBytes when it is collected into HttpResponse::body.
  uint64_t max_body_bytes = 0;
  // With a sink: the body of an error response (status >= 300) is collected into
  // HttpResponse::body instead (at most kMaxErrorBodyBytes, DATA_LOSS past it), for a service that
  // explains its errors there (S3).
  bool collect_error_body = false;
  // Signed with AWS SigV4 when set: libcurl adds the Authorization header (the caller sends none).
  // FAILED_PRECONDITION with a libcurl older than 7.75, which cannot sign.
  std::optional<AwsSigV4> aws_sigv4;
};

struct HttpResponse {
  long status = 0;                             // of the last response (after redirects)
  std::map<std::string, std::string> headers;  // of the last response; names lower-case
  std::string body;                            // when Send had no sink
  std::string url;                             // the URL that answered (after redirects)
  uint64_t body_bytes = 0;                     // bytes of the last response's body received
};

// Receives body bytes as they arrive; returning false aborts the transfer (CANCELLED).
using HttpSink = std::function<bool(std::string_view)>;
// Called with the final response's status and headers before its first body byte; a non-OK status
// aborts the transfer with that status (e.g. the response is not the one the caller can use).
using HttpHeadersCheck = std::function<Status(const HttpResponse&)>;

class HttpClient {
 public:
  static constexpr int kMaxRedirects = 10;
  static constexpr uint64_t kMaxCollectedBodyBytes = 256ull << 20;
  static constexpr uint64_t kMaxErrorBodyBytes = 1ull << 20;
  virtual ~HttpClient() = default;

  // Sends `req`. Body bytes of the final response go to `sink` when given (those of redirect
  // responses are discarded), else into HttpResponse::body. An HTTP error status is not an error
  // here: the caller reads HttpResponse::status. Errors: UNAVAILABLE (connection failed, dropped or
  // stalled mid-body; the message names the URL and how many body bytes arrived), CANCELLED (the sink
  // said stop), the check's status, INVALID_ARGUMENT (a malformed URL or redirect, or one whose scheme
  // is not http or https), DATA_LOSS (the body ran past its Content-Length or max_body_bytes; the
  // sink got no byte past it).
  virtual StatusOr<HttpResponse> Send(const HttpRequest& req, const HttpSink& sink = nullptr,
                                      const HttpHeadersCheck& check = nullptr) = 0;
};

// The process-wide libcurl client. Never null; not owned by the caller.
HttpClient* CurlHttpClient();

// True when `url` is absolute with the scheme http or https (any case).
bool IsHttpUrl(std::string_view url);
// "scheme://host[:port]" of an absolute URL, lower-cased; "" when `url` is not absolute.
std::string UrlOrigin(std::string_view url);
// `location` (absolute, or relative to `base` as in a Location header) as an absolute URL.
std::string ResolveUrl(std::string_view base, std::string_view location);
// Percent-encodes every byte except unreserved characters and, when `keep_slash`, '/'.
std::string UrlEncode(std::string_view s, bool keep_slash);

}  // namespace sftctl
