#include "common/spec/upload_to.h"

#include <algorithm>
#include <cctype>

#include "common/spec/hub_path.h"

namespace sftctl {
namespace {

constexpr std::string_view kS3Scheme = "s3://";

// S3's bucket naming rules, loosely (see the header).
bool ValidBucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) return false;
  return std::isalnum(static_cast<unsigned char>(b.front())) &&
         std::isalnum(static_cast<unsigned char>(b.back()));
}

// hf://ORG/NAME[@REVISION] with both names given and nothing after them.
bool HubModelRepository(std::string_view url) {
  if (!IsHubPath(url)) return false;
  const std::string_view rest = url.substr(kHubScheme.size());
  const size_t slash = rest.find('/');
  return rest.rfind("datasets/", 0) != 0 && slash != std::string_view::npos && slash > 0 &&
         slash + 1 < rest.size() && rest.find('/', slash + 1) == std::string_view::npos;
}

}  // namespace

StatusOr<S3Url> ReadS3Url(std::string_view url) {
  if (url.substr(0, kS3Scheme.size()) != kS3Scheme) return InvalidArgumentError("it must start with s3://");
  const std::string_view rest = url.substr(kS3Scheme.size());
  const size_t slash = rest.find('/');
  S3Url out;
  out.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucket(out.bucket))
    return InvalidArgumentError("bucket name '" + out.bucket + "' is not 3-63 of a-z 0-9 . - _");
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  for (size_t start = 0; !path.empty() && start <= path.size();) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view seg = path.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..")
      return InvalidArgumentError("empty, '.' or '..' path segment");
    for (char c : seg)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
        return InvalidArgumentError("control character in the prefix");
    start = end + 1;
  }
  out.prefix = std::string(path);
  return out;
}

StatusOr<UploadTo> ReadUploadTo(std::string_view url) {
  UploadTo out;
  if (url.empty()) return out;
  if (url.substr(0, kS3Scheme.size()) == kS3Scheme) {
    SFT_ASSIGN_OR_RETURN(out.s3, ReadS3Url(url));
    out.kind = UploadTo::Kind::kS3;
    return out;
  }
  if (IsHubPath(url)) {
    if (!HubModelRepository(url))
      return InvalidArgumentError("not a model repository hf://ORG/NAME[@REVISION] without a path");
    out.kind = UploadTo::Kind::kHub;
    return out;
  }
  return InvalidArgumentError("neither s3:// nor hf://");
}

}  // namespace sftctl
