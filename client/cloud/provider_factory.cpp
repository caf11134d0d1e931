#include "client/cloud/provider_factory.h"

#include "client/cloud/lambda_cloud.h"
#include "client/cloud/runpod.h"
#include "common/terminal_text.h"

namespace sftctl::client::cloud {

StatusOr<std::unique_ptr<CloudProvider>> NewProvider(const ProviderProfile& profile, HttpClient* http,
                                                     const Clock* clock) {
  if (http == nullptr) http = CurlHttpClient();
  if (clock == nullptr) clock = Clock::Real();
  ProviderProfile p = profile;
  if (p.type == "lambda") {
    if (p.api_url.empty()) p.api_url = LambdaCloud::kDefaultApiUrl;
    return std::unique_ptr<CloudProvider>(new LambdaCloud(std::move(p), http, clock));
  }
  if (p.type == "runpod") {
    if (p.api_url.empty()) p.api_url = RunPod::kDefaultApiUrl;
    return std::unique_ptr<CloudProvider>(new RunPod(std::move(p), http, clock));
  }
  return InvalidArgumentError(profile.name + ": unknown provider type '" + EscapeForTerminal(profile.type) +
                              "' (known: lambda, runpod)");
}

}  // namespace sftctl::client::cloud
