// RunPod: CloudProvider over the RunPod REST API v2 (api_url "https://api.runpod.io"; paths /v2/...;
// REST v1 at rest.runpod.io was retired).
//
// Reference: https://docs.runpod.io/api-reference-v2/overview (OpenAPI:
// https://api.runpod.io/v2/openapi.json). Errors are RFC 7807 problem+json: {"title", "status", "detail",
// "errors"?: [string]}. Endpoints used:
//   GET  /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=SECURE&count=N
//        https://docs.runpod.io/api-reference-v2/catalog/list-gpu-types
//        {gpus: [{id, name, memory (GB), secure (bool), price: {secure, community} (USD per GPU-hour),
//        maxCount: {secure, community}, availability: NONE|LOW|MEDIUM|HIGH, dataCenters: [{id, name,
//        availability}]}]} -> one Offer per data center whose availability is not NONE (region "" when
//        the type lists none), N GPUs (gpu_count, or 1 when any count will do), price N x price.secure
//   POST /v2/pods  https://docs.runpod.io/api-reference-v2/pods/create-a-pod
//        {name, image, gpu: {id, count}, cloud: "SECURE", dataCenterIds: [region]?, ports: ["22/tcp"],
//        disk, env: {PUBLIC_KEY: <the key line>}} -> 201 Pod. RunPod images start sshd with PUBLIC_KEY
//        as root's authorized key. The reference says a 400 covers both a broken rule and "no capacity"
//        (capacity has no code of its own) and advises trying the next candidate: 400 is
//        RESOURCE_EXHAUSTED; 402 (balance) FAILED_PRECONDITION; 422 INVALID_ARGUMENT.
//   GET  /v2/pods/{id}  https://docs.runpod.io/api-reference-v2/pods/get-a-pod
//        Pod {id, name, status: PROVISIONING|STARTING|RUNNING|EXITED|ERROR|TERMINATED, gpu: {id, count},
//        dataCenterId, cost (USD/h), createdAt, ssh: {direct: {host, port, username}|null},
//        runtime: {ports: [{private, public, type, ip}]}|null}. SSH: ssh.direct, else the runtime port
//        whose private port is 22 (type tcp): both appear only once the pod runs.
//   GET  /v2/pods  https://docs.runpod.io/api-reference-v2/pods/list-pods  {pods: [Pod]}
//   POST /v2/pods/{id}/action {"action": "terminate"} -> 204
//        https://docs.runpod.io/api-reference-v2/pods/trigger-a-pod-state-transition (the same as
//        DELETE /v2/pods/{id}, which the HttpClient seam cannot send); 404 means already gone.
// Rate limits: per-user windows (minute, hour, day) published in RateLimit / RateLimit-Policy headers;
// a 429 carries Retry-After (seconds), honoured by provider_api.h's retry policy.
//
// SSH user "root" (ProviderProfile::ssh_user overrides it; ssh_port > 0 overrides the mapped port).
// Image: ProviderProfile::image, else kDefaultImage.
//
// Thread safety: one thread at a time (CloudProvider).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/cloud/provider.h"
#include "client/cloud/provider_api.h"

namespace sftctl::client::cloud {

class RunPod final : public CloudProvider {
 public:
  static constexpr const char* kDefaultApiUrl = "https://api.runpod.io";
  static constexpr const char* kDefaultImage = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404";
  static constexpr int kDiskGb = 100;  // the container disk of new pods

  // `http` and `clock` are not owned and must outlive this object.
  RunPod(ProviderProfile profile, HttpClient* http, const Clock* clock);

  const ProviderProfile& profile() const override { return api_.profile(); }
  StatusOr<std::vector<Offer>> ListOffers(const std::string& gpu, int gpu_count) override;
  // Registers nothing (the key travels with the pod); returns the name Lambda would give it.
  StatusOr<std::string> EnsureSshKey(const std::string& public_key) override;
  StatusOr<std::string> Launch(const LaunchRequest& req) override;
  StatusOr<Instance> GetInstance(const std::string& id) override;
  StatusOr<std::vector<Instance>> ListInstances() override;
  Status Terminate(const std::string& id) override;

 private:
  StatusOr<Instance> ParsePod(const ApiRequest& req, const nlohmann::json& j) const;

  ProviderApi api_;
};

// RunPod's pod status as an InstanceState.
InstanceState RunPodState(const std::string& status);

// Milliseconds since the Unix epoch of an RFC 3339 UTC time ("2026-06-01T12:00:00Z", fractions and
// a "+00:00" offset allowed); 0 when `text` is not one.
int64_t ParseRfc3339Millis(const std::string& text);

}  // namespace sftctl::client::cloud
