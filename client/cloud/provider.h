// CloudProvider: renting GPU hosts through a provider's HTTP API (`sftctl offers`, `up`, `down`,
// `hosts`; docs/remote.md, "Renting a host"). One implementation per provider, one file each:
// lambda_cloud.h (Lambda Cloud API v1), runpod.h (RunPod REST API v2). A third provider is one more
// file and one line in NewProvider (provider_factory.h, the one file that knows them all).
//
// The provider is not trusted more than any server: its JSON is parsed without exceptions, strings it
// sends are shown only through EscapeForTerminal, and the API key goes only to the profile's api_url
// origin (HttpClient drops Authorization on a redirect elsewhere). The key is never part of a Status
// message, a log line or an Instance.
//
// Errors, the same for every provider (the caller's policy reads the code, never the text):
//   UNAUTHENTICATED / PERMISSION_DENIED  the key was refused (401 / 403)
//   RESOURCE_EXHAUSTED                   no capacity for that offer now (the caller tries the next)
//   UNAVAILABLE                          the API could not be reached, or kept answering 429 / 5xx
//                                        after the retries (provider_api.h)
//   NOT_FOUND                            no such instance (also: one the provider already forgot)
//   INVALID_ARGUMENT                     the provider refused the request as malformed (its message)
//   FAILED_PRECONDITION                  the account cannot pay for it (RunPod's 402: insufficient balance)
//   DATA_LOSS                            an answer that is not the documented shape
// Every message starts with the profile name ("lambda: ...").
//
// Thread safety: a CloudProvider may be used from one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/net/http_client.h"
#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::client::cloud {

// What can be rented now: one instance type in one region with capacity.
struct Offer {
  std::string provider;       // the profile's name ("lambda", "fake-lambda")
  std::string instance_type;  // the provider's id: "gpu_8x_h100_sxm5", "NVIDIA H100 80GB HBM3"
  std::string gpu;            // the GPU's model as the provider names it: "H100 SXM5 80GB"
  int gpu_count = 0;
  int gpu_memory_gib = 0;     // per GPU; 0 when the provider does not say
  std::string region;         // "us-east-1"; RunPod: the data center id, or "" (any)
  double price_per_hour = 0;  // US dollars, the whole instance
  int vcpus = 0;
  int memory_gib = 0;
};

enum class InstanceState {
  kStarting,    // accepted, booting: not reachable yet
  kRunning,     // up; SSH may still take a moment
  kStopping,    // terminating or stopping
  kTerminated,  // gone (billing ended)
  kUnhealthy,   // the provider reports it broken
  kOther,       // a status this sftctl does not know (shown as the provider wrote it)
};
const char* InstanceStateName(InstanceState s);

struct Instance {
  std::string id;    // the provider's instance id
  std::string name;  // as launched (sftctl names its instances "sftctl-...")
  InstanceState state = InstanceState::kOther;
  std::string status;  // the provider's own status word ("booting", "RUNNING", ...)
  std::string instance_type;
  std::string region;
  std::string ssh_host;  // the address to reach SSH at; "" until the provider assigns one
  int ssh_port = 22;
  std::string ssh_user;         // the login the image expects ("ubuntu" on Lambda, "root" on RunPod)
  double price_per_hour = 0;    // 0 when the provider does not say
  int64_t created_unix_ms = 0;  // 0 when the provider does not say
};

// Everything needed to reach one provider. Profiles come from client/cloud/provider_config.h.
struct ProviderProfile {
  std::string name;     // "lambda", "runpod", or a name of the user's ("fake-lambda")
  std::string type;     // "lambda" | "runpod": which implementation
  std::string api_url;  // the API root: "https://cloud.lambda.ai/api/v1", "https://api.runpod.io"
  std::string api_key;  // never logged, never written anywhere by sftctl
  // Overrides of what the provider's instances expose (tests and unusual images): the SSH port
  // (Lambda has no port in its API: 22) and login; 0 / "" keep the provider's.
  int ssh_port = 0;
  std::string ssh_user;
  std::string image;  // RunPod: the container image of new pods ("" = runpod's PyTorch image)
};

struct LaunchRequest {
  Offer offer;
  std::string name;            // the instance's name
  std::string ssh_key_name;    // Lambda: the registered key's name (EnsureSshKey)
  std::string ssh_public_key;  // one OpenSSH public key line ("ssh-ed25519 AAAA... comment")
};

class CloudProvider {
 public:
  virtual ~CloudProvider() = default;
  virtual const ProviderProfile& profile() const = 0;

  // Offers with capacity now that have `gpu` (matched case-insensitively as a substring of the GPU
  // model or the instance type: "H100", "a100") and exactly `gpu_count` GPUs (0: any count);
  // unordered. An empty `gpu` matches every offer.
  virtual StatusOr<std::vector<Offer>> ListOffers(const std::string& gpu, int gpu_count) = 0;

  // Makes sure the provider knows `public_key` (Lambda: registered once under a name derived from its
  // fingerprint; RunPod: nothing, the key goes with the pod). Returns the name to launch with.
  virtual StatusOr<std::string> EnsureSshKey(const std::string& public_key) = 0;

  // Rents one instance of the offer. Returns its id at once (the instance is kStarting for a while).
  // RESOURCE_EXHAUSTED when the offer has no capacity after all. Launches are rate-limited by the
  // implementation (Lambda: one per 12 s, as its API reference states).
  virtual StatusOr<std::string> Launch(const LaunchRequest& req) = 0;

  // The instance as the provider sees it now. NOT_FOUND when the provider does not know it (never
  // launched, or terminated long enough ago to be forgotten).
  virtual StatusOr<Instance> GetInstance(const std::string& id) = 0;

  // Every instance the key's account has that is not terminated (the orphan check).
  virtual StatusOr<std::vector<Instance>> ListInstances() = 0;

  // Asks the provider to terminate the instance (billing ends); returns once the request was accepted.
  // An instance already gone is OK.
  virtual Status Terminate(const std::string& id) = 0;
};

}  // namespace sftctl::client::cloud
