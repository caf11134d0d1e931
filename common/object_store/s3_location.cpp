#include "common/object_store/s3_location.h"

#include <algorithm>

#include "common/net/http_client.h"
#include "common/spec/upload_to.h"
#include "common/terminal_text.h"

namespace sftctl {

bool IsS3Url(std::string_view s) { return s.substr(0, 5) == "s3://"; }

std::string S3Location::Url() const { return "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix); }

std::string S3Location::Key(std::string_view name) const {
  return prefix.empty() ? std::string(name) : prefix + "/" + std::string(name);
}

StatusOr<S3Location> ParseS3Url(std::string_view url) {
  // The rules are checkpoint.upload_to's, written once (common/spec/upload_to.h).
  StatusOr<S3Url> read = ReadS3Url(url);
  if (!read.ok()) {
    return InvalidArgumentError("'" + std::string(url) +
                                "': not an s3://BUCKET[/PREFIX] reference: " + read.status().message());
  }
  S3Location loc;
  loc.bucket = std::move(read->bucket);
  loc.prefix = std::move(read->prefix);
  return loc;
}

std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> params) {
  for (auto& [k, v] : params) {
    k = UrlEncode(k, false);
    v = UrlEncode(v, false);
  }
  std::sort(params.begin(), params.end());
  std::string q;
  for (const auto& [k, v] : params) q += (q.empty() ? "" : "&") + k + "=" + v;
  return q;
}

StatusOr<std::string> S3RequestUrl(const S3Endpoint& ep, const std::string& bucket, std::string_view key,
                                   const std::string& query) {
  // The region becomes part of a host name (and of SigV4's scope): AWS names only, e.g. eu-west-1.
  const std::string region = ep.Region();
  if (region.size() > 32 ||
      region.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos ||
      region.front() == '-') {
    return InvalidArgumentError(
        "field 'checkpoint.region': '" + EscapeForTerminal(region) +
        "' is not a region name (lower-case letters, digits and '-', e.g. eu-west-1)");
  }
  std::string base;
  if (ep.endpoint_url.empty()) {
    base = "https://" + bucket + ".s3." + ep.Region() + ".amazonaws.com/";
  } else {
    if (!IsHttpUrl(ep.endpoint_url))
      return InvalidArgumentError("endpoint_url '" + ep.endpoint_url +
                                  "' must be an http:// or https:// URL");
    base = ep.endpoint_url;
    if (base.back() != '/') base += '/';
    base += UrlEncode(bucket, false);
    if (!key.empty()) base += "/";
  }
  std::string url = base + UrlEncode(key, true);
  if (!query.empty()) url += "?" + query;
  return url;
}

}  // namespace sftctl
