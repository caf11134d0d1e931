#include "client/cloud/lambda_cloud.h"

#include <cstdlib>
#include <optional>
#include <utility>

#include "common/json_parse.h"

namespace sftctl::client::cloud {

namespace {

using nlohmann::json;

constexpr const char* kCapacityCode = "instance-operations/launch/insufficient-capacity";

// The GPU memory in "H100 (80 GB SXM5)": 80; 0 when the description names none.
int GpuMemoryGib(const std::string& description) {
  const size_t gb = description.find(" GB");
  if (gb == std::string::npos) return 0;
  size_t start = gb;
  while (start > 0 && description[start - 1] >= '0' && description[start - 1] <= '9') --start;
  if (start == gb) return 0;
  return std::atoi(description.substr(start, gb - start).c_str());
}

// The offers of one entry of GET /instance-types' data (one per region with capacity).
StatusOr<std::vector<Offer>> ParseInstanceType(const std::string& provider, const std::string& key,
                                               const json& entry) {
  const std::string where = "data." + key;
  SFT_ASSIGN_OR_RETURN(json type, JsonField<json>(entry, "instance_type", where));
  const std::string tw = where + ".instance_type";
  Offer o;
  o.provider = provider;
  SFT_ASSIGN_OR_RETURN(o.instance_type, JsonField<std::string>(type, "name", tw));
  SFT_ASSIGN_OR_RETURN(o.gpu, JsonFieldOr<std::string>(type, "gpu_description", "", tw));
  if (o.gpu.empty()) {
    SFT_ASSIGN_OR_RETURN(o.gpu, JsonFieldOr<std::string>(type, "description", "", tw));
  }
  SFT_ASSIGN_OR_RETURN(double cents, JsonField<double>(type, "price_cents_per_hour", tw));
  o.price_per_hour = cents / 100.0;
  o.gpu_memory_gib = GpuMemoryGib(o.gpu);
  SFT_ASSIGN_OR_RETURN(json specs, JsonField<json>(type, "specs", tw));
  SFT_RETURN_IF_ERROR(CheckJsonObject(specs, tw + ".specs"));
  SFT_ASSIGN_OR_RETURN(int64_t gpus, JsonFieldOr<int64_t>(specs, "gpus", 0, tw + ".specs"));
  SFT_ASSIGN_OR_RETURN(int64_t vcpus, JsonFieldOr<int64_t>(specs, "vcpus", 0, tw + ".specs"));
  SFT_ASSIGN_OR_RETURN(int64_t mem, JsonFieldOr<int64_t>(specs, "memory_gib", 0, tw + ".specs"));
  o.gpu_count = static_cast<int>(gpus);
  o.vcpus = static_cast<int>(vcpus);
  o.memory_gib = static_cast<int>(mem);
  SFT_ASSIGN_OR_RETURN(json regions,
                       JsonFieldOr<json>(entry, "regions_with_capacity_available", json::array(), where));
  if (!regions.is_array())
    return InvalidArgumentError(where + ": field 'regions_with_capacity_available': expected an array");
  std::vector<Offer> out;
  for (const json& r : regions) {
    Offer one = o;
    SFT_ASSIGN_OR_RETURN(one.region,
                         JsonField<std::string>(r, "name", where + ".regions_with_capacity_available"));
    out.push_back(std::move(one));
  }
  return out;
}

// Lambda's error answer {"error": {"code", "message", "suggestion"?}}, read by its code.
Status LambdaErrorOf(const ProviderApi& api, const ApiRequest& req, const ApiResponse& r) {
  std::string code, message;
  const json* err = r.body.is_object() && r.body.contains("error") ? &r.body["error"] : nullptr;
  if (err != nullptr && err->is_object()) {
    if (err->contains("code") && (*err)["code"].is_string()) code = (*err)["code"].get<std::string>();
    if (err->contains("message") && (*err)["message"].is_string())
      message = (*err)["message"].get<std::string>();
    if (err->contains("suggestion") && (*err)["suggestion"].is_string())
      message += (message.empty() ? "" : " ") + (*err)["suggestion"].get<std::string>();
  }
  const std::string said = message.empty() ? "" : ": " + ProviderText(message);
  const std::string tag = code.empty() ? "" : " [" + ProviderText(code, 80) + "]";
  if (code == kCapacityCode || code == "global/quota-exceeded")
    return api.Error(StatusCode::kResourceExhausted, req.what + ": no capacity now" + tag + said);
  if (code == "global/object-does-not-exist" || code == "global/not-found")
    return api.Error(StatusCode::kNotFound, req.what + ": not found" + tag + said);
  return api.HttpError(req, r.status, message.empty() ? code : message + tag);
}

// Every 2xx answer of Lambda's is {"data": ...}.
StatusOr<json> LambdaDataOf(const ProviderApi& api, const ApiRequest& req, ApiResponse r) {
  if (!r.body.is_object() || !r.body.contains("data")) return api.DataLoss(req, "no 'data' object");
  return std::move(r.body["data"]);
}

}  // namespace

InstanceState LambdaState(const std::string& status) {
  if (status == "booting") return InstanceState::kStarting;
  if (status == "active") return InstanceState::kRunning;
  if (status == "unhealthy") return InstanceState::kUnhealthy;
  if (status == "terminating") return InstanceState::kStopping;
  if (status == "terminated" || status == "preempted") return InstanceState::kTerminated;
  return InstanceState::kOther;
}

LambdaCloud::LambdaCloud(ProviderProfile profile, HttpClient* http, const Clock* clock)
    : api_(std::move(profile), ApiDialect{LambdaErrorOf, LambdaDataOf}, http, clock),
      spacer_(clock, kLaunchInterval) {}

StatusOr<std::vector<Offer>> LambdaCloud::ListOffers(const std::string& gpu, int gpu_count) {
  const ApiRequest req = ApiGet("/instance-types", "listing instance types");
  SFT_ASSIGN_OR_RETURN(json data, api_.Call(req));
  if (!data.is_object()) return api_.DataLoss(req, "'data' is not an object of instance types");
  std::vector<Offer> offers;
  for (auto it = data.begin(); it != data.end(); ++it) {
    StatusOr<std::vector<Offer>> type = ParseInstanceType(profile().name, it.key(), it.value());
    if (!type.ok()) return api_.DataLoss(req, type.status().message());
    for (Offer& o : *type)
      if (OfferMatches(o, gpu, gpu_count)) offers.push_back(std::move(o));
  }
  return offers;
}

StatusOr<std::string> LambdaCloud::EnsureSshKey(const std::string& public_key) {
  const std::string material = PublicKeyMaterial(public_key);
  if (material.empty())
    return api_.Error(StatusCode::kInvalidArgument, "not an OpenSSH public key line (\"<type> <base64>\")");
  const ApiRequest list = ApiGet("/ssh-keys", "listing SSH keys");
  SFT_ASSIGN_OR_RETURN(json keys, api_.Call(list));
  if (!keys.is_array()) return api_.DataLoss(list, "'data' is not an array of keys");
  for (const json& k : keys) {
    StatusOr<std::string> name = JsonField<std::string>(k, "name", "data[]");
    StatusOr<std::string> key = JsonField<std::string>(k, "public_key", "data[]");
    if (!name.ok()) return api_.DataLoss(list, name.status().message());
    if (key.ok() && PublicKeyMaterial(*key) == material) return *name;
  }
  const std::string name = SshKeyName(material);
  const ApiRequest add =
      ApiPost("/ssh-keys", {{"name", name}, {"public_key", public_key}}, "adding SSH key " + name);
  SFT_ASSIGN_OR_RETURN(json added, api_.Call(add));
  StatusOr<std::string> got = JsonField<std::string>(added, "name", "data");
  if (!got.ok()) return api_.DataLoss(add, got.status().message());
  return *got;
}

StatusOr<std::string> LambdaCloud::Launch(const LaunchRequest& req) {
  std::string key_name = req.ssh_key_name;
  if (key_name.empty()) {
    SFT_ASSIGN_OR_RETURN(key_name, EnsureSshKey(req.ssh_public_key));
  }
  json body = {{"region_name", req.offer.region},
               {"instance_type_name", req.offer.instance_type},
               {"ssh_key_names", json::array({key_name})},
               {"name", req.name}};
  ApiRequest call = ApiPost(
      "/instance-operations/launch", std::move(body),
      "launching " + ProviderText(req.offer.instance_type, 80) + " in " + ProviderText(req.offer.region, 80));
  call.idempotent = false;
  spacer_.Wait();
  SFT_ASSIGN_OR_RETURN(json data, api_.Call(call));
  StatusOr<json> ids = JsonField<json>(data, "instance_ids", "data");
  if (!ids.ok()) return api_.DataLoss(call, ids.status().message());
  if (!ids->is_array() || ids->empty() || !(*ids)[0].is_string() || (*ids)[0].get<std::string>().empty())
    return api_.DataLoss(call, "data.instance_ids holds no instance id");
  return (*ids)[0].get<std::string>();
}

StatusOr<Instance> LambdaCloud::ParseInstance(const ApiRequest& req, const json& j) const {
  auto parse = [&]() -> StatusOr<Instance> {
    Instance in;
    SFT_ASSIGN_OR_RETURN(in.id, JsonField<std::string>(j, "id", "instance"));
    SFT_ASSIGN_OR_RETURN(in.name, JsonFieldOr<std::string>(j, "name", "", "instance"));
    SFT_ASSIGN_OR_RETURN(in.status, JsonField<std::string>(j, "status", "instance"));
    SFT_ASSIGN_OR_RETURN(in.ssh_host, JsonFieldOr<std::string>(j, "ip", "", "instance"));
    SFT_ASSIGN_OR_RETURN(json region, JsonFieldOr<json>(j, "region", json::object(), "instance"));
    SFT_ASSIGN_OR_RETURN(in.region, JsonFieldOr<std::string>(region, "name", "", "instance.region"));
    SFT_ASSIGN_OR_RETURN(json type, JsonFieldOr<json>(j, "instance_type", json::object(), "instance"));
    SFT_ASSIGN_OR_RETURN(in.instance_type,
                         JsonFieldOr<std::string>(type, "name", "", "instance.instance_type"));
    SFT_ASSIGN_OR_RETURN(double cents,
                         JsonFieldOr<double>(type, "price_cents_per_hour", 0, "instance.instance_type"));
    in.price_per_hour = cents / 100.0;
    in.state = LambdaState(in.status);
    in.ssh_port = profile().ssh_port > 0 ? profile().ssh_port : 22;
    in.ssh_user = profile().ssh_user.empty() ? "ubuntu" : profile().ssh_user;
    return in;
  };
  StatusOr<Instance> in = parse();
  if (!in.ok()) return api_.DataLoss(req, in.status().message());
  return in;
}

StatusOr<Instance> LambdaCloud::GetInstance(const std::string& id) {
  const ApiRequest req =
      ApiGet("/instances/" + UrlEncode(id, false), "getting instance " + ProviderText(id, 80));
  SFT_ASSIGN_OR_RETURN(json data, api_.Call(req));
  return ParseInstance(req, data);
}

StatusOr<std::vector<Instance>> LambdaCloud::ListInstances() {
  const ApiRequest req = ApiGet("/instances", "listing instances");
  SFT_ASSIGN_OR_RETURN(json data, api_.Call(req));
  if (!data.is_array()) return api_.DataLoss(req, "'data' is not an array of instances");
  std::vector<Instance> out;
  for (const json& j : data) {
    SFT_ASSIGN_OR_RETURN(Instance in, ParseInstance(req, j));
    if (in.state != InstanceState::kTerminated) out.push_back(std::move(in));
  }
  return out;
}

Status LambdaCloud::Terminate(const std::string& id) {
  const ApiRequest req = ApiPost("/instance-operations/terminate", {{"instance_ids", json::array({id})}},
                                 "terminating instance " + ProviderText(id, 80));
  StatusOr<json> data = api_.Call(req);
  if (!data.ok() && data.status().code() == StatusCode::kNotFound) return OkStatus();  // already gone
  return data.status();
}

}  // namespace sftctl::client::cloud
