// LambdaCloud: CloudProvider over the Lambda Cloud API v1 (api_url "https://cloud.lambda.ai/api/v1").
//
// Reference: https://docs.lambda.ai/api/cloud (OpenAPI 1.10). Every answer is {"data": ...}; every
// error is {"error": {"code", "message", "suggestion"?}}, read by its code. Endpoints used:
//   GET  /instance-types                 (#listInstanceTypes) data: {name: {instance_type: {name,
//        description, gpu_description, price_cents_per_hour, specs: {vcpus, memory_gib, storage_gib,
//        gpus}}, regions_with_capacity_available: [{name, description}]}} -> one Offer per region
//   GET  /ssh-keys                       (#listSSHKeys) data: [{id, name, public_key}]
//   POST /ssh-keys {name, public_key}    (#addSSHKey) data: {id, name, public_key}
//   POST /instance-operations/launch     (#launchInstance) {region_name, instance_type_name,
//        ssh_key_names: [one], name} -> data: {instance_ids: [id]}
//   GET  /instances/{id}                 (#getInstance) data: Instance {id, name, ip, status, region:
//        {name}, instance_type: {name, price_cents_per_hour, ...}, ...}; ip only once assigned
//   GET  /instances                      (#listInstances) data: [Instance]
//   POST /instance-operations/terminate  (#terminateInstance) {instance_ids: [id]}
// Status words: booting, active, unhealthy, terminating, terminated, preempted.
// Error codes read: instance-operations/launch/insufficient-capacity (RESOURCE_EXHAUSTED),
// global/object-does-not-exist and global/not-found (NOT_FOUND), global/invalid-api-key (401),
// global/quota-exceeded (RESOURCE_EXHAUSTED); the rest by HTTP status (provider_api.h).
// Rate limits (the reference's introduction): about one request per second in general, and the launch
// endpoint one request per 12 s (five a minute): launches are spaced kLaunchInterval apart on the
// clock; a 429 is retried after Retry-After.
//
// SSH: user "ubuntu" (Lambda Stack images), port 22, host `ip`; ProviderProfile::ssh_port/ssh_user
// override them. Keys: EnsureSshKey registers the public key once as "sftctl-<12 hex digits of the
// SHA-256 of the key>" and reuses any registered key with the same type and key material.
//
// Thread safety: one thread at a time (CloudProvider).
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/cloud/provider.h"
#include "client/cloud/provider_api.h"
#include "common/lambda_api.h"

namespace sftctl::client::cloud {

class LambdaCloud final : public CloudProvider {
 public:
  static constexpr const char* kDefaultApiUrl = kLambdaApiUrl;  // common/lambda_api.h, the agent's too
  static constexpr std::chrono::seconds kLaunchInterval{12};

  // `http` and `clock` are not owned and must outlive this object.
  LambdaCloud(ProviderProfile profile, HttpClient* http, const Clock* clock);

  const ProviderProfile& profile() const override { return api_.profile(); }
  StatusOr<std::vector<Offer>> ListOffers(const std::string& gpu, int gpu_count) override;
  StatusOr<std::string> EnsureSshKey(const std::string& public_key) override;
  StatusOr<std::string> Launch(const LaunchRequest& req) override;
  StatusOr<Instance> GetInstance(const std::string& id) override;
  StatusOr<std::vector<Instance>> ListInstances() override;
  Status Terminate(const std::string& id) override;

 private:
  StatusOr<Instance> ParseInstance(const ApiRequest& req, const nlohmann::json& j) const;

  ProviderApi api_;
  LaunchSpacer spacer_;
};

// Lambda's status word as an InstanceState.
InstanceState LambdaState(const std::string& status);

}  // namespace sftctl::client::cloud
