// `checkpoint.upload_to: hf://ORG/NAME[@REVISION]` for `run --local` (docs/hub.md "Uploading
// checkpoints"): the background CheckpointUploader (common/object_store/checkpoint_uploader.h: the same
// bounded queue as S3 uploads, intermediate checkpoints skipped when behind, never the last) with a Hub
// model repository as its destination. Each complete checkpoint becomes one commit
// (common/hub/hub_commit.h) "sftctl: checkpoint-N (step S)" that adds checkpoint-N/ with every file of
// the checkpoint, refreshes metrics.jsonl and spec.json at the repository's root, and removes the
// checkpoint-M/ folders beyond checkpoint.keep. Staging is <run>/.hub-upload.
//
// The token is this machine's (HF_TOKEN, else the HF token file): kept in memory, never printed,
// never written to the run folder.
//
// Thread safety: one call at a time.
#pragma once

#include <memory>

#include "common/object_store/checkpoint_uploader.h"
#include "common/spec.h"
#include "common/status.h"

namespace sftctl::client {

// Starts the uploader when spec.checkpoint.upload_to is an hf:// reference. Before training it makes
// sure the repository exists (created private when missing), so a missing or read-only token fails at
// once. Errors: INVALID_ARGUMENT for a malformed reference (a dataset, a PATH); FAILED_PRECONDITION
// without a token; HubCommitter's (PERMISSION_DENIED naming the repository and the write access the
// token lacks). Messages go to stderr as "sftctl: upload: ...".
StatusOr<std::unique_ptr<CheckpointUploader>> StartHubUploader(const JobSpec& spec);

}  // namespace sftctl::client
