// Lambda Cloud's API root (https://docs.lambda.ai/api/cloud), the one default of both sides that speak
// to it: the client's provider (client/cloud/lambda_cloud.h, the built-in "lambda" profile) and the
// agent's "lambda" stop action (agent/stopping/stop_action.h), which a rented host runs to terminate itself. A
// host rented by `sftctl up` gets its profile's api_url as LAMBDA_API_URL; this is what both use
// without one.
#pragma once

namespace sftctl {

inline constexpr char kLambdaApiUrl[] = "https://cloud.lambda.ai/api/v1";

}  // namespace sftctl
