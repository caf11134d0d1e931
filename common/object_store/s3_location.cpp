#include "common/object_store/s3_location.h"

#include <algorithm>

#include "common/hub/http_client.h"
#include "common/terminal_text.h"

namespace sftctl {

namespace {

// S3's bucket naming rules, loosely: 3-63 of [a-z0-9.-_], starting and ending alphanumeric (the
// underscore and upper case are allowed by some S3-compatible services, so accepted).
bool ValidBucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) return false;
  return std::isalnum(static_cast<unsigned char>(b.front())) &&
         std::isalnum(static_cast<unsigned char>(b.back()));
}

}  // namespace

bool IsS3Url(std::string_view s) { return s.substr(0, 5) == "s3://"; }

std::string S3Location::Url() const { return "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix); }

std::string S3Location::Key(std::string_view name) const {
  return prefix.empty() ? std::string(name) : prefix + "/" + std::string(name);
}

StatusOr<S3Location> ParseS3Url(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("'" + std::string(url) + "': not an s3://BUCKET[/PREFIX] reference: " + why);
  };
  if (!IsS3Url(url)) return bad("it must start with s3://");
  std::string_view rest = url.substr(5);
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucket(loc.bucket)) return bad("bucket name '" + loc.bucket + "' is not 3-63 of a-z 0-9 . - _");
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  for (size_t start = 0; !path.empty() && start <= path.size();) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view seg = path.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..") return bad("empty, '.' or '..' path segment");
    for (char c : seg)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad("control character in the prefix");
    start = end + 1;
  }
  loc.prefix = std::string(path);
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
