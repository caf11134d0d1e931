// S3Client: the S3 REST API calls sftctl makes (objects, ranged reads, listings, multipart uploads)
// against AWS S3 or an S3-compatible service (R2, B2, MinIO, GCS's S3 API, moto in the tests),
// sent through the HTTP seam (common/net/http_client.h) and signed with AWS SigV4 by libcurl
// (HttpRequest::aws_sigv4). libcurl 7.88 leaves to the caller what this class does: the
// x-amz-content-sha256 header, a canonical query string, %-encoded keys, an XML content type on
// POST bodies (docs/object-storage.md).
//
// Integrity: every PUT of a body (an object or a multipart part) carries Content-MD5, which the
// server checks, and the returned ETag, when it is an MD5 (32 hex digits), must equal ours.
// Errors name the object (s3://bucket/key), the request and S3's error code and message:
//   PERMISSION_DENIED  403 / 401 (InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied, ...)
//   NOT_FOUND          404 (NoSuchBucket, NoSuchKey, NoSuchUpload)
//   RESOURCE_EXHAUSTED QuotaExceeded, EntityTooLarge, 507
//   DATA_LOSS          BadDigest / InvalidDigest, an ETag that is not our MD5, a short ranged body
//   UNAVAILABLE        connection refused / dropped / stalled, 5xx, 429 (retried first: kAttempts)
//   INVALID_ARGUMENT / FAILED_PRECONDITION / OUT_OF_RANGE  other 4xx
// Credentials never appear in a message.
//
// Thread safety: const methods may be called from several threads at once (as HttpClient::Send).
// The object owns its copy of the credentials, not the HttpClient.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/net/http_client.h"
#include "common/object_store/aws_credentials.h"
#include "common/object_store/s3_location.h"
#include "common/status.h"

namespace sftctl {

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // without quotes
};

struct S3MultipartUpload {
  std::string key;
  std::string upload_id;
};

struct S3Part {
  int number = 0;
  uint64_t size = 0;
  std::string etag;  // without quotes
};

// Receives body bytes as they arrive; returning false aborts the request (CANCELLED).
using S3Sink = std::function<bool(std::string_view)>;

class S3Client {
 public:
  static constexpr int kAttempts = 3;  // tries of a request that failed with UNAVAILABLE
  // `http`: where requests go (tests inject faults there). REQUIRES: it outlives this object.
  S3Client(S3Endpoint endpoint, AwsCredentials credentials, HttpClient* http = CurlHttpClient());

  const S3Endpoint& endpoint() const { return endpoint_; }
  // No byte for this long (connecting included) fails a request with UNAVAILABLE.
  void set_stall_timeout(std::chrono::seconds t) { stall_timeout_ = t; }

  // OK when the bucket exists already and is ours (BucketAlreadyOwnedByYou).
  Status CreateBucket(const std::string& bucket) const;
  Status PutObject(const std::string& bucket, const std::string& key, std::string_view data) const;
  StatusOr<S3ObjectInfo> HeadObject(const std::string& bucket, const std::string& key) const;
  // The whole object; OUT_OF_RANGE when it is larger than `max_bytes`.
  StatusOr<std::string> GetObject(const std::string& bucket, const std::string& key,
                                  uint64_t max_bytes = 64ull << 20) const;
  // Bytes [offset, offset + length) to `sink`. DATA_LOSS unless exactly `length` bytes came.
  // REQUIRES: length > 0. Not retried once a byte reached the sink (the caller knows how many did).
  Status GetRange(const std::string& bucket, const std::string& key, uint64_t offset, uint64_t length,
                  const S3Sink& sink) const;
  // Every object whose key starts with `prefix`, in key order (ListObjectsV2, page by page). A listed
  // key that does not start with `prefix` (a hostile or broken endpoint) is DATA_LOSS naming it, so
  // callers may cut `prefix` off every key. So is a listing still truncated past `max_objects`, or one
  // whose endpoint hands back the continuation token it was given: a listing never grows without end.
  StatusOr<std::vector<S3ObjectInfo>> ListObjects(const std::string& bucket, const std::string& prefix,
                                                  int page_size = 1000, size_t max_objects = 1'000'000) const;
  // OK when the key does not exist (S3's DELETE is idempotent).
  Status DeleteObject(const std::string& bucket, const std::string& key) const;

  // Multipart uploads. Parts are numbered from 1; all but the last must be >= 5 MiB (S3's rule).
  StatusOr<std::string> CreateMultipartUpload(const std::string& bucket, const std::string& key) const;
  // Returns the part's ETag (without quotes), verified against the part's MD5.
  StatusOr<std::string> UploadPart(const std::string& bucket, const std::string& key,
                                   const std::string& upload_id, int part_number,
                                   std::string_view data) const;
  // `etags[i]` is part i+1's.
  Status CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                 const std::string& upload_id, const std::vector<std::string>& etags) const;
  Status AbortMultipartUpload(const std::string& bucket, const std::string& key,
                              const std::string& upload_id) const;
  // Unfinished multipart uploads whose key starts with `prefix` (first 1000); DATA_LOSS as ListObjects
  // for a listed key outside `prefix`.
  StatusOr<std::vector<S3MultipartUpload>> ListMultipartUploads(const std::string& bucket,
                                                                const std::string& prefix) const;
  // The parts an unfinished upload holds (first 1000).
  StatusOr<std::vector<S3Part>> ListParts(const std::string& bucket, const std::string& key,
                                          const std::string& upload_id) const;

 private:
  struct Request {
    Request(std::string m, std::string b, std::string k, std::string q)
        : method(std::move(m)), bucket(std::move(b)), key(std::move(k)), query(std::move(q)) {}
    std::string method;  // GET HEAD PUT POST DELETE
    std::string bucket, key, query;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string_view body;            // PUT and POST
    std::string range;                // "first-last" for GET
    uint64_t max_body = 64ull << 20;  // collected body limit
  };
  // status, headers (names lower-case), the body when there is no sink (or it is an error's),
  // body_bytes.
  using Response = HttpResponse;
  // One attempt; an HTTP error status is not an error here. *delivered: the body bytes the sink
  // took, also when the attempt failed.
  StatusOr<Response> Perform(const Request& r, const S3Sink& sink, uint64_t* delivered) const;
  // Retries UNAVAILABLE, maps an error status to a Status.
  StatusOr<Response> Send(const Request& r, const S3Sink& sink = nullptr) const;
  Status PutBody(const Request& base, std::string_view data, std::string* etag) const;

  S3Endpoint endpoint_;
  AwsCredentials credentials_;
  HttpClient* http_;
  std::chrono::seconds stall_timeout_{60};
};

// "s3://bucket/key" for messages.
std::string S3ObjectName(const std::string& bucket, std::string_view key);
// Lowercase hex MD5 of `data`, and its base64 form (the Content-MD5 header's).
std::string Md5Hex(std::string_view data);
std::string Md5Base64(std::string_view data);

}  // namespace sftctl
