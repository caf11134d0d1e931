#include "client/cloud/runpod.h"

#include <time.h>

#include <cstdio>
#include <optional>
#include <utility>

#include "common/json_parse.h"

namespace sftctl::client::cloud {

namespace {

using nlohmann::json;

// The offers of one GPU type of the catalog (one per data center with stock).
StatusOr<std::vector<Offer>> ParseGpuType(const std::string& provider, const json& g, int count) {
  const std::string where = "gpus[]";
  Offer o;
  o.provider = provider;
  o.gpu_count = count;
  SFT_ASSIGN_OR_RETURN(o.instance_type, JsonField<std::string>(g, "id", where));
  SFT_ASSIGN_OR_RETURN(o.gpu, JsonFieldOr<std::string>(g, "name", o.instance_type, where));
  SFT_ASSIGN_OR_RETURN(int64_t memory, JsonFieldOr<int64_t>(g, "memory", 0, where));
  o.gpu_memory_gib = static_cast<int>(memory);
  SFT_ASSIGN_OR_RETURN(bool secure, JsonFieldOr<bool>(g, "secure", true, where));
  SFT_ASSIGN_OR_RETURN(json price, JsonField<json>(g, "price", where));
  SFT_ASSIGN_OR_RETURN(double per_gpu, JsonField<double>(price, "secure", where + ".price"));
  o.price_per_hour = per_gpu * count;
  SFT_ASSIGN_OR_RETURN(json max, JsonFieldOr<json>(g, "maxCount", json::object(), where));
  SFT_ASSIGN_OR_RETURN(int64_t max_secure, JsonFieldOr<int64_t>(max, "secure", count, where + ".maxCount"));
  SFT_ASSIGN_OR_RETURN(std::string availability, JsonFieldOr<std::string>(g, "availability", "NONE", where));
  SFT_ASSIGN_OR_RETURN(json centers, JsonFieldOr<json>(g, "dataCenters", json::array(), where));
  if (!centers.is_array()) return InvalidArgumentError(where + ": field 'dataCenters': expected an array");
  std::vector<Offer> out;
  if (!secure || max_secure < count || availability == "NONE") return out;
  for (const json& dc : centers) {
    SFT_ASSIGN_OR_RETURN(std::string id, JsonField<std::string>(dc, "id", where + ".dataCenters[]"));
    SFT_ASSIGN_OR_RETURN(std::string level,
                         JsonField<std::string>(dc, "availability", where + ".dataCenters[]"));
    if (level == "NONE") continue;
    Offer one = o;
    one.region = id;
    out.push_back(std::move(one));
  }
  if (centers.empty()) out.push_back(o);  // in stock somewhere: the scheduler picks the data center
  return out;
}

// Where the pod's sshd is reachable: ssh.direct, else the runtime port mapped to 22/tcp.
Status ReadSshEndpoint(const json& pod, Instance* in) {
  SFT_ASSIGN_OR_RETURN(json ssh, JsonFieldOr<json>(pod, "ssh", json::object(), "pod"));
  SFT_ASSIGN_OR_RETURN(json direct, JsonFieldOr<json>(ssh, "direct", json(), "pod.ssh"));
  if (direct.is_object()) {
    SFT_ASSIGN_OR_RETURN(in->ssh_host, JsonField<std::string>(direct, "host", "pod.ssh.direct"));
    SFT_ASSIGN_OR_RETURN(int64_t port, JsonField<int64_t>(direct, "port", "pod.ssh.direct"));
    in->ssh_port = static_cast<int>(port);
    return OkStatus();
  }
  SFT_ASSIGN_OR_RETURN(json runtime, JsonFieldOr<json>(pod, "runtime", json::object(), "pod"));
  SFT_ASSIGN_OR_RETURN(json ports, JsonFieldOr<json>(runtime, "ports", json::array(), "pod.runtime"));
  if (!ports.is_array()) return InvalidArgumentError("pod.runtime: field 'ports': expected an array");
  for (const json& p : ports) {
    SFT_ASSIGN_OR_RETURN(int64_t priv, JsonFieldOr<int64_t>(p, "private", 0, "pod.runtime.ports[]"));
    SFT_ASSIGN_OR_RETURN(std::string type, JsonFieldOr<std::string>(p, "type", "tcp", "pod.runtime.ports[]"));
    SFT_ASSIGN_OR_RETURN(int64_t pub, JsonFieldOr<int64_t>(p, "public", 0, "pod.runtime.ports[]"));
    SFT_ASSIGN_OR_RETURN(std::string ip, JsonFieldOr<std::string>(p, "ip", "", "pod.runtime.ports[]"));
    if (priv != 22 || type != "tcp" || pub <= 0 || ip.empty()) continue;
    in->ssh_host = ip;
    in->ssh_port = static_cast<int>(pub);
    return OkStatus();
  }
  in->ssh_host.clear();
  return OkStatus();
}

// RunPod's problem+json {"title", "status", "detail", "errors"?}; a launch's 400 and 402 are its own.
Status RunPodErrorOf(const ProviderApi& api, const ApiRequest& req, const ApiResponse& r) {
  std::string detail;
  if (r.body.is_object()) {
    if (r.body.contains("detail") && r.body["detail"].is_string())
      detail = r.body["detail"].get<std::string>();
    if (r.body.contains("errors") && r.body["errors"].is_array())
      for (const json& e : r.body["errors"])
        if (e.is_string()) detail += (detail.empty() ? "" : "; ") + e.get<std::string>();
  }
  const std::string said = detail.empty() ? "" : ": " + ProviderText(detail);
  if (req.method == "POST" && req.path == "/v2/pods") {
    if (r.status == 400)
      return api.Error(StatusCode::kResourceExhausted, req.what + ": HTTP 400: not placed" + said);
    if (r.status == 402)
      return api.Error(StatusCode::kFailedPrecondition, req.what + ": HTTP 402: insufficient balance" + said);
  }
  return api.HttpError(req, r.status, detail);
}

// A 2xx answer of RunPod's is the object itself (null for a 204).
StatusOr<json> RunPodBodyOf(const ProviderApi& api, const ApiRequest& req, ApiResponse r) {
  if (r.status != 204 && !r.body.is_object()) return api.DataLoss(req, "the body is not a JSON object");
  return std::move(r.body);
}

}  // namespace

InstanceState RunPodState(const std::string& status) {
  if (status == "PROVISIONING" || status == "STARTING") return InstanceState::kStarting;
  if (status == "RUNNING") return InstanceState::kRunning;
  if (status == "EXITED") return InstanceState::kStopping;
  if (status == "ERROR") return InstanceState::kUnhealthy;
  if (status == "TERMINATED") return InstanceState::kTerminated;
  return InstanceState::kOther;
}

int64_t ParseRfc3339Millis(const std::string& text) {
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0, used = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &s, &used) != 6) return 0;
  size_t i = static_cast<size_t>(used);
  int64_t ms = 0;
  if (i < text.size() && text[i] == '.') {
    int digits = 0;
    for (++i; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i, ++digits)
      if (digits < 3) ms = ms * 10 + (text[i] - '0');
    for (; digits < 3; ++digits) ms *= 10;
  }
  const std::string zone = text.substr(i);
  if (zone != "Z" && zone != "z" && zone != "+00:00") return 0;
  struct tm t = {};
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = s;
  return static_cast<int64_t>(timegm(&t)) * 1000 + ms;
}

RunPod::RunPod(ProviderProfile profile, HttpClient* http, const Clock* clock)
    : api_(std::move(profile), ApiDialect{RunPodErrorOf, RunPodBodyOf}, http, clock) {}

StatusOr<std::vector<Offer>> RunPod::ListOffers(const std::string& gpu, int gpu_count) {
  const int count = gpu_count > 0 ? gpu_count : 1;
  const ApiRequest req =
      ApiGet("/v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=SECURE&count=" + std::to_string(count),
             "listing GPU types");
  SFT_ASSIGN_OR_RETURN(json body, api_.Call(req));
  StatusOr<json> gpus = JsonField<json>(body, "gpus", "answer");
  if (!gpus.ok()) return api_.DataLoss(req, gpus.status().message());
  if (!gpus->is_array()) return api_.DataLoss(req, "'gpus' is not an array");
  std::vector<Offer> offers;
  for (const json& g : *gpus) {
    StatusOr<std::vector<Offer>> type = ParseGpuType(profile().name, g, count);
    if (!type.ok()) return api_.DataLoss(req, type.status().message());
    for (Offer& o : *type)
      if (OfferMatches(o, gpu, gpu_count)) offers.push_back(std::move(o));
  }
  return offers;
}

StatusOr<std::string> RunPod::EnsureSshKey(const std::string& public_key) {
  const std::string material = PublicKeyMaterial(public_key);
  if (material.empty())
    return api_.Error(StatusCode::kInvalidArgument, "not an OpenSSH public key line (\"<type> <base64>\")");
  return SshKeyName(material);
}

StatusOr<std::string> RunPod::Launch(const LaunchRequest& req) {
  if (PublicKeyMaterial(req.ssh_public_key).empty())
    return api_.Error(StatusCode::kInvalidArgument, "launching " + req.name + ": no SSH public key");
  const int count = req.offer.gpu_count > 0 ? req.offer.gpu_count : 1;
  json body = {{"name", req.name},
               {"image", profile().image.empty() ? kDefaultImage : profile().image},
               {"gpu", {{"id", req.offer.instance_type}, {"count", count}}},
               {"cloud", "SECURE"},
               {"ports", json::array({"22/tcp"})},
               {"disk", kDiskGb},
               {"env", {{"PUBLIC_KEY", req.ssh_public_key}}}};
  if (!req.offer.region.empty()) body["dataCenterIds"] = json::array({req.offer.region});
  ApiRequest call =
      ApiPost("/v2/pods", std::move(body),
              "launching " + std::to_string(count) + " x " + ProviderText(req.offer.instance_type, 80) +
                  (req.offer.region.empty() ? "" : " in " + ProviderText(req.offer.region, 80)));
  call.idempotent = false;
  SFT_ASSIGN_OR_RETURN(json pod, api_.Call(call));
  StatusOr<std::string> id = JsonField<std::string>(pod, "id", "pod");
  if (!id.ok()) return api_.DataLoss(call, id.status().message());
  if (id->empty()) return api_.DataLoss(call, "the pod has an empty id");
  return *id;
}

StatusOr<Instance> RunPod::ParsePod(const ApiRequest& req, const json& j) const {
  auto parse = [&]() -> StatusOr<Instance> {
    Instance in;
    SFT_ASSIGN_OR_RETURN(in.id, JsonField<std::string>(j, "id", "pod"));
    SFT_ASSIGN_OR_RETURN(in.name, JsonFieldOr<std::string>(j, "name", "", "pod"));
    SFT_ASSIGN_OR_RETURN(in.status, JsonField<std::string>(j, "status", "pod"));
    SFT_ASSIGN_OR_RETURN(json gpu, JsonFieldOr<json>(j, "gpu", json::object(), "pod"));
    SFT_ASSIGN_OR_RETURN(in.instance_type, JsonFieldOr<std::string>(gpu, "id", "", "pod.gpu"));
    SFT_ASSIGN_OR_RETURN(in.region, JsonFieldOr<std::string>(j, "dataCenterId", "", "pod"));
    SFT_ASSIGN_OR_RETURN(in.price_per_hour, JsonFieldOr<double>(j, "cost", 0.0, "pod"));
    SFT_ASSIGN_OR_RETURN(std::string created, JsonFieldOr<std::string>(j, "createdAt", "", "pod"));
    in.created_unix_ms = ParseRfc3339Millis(created);
    in.state = RunPodState(in.status);
    SFT_RETURN_IF_ERROR(ReadSshEndpoint(j, &in));
    if (profile().ssh_port > 0) in.ssh_port = profile().ssh_port;
    in.ssh_user = profile().ssh_user.empty() ? "root" : profile().ssh_user;
    return in;
  };
  StatusOr<Instance> in = parse();
  if (!in.ok()) return api_.DataLoss(req, in.status().message());
  return in;
}

StatusOr<Instance> RunPod::GetInstance(const std::string& id) {
  const ApiRequest req = ApiGet("/v2/pods/" + UrlEncode(id, false), "getting pod " + ProviderText(id, 80));
  SFT_ASSIGN_OR_RETURN(json pod, api_.Call(req));
  return ParsePod(req, pod);
}

StatusOr<std::vector<Instance>> RunPod::ListInstances() {
  const ApiRequest req = ApiGet("/v2/pods", "listing pods");
  SFT_ASSIGN_OR_RETURN(json body, api_.Call(req));
  StatusOr<json> pods = JsonField<json>(body, "pods", "answer");
  if (!pods.ok()) return api_.DataLoss(req, pods.status().message());
  if (!pods->is_array()) return api_.DataLoss(req, "'pods' is not an array");
  std::vector<Instance> out;
  for (const json& j : *pods) {
    SFT_ASSIGN_OR_RETURN(Instance in, ParsePod(req, j));
    if (in.state != InstanceState::kTerminated) out.push_back(std::move(in));
  }
  return out;
}

Status RunPod::Terminate(const std::string& id) {
  const ApiRequest req = ApiPost("/v2/pods/" + UrlEncode(id, false) + "/action", {{"action", "terminate"}},
                                 "terminating pod " + ProviderText(id, 80));
  StatusOr<json> r = api_.Call(req);
  if (!r.ok() && r.status().code() == StatusCode::kNotFound) return OkStatus();  // already gone
  return r.status();
}

}  // namespace sftctl::client::cloud
