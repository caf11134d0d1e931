// Whose checkpoints these are (docs/object-storage.md, "Whose checkpoints a resume takes").
//
// A bucket may hold checkpoint folders a run did not write: another run's, or ones planted by anyone
// who can write there, with a MANIFEST.json that is consistent with its files. A resume must not take
// those. So a run signs each manifest it uploads with a key that never enters the bucket, and a resume
// takes only manifests signed with its key:
//   run key    HMAC-SHA256(master key, "sftctl checkpoint key v1\n" + "s3://bucket/prefix"): one
//              prefix's key; a host given its job's key learns nothing about other prefixes (the
//              master key stays on the laptop, client/transfer/checkpoint_key.h).
//   signature  "hmac-sha256:" + hex HMAC-SHA256(run key, the manifest's JSON without its signature)
//              in the manifest's "signature" field (checkpoint_store.h).
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace sftctl {

// The key of the checkpoints under `s3_url` (an S3Location::Url(), "s3://bucket/prefix").
std::string DeriveRunKey(std::string_view master_key, std::string_view s3_url);

// The signature of `unsigned_json` with `run_key` ("hmac-sha256:<64 hex>").
std::string SignManifest(std::string_view run_key, std::string_view unsigned_json);

// Whether `signature` is SignManifest(run_key, unsigned_json), compared in constant time.
bool SignatureMatches(std::string_view run_key, std::string_view unsigned_json, std::string_view signature);

}  // namespace sftctl
