#include "agent/stopping/stop_action.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "common/lambda_api.h"
#include "common/terminal_text.h"

namespace sftctl::agent {
namespace {

constexpr std::chrono::seconds kLambdaStall{60};  // as long as the API may stay silent

// The API's words for a failed request: "global/invalid-api-key: ..." from Lambda's error shape
// {"error": {"code", "message"}}, else "" (the body is shown as the output anyway). The answer is from
// outside: read through common/json_parse.h, never thrown on.
std::string LambdaError(const std::string& body) {
  const std::string where = "Lambda's answer";
  StatusOr<nlohmann::json> j = ParseJson(body, where);
  if (!j.ok()) return "";
  StatusOr<std::optional<nlohmann::json>> e = OptionalJsonField<nlohmann::json>(*j, "error", where);
  if (!e.ok() || !e->has_value()) return "";
  auto field = [&](const char* key) {
    StatusOr<std::string> v = JsonFieldOr<std::string>(**e, key, "", where);
    return v.ok() ? *v : std::string();
  };
  const std::string code = field("code"), message = field("message");
  return EscapeForTerminal(code + (code.empty() || message.empty() ? "" : ": ") + message);
}

// The request, sent within `timeout` in all (a server that trickles its answer is cut off).
StatusOr<StopActionOutcome> TerminateLambdaInstance(const LambdaApi& api, HttpClient* http,
                                                    std::chrono::seconds timeout) {
  SFT_ASSIGN_OR_RETURN(const HttpRequest req, LambdaTerminateRequest(api, timeout));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string body;
  auto sink = [&](std::string_view data) {
    if (body.size() < kMaxCommandOutput)
      body.append(data.substr(0, std::min(data.size(), kMaxCommandOutput - body.size())));
    return std::chrono::steady_clock::now() < deadline;
  };
  StatusOr<HttpResponse> resp = http->Send(req, sink);
  if (!resp.ok()) {
    if (resp.status().code() == StatusCode::kCancelled)
      return StopActionOutcome{false, "timed out after " + std::to_string(timeout.count()) + " s",
                               EscapeForTerminal(body)};
    return resp.status().WithContext("the lambda stop action");
  }
  StopActionOutcome out;
  out.ok = resp->status >= 200 && resp->status < 300;
  out.result = "HTTP " + std::to_string(resp->status);
  if (const std::string why = out.ok ? "" : LambdaError(body); !why.empty()) out.result += " " + why;
  out.output = EscapeForTerminal(body);
  return out;
}

}  // namespace

StatusOr<HttpRequest> LambdaTerminateRequest(const LambdaApi& api, std::chrono::seconds timeout) {
  if (api.api_key.empty() || api.instance_id.empty()) {
    return FailedPreconditionError(
        "the lambda stop action needs LAMBDA_API_KEY and LAMBDA_INSTANCE_ID in the agent's environment "
        "(~/.config/sftd/env; `sftctl up --terminate-from-host` writes them)");
  }
  std::string root = api.api_url.empty() ? kLambdaApiUrl : api.api_url;
  if (!IsHttpUrl(root))
    return FailedPreconditionError("LAMBDA_API_URL: '" + EscapeForTerminal(root) + "' is not an http(s) URL");
  while (!root.empty() && root.back() == '/') root.pop_back();
  HttpRequest req;
  req.method = "POST";
  req.url = root + "/instance-operations/terminate";
  req.body = nlohmann::json{{"instance_ids", {api.instance_id}}}.dump();
  req.headers = {{"Authorization", "Bearer " + api.api_key}, {"Content-Type", "application/json"}};
  req.follow_redirects = false;  // the key goes to the API's origin only
  req.stall_timeout = std::min(timeout, kLambdaStall);
  req.max_body_bytes = 1 << 20;
  return req;
}

StatusOr<StopActionOutcome> RunStopAction(const std::string& action, const StopPolicy& policy,
                                          const StopEnv& env, CommandRunner* runner, HttpClient* http,
                                          std::chrono::seconds timeout) {
  if (action == "lambda") return TerminateLambdaInstance(env.lambda_api, http, timeout);
  SFT_ASSIGN_OR_RETURN(const std::string command, ActionCommand(action, policy));
  SFT_ASSIGN_OR_RETURN(const CommandOutcome out, runner->Run(command, timeout));
  return StopActionOutcome{out.ok(), out.Describe(), out.output};
}

}  // namespace sftctl::agent
