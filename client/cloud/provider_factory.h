// NewProvider: the CloudProvider (provider.h) of a profile's type. The one file that knows every
// implementation (lambda_cloud.h, runpod.h), so the interface's file includes none of them; a third
// provider is one more line here.
//
// Thread safety: NewProvider holds no state; the provider it returns is used from one thread at a time.
#pragma once

#include <memory>

#include "client/cloud/provider.h"
#include "common/net/http_client.h"
#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::client::cloud {

// The implementation of profile.type, the profile's empty api_url replaced by that provider's
// default; INVALID_ARGUMENT naming the type when there is none. `http` (nullptr: CurlHttpClient())
// and `clock` (rate limits, retry pauses; nullptr: Clock::Real()) are not owned and must outlive the
// provider.
StatusOr<std::unique_ptr<CloudProvider>> NewProvider(const ProviderProfile& profile, HttpClient* http,
                                                     const Clock* clock = Clock::Real());

}  // namespace sftctl::client::cloud
