// AWS credentials from the usual places, in the AWS CLI's order: AWS_ACCESS_KEY_ID +
// AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN) from the environment, else the profile AWS_PROFILE
// ("default" when unset) of the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, else
// ~/.aws/credentials). The region comes from AWS_REGION, else AWS_DEFAULT_REGION.
//
// The secret and the session token are never part of an error message, a log line or ToString().
// Pure functions over an environment lookup (a seam for tests); thread-safe when the lookup is.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "common/status.h"

namespace sftctl {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // "" : none
  std::string source;         // where they came from, for messages: "environment", "~/.aws/credentials [p]"
  bool empty() const { return access_key_id.empty(); }
};

// Returns the value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
// The process environment (getenv).
EnvLookup ProcessEnv();

// Errors: NOT_FOUND when no source has credentials (the message says where it looked), or the file
// named by AWS_PROFILE has no such profile; INVALID_ARGUMENT naming file:line for a malformed line or
// a profile with a key id but no secret (or the reverse); the file's read error.
StatusOr<AwsCredentials> LoadAwsCredentials(const EnvLookup& env);
// AWS_REGION, else AWS_DEFAULT_REGION, else "".
std::string RegionFromEnv(const EnvLookup& env);
// AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (the AWS CLI's names), else "" (AWS itself).
std::string EndpointFromEnv(const EnvLookup& env);

}  // namespace sftctl
