// The run keys that sign and check a bucket's checkpoint manifests (common/object_store/manifest_key.h),
// derived from one master key on this machine: $XDG_CONFIG_HOME/sftctl/checkpoint.key, else
// ~/.config/sftctl/checkpoint.key, made on first use (32 random bytes as hex, mode 0600, in a 0700
// folder). The master key never leaves this machine; a host gets only the run key of its job's own
// prefixes (submit sends them, the agent keeps them in memory).
//
// Thread safety: processes or threads making the file at once agree on one (each links a whole
// temporary file into place; link() never replaces); otherwise stateless.
#pragma once

#include <string>

#include "common/status.h"

namespace sftctl::client {

// The master key file's path.
std::string CheckpointKeyPath();

// The run key of the checkpoints under `s3_url` ("s3://bucket/prefix", as S3Location::Url() writes
// it). Errors: the key file cannot be made or read (naming it), or it is readable by others or not
// this user's (FAILED_PRECONDITION: chmod 600).
StatusOr<std::string> CheckpointRunKey(const std::string& s3_url);

}  // namespace sftctl::client
