// Whole files to and from S3, several requests at a time: UploadFile (one PUT, or a multipart upload
// whose parts go up in parallel, each verified by Content-MD5 and its ETag, resumable from an
// unfinished upload of the same key) and DownloadFile (ranged GETs in parallel into "<dest>.part", a
// RangeLog sidecar so a later call resumes, sha256-checked before the rename to `dest`).
//
// Thread safety: each call is independent; it runs its own worker threads and joins them before
// returning. The S3Client must outlive the call.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/object_store/s3_client.h"
#include "common/status.h"

namespace sftctl {

struct TransferOptions {
  static constexpr uint64_t kMinPartSize = 5ull << 20;  // S3's minimum for all but the last part
  uint64_t part_size = 16ull << 20;  // multipart part / ranged GET size; raised to kMinPartSize
  int parallel = 4;                  // requests at once
  // Set by another thread to stop early (CANCELLED); may be null.
  const std::atomic<bool>* cancel = nullptr;
};

struct TransferStats {
  uint64_t bytes_sent = 0;     // bytes this call moved (resumed parts not counted)
  uint64_t bytes_resumed = 0;  // bytes an earlier, interrupted call had already moved
  int parts = 0;               // parts (or ranges) of the object; 1 for a single PUT/GET
};

// Uploads `path` to bucket/key: one PUT up to part_size, else multipart. An unfinished multipart upload
// of the same key (an earlier, interrupted call) is continued: its parts whose size and MD5 match the
// file's are kept. On an error the multipart upload is left for a later call to continue (S3's
// lifecycle rules, or AbortMultipartUpload, remove abandoned ones). The object appears only when
// complete. Errors: the file's read errors; S3Client's.
Status UploadFile(const S3Client& s3, const std::string& bucket, const std::string& key,
                  const std::string& path, const TransferOptions& opt, TransferStats* stats = nullptr);

// Downloads bucket/key, `size` bytes whose sha256 must be `sha256`, to `dest` (replacing it), through
// "<dest>.part" and "<dest>.part.ranges" (resumed when they name the same size and sha256). Errors:
// DATA_LOSS when the object's size or hash is not the expected one (the .part files are removed);
// write errors (a symbolic link at either .part name is never followed: "cannot open"... ELOOP);
// S3Client's.
Status DownloadFile(const S3Client& s3, const std::string& bucket, const std::string& key, uint64_t size,
                    const std::string& sha256, const std::string& dest, const TransferOptions& opt,
                    TransferStats* stats = nullptr);

}  // namespace sftctl
