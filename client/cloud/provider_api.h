// ProviderApi: the HTTP + JSON layer every CloudProvider speaks through (lambda_cloud.h, runpod.h).
//
// One request: `Authorization: Bearer <key>` (both providers accept it), a JSON body when there is one,
// the answer's status and its body parsed by ParseJson (common/json_parse.h: no exceptions, at most 64
// levels deep, so nothing that copies or walks the answer later can recurse without bound). A 2xx
// answer whose body is not such JSON (nested deeper, not JSON at all) is DATA_LOSS naming the request;
// an empty body, or an error status's body that is not JSON (a proxy's HTML page), is kept as null.
//
// The one retry policy (RetryPolicy): HTTP 429, any 5xx and UNAVAILABLE (the API could not be
// reached) are sent again after a pause on the injected Clock: the answer's `Retry-After` (seconds)
// when it has one, else 1 s, 2 s, 4 s, ...; at most max_attempts sends and max_total_pause of pauses
// for one request. A request that is not idempotent (a launch) is retried only on 429: a 5xx or a
// dropped connection may have launched the instance, and a second launch would rent two (the orphan
// check, ListInstances, finds such a one). When the retries run out, Send returns the last answer
// (a 429 / 5xx, which HttpError makes UNAVAILABLE) or the UNAVAILABLE.
//
// Errors made here start with the profile's name ("lambda: ...") and never hold the API key: every
// message passes through RedactSecret, text from the provider is escaped (EscapeForTerminal) and cut
// to a few hundred bytes.
//
// What differs between providers is how an answer is read (ApiDialect): ProviderApi::Call sends a
// request and reads its answer in the provider's dialect, the one place both do so.
//
// LaunchSpacer: the client side of a provider's launch rate limit (Lambda: one launch per 12 s).
//
// Thread safety: a ProviderApi or LaunchSpacer may be used from one thread at a time.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "client/cloud/provider.h"
#include "common/net/http_client.h"
#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::client::cloud {

struct RetryPolicy {
  int max_attempts = 5;                       // sends of one request, the first included
  std::chrono::seconds first_backoff{1};      // without Retry-After: 1 s, 2 s, 4 s, ...
  std::chrono::seconds max_pause{60};         // a longer Retry-After is waited only this long
  std::chrono::seconds max_total_pause{120};  // every pause of one request together
};

struct ApiRequest {
  // GET | POST. (CurlHttpClient sets a custom method only for POST/PUT: a DELETE would go out as a
  // GET, so providers use their POST forms, e.g. RunPod's /v2/pods/{id}/action.)
  std::string method = "GET";
  std::string path;                    // appended to the profile's api_url: "/instances/abc"
  std::optional<nlohmann::json> body;  // sent as application/json when set
  bool idempotent = true;              // false: only 429 is retried (launches)
  std::string what;                    // for messages: "listing instance types"
};

// A GET of `path`, and a POST of `body` to it.
ApiRequest ApiGet(std::string path, std::string what);
ApiRequest ApiPost(std::string path, nlohmann::json body, std::string what);

struct ApiResponse {
  long status = 0;
  nlohmann::json body;                         // at most 64 deep; null: empty, or an error page
  std::map<std::string, std::string> headers;  // names lower-case
};

class ProviderApi;

// How one provider's API words its answers. Plain functions (no state; any thread may call them):
struct ApiDialect {
  // The Status of `r`, an answer to `req` with an error status: the provider's own error codes and
  // words read from its body, api.HttpError for the rest.
  Status (*error_of)(const ProviderApi& api, const ApiRequest& req, const ApiResponse& r) = nullptr;
  // What `r`, a 2xx answer to `req`, carries (Lambda's {"data": ...}, RunPod's body itself), or
  // api.DataLoss when it is not of the documented shape.
  StatusOr<nlohmann::json> (*payload_of)(const ProviderApi& api, const ApiRequest& req,
                                         ApiResponse r) = nullptr;
};

class ProviderApi {
 public:
  // `http` and `clock` are not owned and must outlive this object; both functions of `dialect` are set.
  ProviderApi(ProviderProfile profile, ApiDialect dialect, HttpClient* http, const Clock* clock,
              RetryPolicy policy = {});

  // Sends `req` (Send) and reads the answer in the provider's dialect: the payload of a 2xx answer,
  // else the Status error_of gives it; Send's errors as they are.
  StatusOr<nlohmann::json> Call(const ApiRequest& req) const;

  // Sends `req` under the retry policy. Returns the final answer whatever its HTTP status (the
  // caller maps an error status with HttpError), UNAVAILABLE / INVALID_ARGUMENT from HttpClient, or
  // DATA_LOSS for a 2xx answer that is not JSON within the depth bound (above).
  StatusOr<ApiResponse> Send(const ApiRequest& req) const;

  // The Status of an answer with an error status: 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 404
  // NOT_FOUND, 429 and 5xx UNAVAILABLE (the retries ran out), other 4xx INVALID_ARGUMENT, anything
  // else (a 1xx/3xx) DATA_LOSS. `provider_message` (the provider's own words, "" if none) is appended.
  Status HttpError(const ApiRequest& req, long http_status, const std::string& provider_message) const;

  // "<profile>: <message>" with the key redacted.
  Status Error(StatusCode code, const std::string& message) const;
  // DATA_LOSS "<profile>: <what>: unexpected answer: <detail>" (an answer not of the documented shape).
  Status DataLoss(const ApiRequest& req, const std::string& detail) const;

  const ProviderProfile& profile() const { return profile_; }
  const Clock* clock() const { return clock_; }

 private:
  std::string Url(const std::string& path) const;
  // The final answer `r` to `req` as an ApiResponse, its body parsed as the header says.
  StatusOr<ApiResponse> ReadAnswer(const ApiRequest& req, HttpResponse r) const;
  // How long to wait before the next send after `r` (the attempt-th), or nullopt to stop retrying.
  std::optional<std::chrono::seconds> PauseAfter(const ApiRequest& req, const StatusOr<HttpResponse>& r,
                                                 int attempt, std::chrono::seconds paused) const;

  ProviderProfile profile_;
  ApiDialect dialect_;
  HttpClient* http_;
  const Clock* clock_;
  RetryPolicy policy_;
};

// `text` with every occurrence of `secret` replaced by "<redacted>" (unchanged when `secret` is empty).
std::string RedactSecret(std::string text, const std::string& secret);

// Provider text fit for a Status message: escaped for the terminal, cut to `max_bytes` ("..." after).
std::string ProviderText(const std::string& text, size_t max_bytes = 300);

// "<type> <base64>" of an OpenSSH public key line, its comment dropped; "" when the line has not both.
std::string PublicKeyMaterial(const std::string& line);
// The name sftctl registers a public key under: "sftctl-" and the first 12 hex digits of the SHA-256
// of its material (PublicKeyMaterial).
std::string SshKeyName(const std::string& material);

// ListOffers' filter: `gpu` a case-insensitive substring of the offer's GPU model or instance type
// ("" matches all), and `gpu_count` GPUs (0: any).
bool OfferMatches(const Offer& offer, const std::string& gpu, int gpu_count);

// Seconds of a Retry-After header ("3"); nullopt when absent or not a plain number of seconds.
std::optional<std::chrono::seconds> ParseRetryAfter(const std::map<std::string, std::string>& headers);

class LaunchSpacer {
 public:
  // `clock` is not owned and must outlive this object.
  LaunchSpacer(const Clock* clock, std::chrono::nanoseconds interval) : clock_(clock), interval_(interval) {}
  // Sleeps on the clock until `interval` has passed since the previous Wait returned (not at all the
  // first time), then records the time: call it right before each launch request.
  void Wait();

 private:
  const Clock* clock_;
  std::chrono::nanoseconds interval_;
  std::optional<Clock::TimePoint> last_;
};

}  // namespace sftctl::client::cloud
