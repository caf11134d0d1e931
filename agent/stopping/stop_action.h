// The stop action carried out (agent/stopping/auto_stop.h runs it once DecideStop says so): every secret
// stays off every command line. "runpod", "runpod-terminate", "shutdown" and "command" are shell commands
// (ActionCommand, agent/stopping/stop_policy.h) run through the CommandRunner seam, with the cloud variables
// in their environment only. "lambda" is no command at all: its one HTTPS request, POST
// <LAMBDA_API_URL>/instance-operations/terminate with "Authorization: Bearer $LAMBDA_API_KEY", is made
// in this process through the HttpClient seam (common/net/http_client.h), so the account-wide key is in
// no process's argv (/proc/<pid>/cmdline, which every user of the host can read), no log line and no
// outcome.
//
// Thread safety: pure functions, and RunStopAction blocks (never call it on the supervisor's event
// thread or in a gRPC reaction).
#pragma once

#include <chrono>
#include <string>

#include "agent/process/command_runner.h"
#include "agent/stopping/stop_policy.h"
#include "common/net/http_client.h"
#include "common/status.h"

namespace sftctl::agent {

struct StopActionOutcome {
  bool ok = false;
  // "exit code 0", "killed by signal 9 (SIGKILL)", "timed out after 120 s" (a command); "HTTP 200",
  // "HTTP 401 global/invalid-api-key: ..." (lambda; the API's words escaped for a terminal).
  std::string result;
  std::string output;  // the command's output, or the API's answer (escaped); at most kMaxCommandOutput
};

// The "lambda" action's request: POST <api_url>/instance-operations/terminate with the body
// {"instance_ids": ["<instance_id>"]}, the key in the Authorization header, no redirect followed (the
// key goes to api_url's origin only), `timeout` as its stall timeout. api_url "" means kLambdaApiUrl
// (common/lambda_api.h). FAILED_PRECONDITION naming the variable: no LAMBDA_API_KEY or
// LAMBDA_INSTANCE_ID, or a LAMBDA_API_URL that is not http(s).
StatusOr<HttpRequest> LambdaTerminateRequest(const LambdaApi& api, std::chrono::seconds timeout);

// Runs `action` (ResolveAction's) of `policy`: "lambda" through `http` with env.lambda_api, any other
// through `runner`, each within `timeout`. Errors: ActionCommand's (no action), the command could not
// be started, LambdaTerminateRequest's, the request could not be sent (the HttpClient's, naming the URL);
// a command that failed or an HTTP error status is an outcome that is not ok.
StatusOr<StopActionOutcome> RunStopAction(const std::string& action, const StopPolicy& policy,
                                          const StopEnv& env, CommandRunner* runner, HttpClient* http,
                                          std::chrono::seconds timeout);

}  // namespace sftctl::agent
