// checkpoint.upload_to (and `--upload-to`): where complete checkpoints are uploaded, and its rules,
// written once. Two forms:
//   s3://BUCKET[/PREFIX][/]   BUCKET: 3-63 of a-z 0-9 . - _ (upper case too: some S3-compatible
//                             services allow it), starting and ending with a letter or digit; PREFIX:
//                             '/'-separated segments, none empty, "." or "..", no control character.
//                             Every s3:// reference (`resume:`, `sftctl pull`) follows these rules:
//                             ParseS3Url (common/object_store/s3_location.h) reads them here.
//   hf://ORG/NAME[@REVISION]  a Hub model repository: not hf://datasets/..., no path inside it (the
//                             characters of the names are the Hub's to check: ParseHubRef in
//                             common/hub/hf_hub.h, before ParseHubUploadTarget asks here).
// The spec's check of the field (common/spec/spec_fields.cpp), ParseS3Url and ParseHubUploadTarget
// (common/object_store/hub_destination.h) all ask ReadUploadTo or ReadS3Url; each words its own
// message around the reason. In sftctl_spec, so the trainer's spec check needs no S3 or Hub library.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl {

struct S3Url {
  std::string bucket;
  std::string prefix;  // "" or segments joined by '/', without a leading or trailing '/'
};

// `url` read as s3://BUCKET[/PREFIX][/]. Errors: INVALID_ARGUMENT whose message is the reason alone
// ("it must start with s3://", "bucket name 'x' is not 3-63 of a-z 0-9 . - _", "empty, '.' or '..'
// path segment", "control character in the prefix").
StatusOr<S3Url> ReadS3Url(std::string_view url);

struct UploadTo {
  enum class Kind { kNone, kS3, kHub };
  Kind kind = Kind::kNone;  // kNone: "" (no upload)
  S3Url s3;                 // kS3
};

// checkpoint.upload_to read by the rules above: "" is kNone. Errors: INVALID_ARGUMENT whose message is
// the reason alone (ReadS3Url's for an s3:// value; "not a model repository hf://ORG/NAME[@REVISION]
// without a path" for an hf:// one; "neither s3:// nor hf://" else).
StatusOr<UploadTo> ReadUploadTo(std::string_view url);

}  // namespace sftctl
