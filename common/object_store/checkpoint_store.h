// Checkpoints in a bucket (docs/object-storage.md): the layout under s3://BUCKET/PREFIX is
//   checkpoint-000040/<the checkpoint's files, DONE included>
//   checkpoint-000040/MANIFEST.json    {"format":1,"step":40,"files":[{"path","size","sha256"},...]},
//                                      written last: a folder without it is not a checkpoint
//   metrics.jsonl, spec.json           the run's, refreshed after each checkpoint
// This file has the reader's side (the newest complete checkpoint; downloading it, verified) and the
// writer's side (uploading one folder, manifest last; pruning to `keep`). The bucket is untrusted:
// manifest paths are checked with common/safe_path.h, sizes and hashes verified.
//
// Thread safety: the functions are independent; each uses the S3Client from its calling thread
// (and the transfer's worker threads).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/checkpoint_name.h"  // CheckpointStep
#include "common/object_store/s3_client.h"
#include "common/object_store/s3_location.h"
#include "common/object_store/s3_transfer.h"
#include "common/status.h"

namespace sftctl {

inline constexpr const char* kManifestName = "MANIFEST.json";

struct ManifestFile {
  std::string path;  // relative to the checkpoint folder, '/'-separated
  uint64_t size = 0;
  std::string sha256;
};

struct CheckpointManifest {
  int64_t step = -1;
  std::string name;  // "checkpoint-000040"
  std::vector<ManifestFile> files;
  // "hmac-sha256:..." (manifest_key.h) when the run that uploaded it signed it; empty: unsigned.
  std::string signature;
  // The manifest's JSON, with its signature when it has one.
  std::string ToJson() const;
  // The JSON a signature covers: ToJson() without the signature.
  std::string UnsignedJson() const;
};

// Parses and checks a manifest read from `where` (an s3:// name for messages): known format, paths
// that stay beneath the folder, no duplicates, 64-hex sha256s. Errors: DATA_LOSS naming `where`.
StatusOr<CheckpointManifest> ParseManifest(std::string_view text, const std::string& where);

// The newest checkpoint under `loc` that has a MANIFEST.json (nullopt when there is none), its
// manifest read and checked. With a `run_key` (manifest_key.h) only a manifest signed with it counts:
// newer ones that are not (another run's, an sftctl's before signing, planted) are passed over, and
// when there are such but none signed, the result is FAILED_PRECONDITION naming them. Errors:
// S3Client's; ParseManifest's.
StatusOr<std::optional<CheckpointManifest>> NewestBucketCheckpoint(const S3Client& s3, const S3Location& loc,
                                                                   const std::string& run_key = "");

// Downloads the checkpoint `m` into <dest_dir>/<m.name>/ (files verified against the manifest; resumable:
// finished files whose size and sha256 match are kept; DONE written last). Progress, when given, gets
// each file's path after it is complete. Errors: DownloadFile's; INVALID_ARGUMENT for an unsafe path.
Status DownloadCheckpoint(const S3Client& s3, const S3Location& loc, const CheckpointManifest& m,
                          const std::string& dest_dir, const TransferOptions& opt,
                          const std::function<void(const std::string&)>& progress = nullptr);

// Uploads the complete local checkpoint folder `dir` (its name must be checkpoint-<N>) to
// <loc>/<name>/, every file verified, then MANIFEST.json. Files already in the bucket with the same
// size and the ETag this file's bytes give (an earlier, interrupted upload's) are not sent again.
// With a `run_key` the manifest is signed with it (manifest_key.h). Errors: the folder's read errors;
// S3Client's.
Status UploadCheckpoint(const S3Client& s3, const S3Location& loc, const std::string& dir,
                        const TransferOptions& opt, CheckpointManifest* manifest = nullptr,
                        const std::string& run_key = "");

// Keeps the newest `keep` complete checkpoints under `loc`: older ones lose their MANIFEST.json first
// (no reader takes them from then on), then their files; folders without a manifest older than the
// newest complete one (abandoned uploads) go too, with their unfinished multipart uploads. Returns the
// names removed.
StatusOr<std::vector<std::string>> PruneBucketCheckpoints(const S3Client& s3, const S3Location& loc,
                                                          int64_t keep);

}  // namespace sftctl
