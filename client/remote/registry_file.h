// The client's configuration folder (ClientConfigDir) and its registry files there (jobs.json:
// client/remote/job_registry.h; hosts.json: client/remote/rented_hosts.h): one JSON document each, read
// whole, changed by read-modify-write under an exclusive flock on "<path>.lock" and written atomically (a
// temporary sibling, fsynced and renamed), so sftctl processes running at once lose none of each other's
// changes and a reader never sees half a file.
//
// Thread safety: the functions hold no state; the lock also excludes other threads of this process.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"

namespace sftctl::client {

// This client's configuration folder: $XDG_CONFIG_HOME/sftctl (an absolute one), else
// $HOME/.config/sftctl. The registries, the provider keys (client/cloud/provider_config.h) and the
// checkpoint key (client/transfer/checkpoint_key.h) live there.
std::string ClientConfigDir();

// The file's text; "" when it does not exist. Errors name the path.
StatusOr<std::string> ReadRegistryText(const std::string& path);

// Creates the file's folder when missing, takes the lock, reads the text (as ReadRegistryText) and
// writes what `change` returns in its place. An error from `change` is returned and nothing is
// written. `change` runs with the lock held, so it must not update the same file.
Status UpdateRegistryFile(const std::string& path,
                          const std::function<StatusOr<std::string>(const std::string& text)>& change);

}  // namespace sftctl::client
