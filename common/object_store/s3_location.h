// Where objects live: `s3://BUCKET/PREFIX` references, the endpoint they are reached through, and the
// request URLs of the S3 REST API as SigV4 signing needs them (libcurl signs the path and the query
// exactly as written, so both are built here already canonical).
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace sftctl {

struct S3Location {
  std::string bucket;
  std::string prefix;  // "" or a key prefix without a leading '/', e.g. "runs/a" (no trailing '/')
  // "s3://bucket/prefix".
  std::string Url() const;
  // prefix + "/" + name ("name" when the prefix is empty).
  std::string Key(std::string_view name) const;
};

// "s3://BUCKET[/PREFIX][/]", by the rules of common/spec/upload_to.h (ReadS3Url: written once, for
// checkpoint.upload_to and every other s3:// reference). Errors: INVALID_ARGUMENT naming `url` (another
// scheme, an empty or malformed bucket name, an empty path segment such as "a//b", "." or "..").
StatusOr<S3Location> ParseS3Url(std::string_view url);
// True when `s` starts with "s3://".
bool IsS3Url(std::string_view s);

// How requests reach the bucket.
struct S3Endpoint {
  // "" : AWS (https://s3.<region>.amazonaws.com, virtual-host style); else http(s)://host[:port][/]
  // of an S3-compatible service (path style: http://host:port/bucket/key).
  std::string endpoint_url;
  std::string region;  // "" : us-east-1
  // REQUIRES: endpoint_url empty or http(s)://.
  std::string Region() const { return region.empty() ? "us-east-1" : region; }
};

// Query parameters in canonical order (sorted by name, names and values %-encoded, a parameter with
// no value written "name="), e.g. {{"uploads", ""}} -> "uploads=".
std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> params);
// The URL of `key` in `bucket` (key "" : the bucket itself), with `query` (already canonical) appended.
// Errors: INVALID_ARGUMENT when endpoint_url is not http(s)://.
StatusOr<std::string> S3RequestUrl(const S3Endpoint& ep, const std::string& bucket, std::string_view key,
                                   const std::string& query = "");

}  // namespace sftctl
