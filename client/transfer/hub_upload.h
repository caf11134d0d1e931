// `checkpoint.upload_to: hf://ORG/NAME[@REVISION]` for `run --local` (docs/hub.md "Uploading
// checkpoints"): the background CheckpointUploader (common/object_store/checkpoint_uploader.h: the same
// bounded queue as S3 uploads, intermediate checkpoints skipped when behind, never the last) with a Hub
// model repository as its destination (common/object_store/hub_destination.h: one commit per
// checkpoint, or with `checkpoint.upload: final` the last checkpoint's model at the root).
//
// The token is this machine's (HF_TOKEN, else the HF token file): kept in memory, never printed,
// never written to the run folder.
//
// Thread safety: one call at a time.
#pragma once

#include <memory>
#include <string>

#include "common/object_store/checkpoint_uploader.h"
#include "common/spec/spec.h"
#include "common/status.h"

namespace sftctl::client {

// REQUIRES: spec.checkpoint.upload_to is an hf:// reference. Starts the uploader; before training it
// makes sure the repository exists (created private when missing), so a missing or read-only token
// fails at once. Errors: OpenHubDestination's. Messages go to stderr as "sftctl: upload: ...".
StatusOr<std::unique_ptr<CheckpointUploader>> StartHubUploader(const JobSpec& spec);

// For `status` of a job whose host does not answer and whose checkpoints go to the Hub repository
// `upload_to` (hf://ORG/NAME): lines (each "  ...\n") naming the repository's newest complete
// checkpoint (a checkpoint-N/ folder with DONE) or its final model at the root, read with this
// machine's token, and how to fetch it; or why the repository cannot be read from here. Escaped for
// the terminal; never prints the token.
std::string HubStatusLines(const std::string& upload_to);

}  // namespace sftctl::client
