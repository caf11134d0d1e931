#include "client/cloud/provider_api.h"

#include <algorithm>
#include <cctype>
#include <utility>
#include <vector>

#include "common/json_parse.h"
#include "common/sha256.h"
#include "common/terminal_text.h"

namespace sftctl::client::cloud {

namespace {

bool RetryableStatus(long status) { return status == 429 || (status >= 500 && status <= 599); }

std::string StripTrailingSlash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

ApiRequest ApiGet(std::string path, std::string what) {
  ApiRequest r;
  r.path = std::move(path);
  r.what = std::move(what);
  return r;
}

ApiRequest ApiPost(std::string path, nlohmann::json body, std::string what) {
  ApiRequest r = ApiGet(std::move(path), std::move(what));
  r.method = "POST";
  r.body = std::move(body);
  return r;
}

std::string RedactSecret(std::string text, const std::string& secret) {
  if (secret.empty()) return text;
  for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at)) {
    text.replace(at, secret.size(), "<redacted>");
    at += 10;
  }
  return text;
}

std::string PublicKeyMaterial(const std::string& line) {
  std::vector<std::string> fields;
  size_t i = 0;
  while (fields.size() < 2) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i >= line.size()) return "";
    const size_t start = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    fields.push_back(line.substr(start, i - start));
  }
  return fields[0] + " " + fields[1];
}

std::string SshKeyName(const std::string& material) { return "sftctl-" + Sha256Hex(material).substr(0, 12); }

bool OfferMatches(const Offer& offer, const std::string& gpu, int gpu_count) {
  if (gpu_count > 0 && offer.gpu_count != gpu_count) return false;
  if (gpu.empty()) return true;
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string want = lower(gpu);
  return lower(offer.gpu).find(want) != std::string::npos ||
         lower(offer.instance_type).find(want) != std::string::npos;
}

std::string ProviderText(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return EscapeForTerminal(text);
  return EscapeForTerminal(text.substr(0, max_bytes)) + "...";
}

std::optional<std::chrono::seconds> ParseRetryAfter(const std::map<std::string, std::string>& headers) {
  auto it = headers.find("retry-after");
  if (it == headers.end()) return std::nullopt;
  std::string v = it->second;
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  size_t i = 0;
  while (i < v.size() && std::isspace(static_cast<unsigned char>(v[i]))) ++i;
  v = v.substr(i);
  if (v.empty() || v.size() > 9 ||
      !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;  // an HTTP date, or nonsense: the caller's own back-off
  return std::chrono::seconds(std::stoll(v));
}

ProviderApi::ProviderApi(ProviderProfile profile, ApiDialect dialect, HttpClient* http, const Clock* clock,
                         RetryPolicy policy)
    : profile_(std::move(profile)), dialect_(dialect), http_(http), clock_(clock), policy_(policy) {
  if (policy_.max_attempts < 1) policy_.max_attempts = 1;
}

std::string ProviderApi::Url(const std::string& path) const {
  return StripTrailingSlash(profile_.api_url) + path;
}

std::optional<std::chrono::seconds> ProviderApi::PauseAfter(const ApiRequest& req,
                                                            const StatusOr<HttpResponse>& r, int attempt,
                                                            std::chrono::seconds paused) const {
  if (attempt >= policy_.max_attempts) return std::nullopt;
  std::optional<std::chrono::seconds> retry_after;
  if (r.ok()) {
    if (!RetryableStatus(r->status)) return std::nullopt;
    if (r->status != 429 && !req.idempotent) return std::nullopt;
    retry_after = ParseRetryAfter(r->headers);
  } else if (r.status().code() != StatusCode::kUnavailable || !req.idempotent) {
    return std::nullopt;
  }
  std::chrono::seconds pause =
      retry_after.value_or(policy_.first_backoff * (1LL << std::min(attempt - 1, 10)));
  pause = std::min(pause, policy_.max_pause);
  if (paused + pause > policy_.max_total_pause) return std::nullopt;
  return pause;
}

StatusOr<ApiResponse> ProviderApi::Send(const ApiRequest& req) const {
  HttpRequest h;
  h.method = req.method;
  h.url = Url(req.path);
  h.stall_timeout = std::chrono::seconds(30);
  h.max_body_bytes = 16ull << 20;
  h.follow_redirects = false;  // an API answer is never a redirect we would follow with the key
  if (!profile_.api_key.empty()) h.headers.emplace_back("Authorization", "Bearer " + profile_.api_key);
  h.headers.emplace_back("Accept", "application/json");
  if (req.body.has_value()) {
    h.headers.emplace_back("Content-Type", "application/json");
    h.body = req.body->dump();
  }
  std::chrono::seconds paused{0};
  for (int attempt = 1;; ++attempt) {
    StatusOr<HttpResponse> r = http_->Send(h);
    const std::optional<std::chrono::seconds> pause = PauseAfter(req, r, attempt, paused);
    if (!pause.has_value()) {
      if (!r.ok()) {
        return Error(r.status().code(), req.what + ": " + r.status().message() + " (" +
                                            std::to_string(attempt) +
                                            (attempt == 1 ? " attempt)" : " attempts)"));
      }
      return ReadAnswer(req, std::move(*r));
    }
    clock_->SleepFor(*pause);
    paused += *pause;
  }
}

StatusOr<nlohmann::json> ProviderApi::Call(const ApiRequest& req) const {
  SFT_ASSIGN_OR_RETURN(ApiResponse r, Send(req));
  if (r.status < 200 || r.status > 299) return dialect_.error_of(*this, req, r);
  return dialect_.payload_of(*this, req, std::move(r));  // (at most 64 deep: Send's bounded parse)
}

StatusOr<ApiResponse> ProviderApi::ReadAnswer(const ApiRequest& req, HttpResponse r) const {
  ApiResponse out;
  out.status = r.status;
  out.headers = std::move(r.headers);
  if (r.body.find_first_not_of(" \t\r\n") == std::string::npos) return out;  // no body: null
  StatusOr<nlohmann::json> body = ParseJson(r.body, "the answer");
  if (body.ok()) {
    out.body = std::move(*body);
  } else if (r.status >= 200 && r.status <= 299) {
    return DataLoss(req, ProviderText(body.status().message()));
  }  // an error status's page that is not JSON (a proxy's HTML): null, HttpError says the status
  return out;
}

Status ProviderApi::Error(StatusCode code, const std::string& message) const {
  return Status(code, RedactSecret(profile_.name + ": " + message, profile_.api_key));
}

Status ProviderApi::DataLoss(const ApiRequest& req, const std::string& detail) const {
  return Error(StatusCode::kDataLoss,
               req.what + ": unexpected answer to " + req.method + " " + req.path + ": " + detail);
}

Status ProviderApi::HttpError(const ApiRequest& req, long http_status,
                              const std::string& provider_message) const {
  const std::string said = provider_message.empty() ? "" : ": " + ProviderText(provider_message);
  const std::string head = req.what + ": HTTP " + std::to_string(http_status);
  if (http_status == 401)
    return Error(StatusCode::kUnauthenticated, head + ": the API key was refused" + said);
  if (http_status == 403) return Error(StatusCode::kPermissionDenied, head + ": not permitted" + said);
  if (http_status == 404) return Error(StatusCode::kNotFound, head + ": not found" + said);
  if (RetryableStatus(http_status)) {
    const bool retried = req.idempotent || http_status == 429;
    return Error(StatusCode::kUnavailable,
                 head + (retried ? " (the retries ran out)" : " (a launch is never retried)") + said);
  }
  if (http_status >= 400 && http_status < 500)
    return Error(StatusCode::kInvalidArgument, head + ": the request was refused" + said);
  return Error(StatusCode::kDataLoss, head + ": an unexpected status" + said);
}

void LaunchSpacer::Wait() {
  if (last_.has_value()) {
    const auto since = clock_->Now() - *last_;
    if (since < interval_) clock_->SleepFor(interval_ - since);
  }
  last_ = clock_->Now();
}

}  // namespace sftctl::client::cloud
