// A Hugging Face Hub model repository as a CheckpointDestination (checkpoint.upload_to:
// hf://ORG/NAME[@REVISION]; docs/hub.md "Uploading checkpoints"), for `run --local` (client) and for
// the agent's jobs alike.
//
// Each complete checkpoint becomes one commit (common/hub/hub_commit.h), "sftctl: checkpoint-N (step S)":
//   - `checkpoint.upload: all` (the default): checkpoint-N/ with every file of the checkpoint, the run's
//     metrics.jsonl and spec.json refreshed at the repository's root, and the checkpoint-M/ folders
//     beyond checkpoint.keep removed (they stay in the history);
//   - `checkpoint.upload: final` (only the run's last checkpoint is sent): its model files (weights,
//     config, tokenizer, adapter; not the optimizer state, trainer_state.json or DONE) at the
//     repository's root, so from_pretrained("ORG/NAME") and vLLM load it, with metrics.jsonl and
//     spec.json.
// Copies of metrics.jsonl and spec.json are staged in <run>/.hub-upload/.run-files (the trainer keeps
// appending to the metrics while they are sent).
//
// The token is HubOptions::token: kept in memory, sent only to the Hub (hub_commit.h), never written.
//
// Thread safety: the destination is used by one thread at a time (CheckpointUploader's).
#pragma once

#include <memory>
#include <string>

#include "common/hub/hf_hub.h"
#include "common/object_store/checkpoint_uploader.h"
#include "common/status.h"

namespace sftctl {

// The model repository `url` names: ParseHubRef's reading, in the shape checkpoint.upload_to's rules
// allow (common/spec/upload_to.h). Errors (INVALID_ARGUMENT, prefixed "checkpoint.upload_to: "): not
// an hf:// reference, a dataset, a path inside the repository.
StatusOr<HubRef> ParseHubUploadTarget(const std::string& url);

// Checks `url` as above and that `hub.token` is set (FAILED_PRECONDITION naming the repository and
// the write access needed, with `hub.token_advice` when set), makes sure the repository exists
// (created private when missing: a read-only token fails here, PERMISSION_DENIED), and returns the
// destination. `final_at_root`: the `checkpoint.upload: final` layout above.
StatusOr<std::unique_ptr<CheckpointDestination>> OpenHubDestination(const std::string& url, HubOptions hub,
                                                                    bool final_at_root);

}  // namespace sftctl
