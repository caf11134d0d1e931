// Provider profiles and their API keys: which providers `sftctl offers`, `up`, `down` and `hosts` can
// reach, and with which key. docs/remote.md, "Renting a host".
//
// Built in: "lambda" (Lambda Cloud, https://cloud.lambda.ai/api/v1) and "runpod" (RunPod,
// https://api.runpod.io). $XDG_CONFIG_HOME/sftctl/providers.json (default ~/.config/sftctl/) may
// change their api_url or add profiles of the user's own (another account, a test server):
//   {"providers": {"fake-lambda": {"type": "lambda", "api_url": "http://127.0.0.1:8080/api/v1",
//                                  "ssh_port": 2222, "ssh_user": "root", "image": ""}}}
// That file holds no key: an "api_key" field is refused, so the file can be shared or committed. And
// as a copied file must not decide where a key goes, it is held to this (INVALID_ARGUMENT naming the
// file and the field otherwise):
//   * api_url is https:// (http:// only to this machine: 127.0.0.1/8, [::1], localhost), no user name;
//   * unless the user opted in on this machine, by naming the profile in the environment variable
//     SFTCTL_PROVIDER_OVERRIDES (comma-separated: "lambda,team-lambda"): api_key_env, if given, is the
//     profile's own variable (DefaultKeyVariable), and a built-in profile keeps its api_url.
// The file is read with ParseJson (common/json_parse.h).
//
// A profile's key comes from, in order: the environment variable api_key_env (default: the name
// upper-cased, '-' as '_', then "_API_KEY": LAMBDA_API_KEY, RUNPOD_API_KEY, FAKE_LAMBDA_API_KEY),
// else the file $XDG_CONFIG_HOME/sftctl/keys/<name>, which must be a regular file of this user with
// no permission for group or others (0600 or 0400), else none. A key is never taken from argv.
//
// Thread safety: plain functions; they read the environment and files.
#pragma once

#include <string>
#include <vector>

#include "client/cloud/provider.h"
#include "common/status.h"

namespace sftctl::client::cloud {

// The opt-in above: profiles whose providers.json entry may read another variable or move a built-in.
constexpr const char* kProviderOverridesVariable = "SFTCTL_PROVIDER_OVERRIDES";

struct ProviderConfig {
  std::string config_dir;  // empty: ClientConfigDir() (client/remote/registry_file.h)
};

// Every profile (built-in first, then the file's, in name order), keys filled where one is found.
// Errors: INVALID_ARGUMENT naming providers.json and the field (unknown type, a bad name or URL, an
// api_key field); PERMISSION_DENIED naming a key file that others may read; DATA_LOSS for a file
// that is not JSON.
StatusOr<std::vector<ProviderProfile>> LoadProviderProfiles(const ProviderConfig& config = {});

// The profile called `name`, with its key. NOT_FOUND listing the known names; FAILED_PRECONDITION
// when it has no key, saying where to put one.
StatusOr<ProviderProfile> FindProviderProfile(const std::string& name, const ProviderConfig& config = {});

// The profiles that have a key (what `offers` and `hosts` ask when no --provider is given).
StatusOr<std::vector<ProviderProfile>> ConfiguredProviderProfiles(const ProviderConfig& config = {});

// "LAMBDA_API_KEY" for "lambda", "FAKE_LAMBDA_API_KEY" for "fake-lambda".
std::string DefaultKeyVariable(const std::string& profile_name);

}  // namespace sftctl::client::cloud
