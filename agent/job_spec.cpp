#include "agent/job_spec.h"

#include "common/sha256.h"

namespace sftctl::agent {

StatusOr<nlohmann::json> ValidateSpec(
    const std::string& spec_json, const std::vector<SpecBlobRef>& refs,
    const std::function<StatusOr<std::string>(const std::string&)>& blob_path) {
  nlohmann::json spec;
  try {
    spec = nlohmann::json::parse(spec_json);
  } catch (const nlohmann::json::parse_error& e) {
    return InvalidArgumentError(std::string("spec_json: not valid JSON: ") + e.what());
  }
  if (!spec.is_object()) return InvalidArgumentError("spec_json: not a JSON object");
  if (spec.contains("output_dir") && !spec["output_dir"].is_string()) {
    return InvalidArgumentError("spec_json.output_dir: must be a string");
  }
  for (size_t i = 0; i < refs.size(); ++i) {
    const std::string field = "blobs[" + std::to_string(i) + "]";
    const SpecBlobRef& ref = refs[i];
    if (!IsSha256Hex(ref.sha256))
      return InvalidArgumentError(field + ".sha256: must be 64 lowercase hex digits");
    nlohmann::json::json_pointer ptr;
    try {
      ptr = nlohmann::json::json_pointer(ref.json_pointer);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgumentError(field + ".json_pointer: '" + ref.json_pointer + "' is not a JSON pointer");
    }
    if (ptr.empty())
      return InvalidArgumentError(field + ".json_pointer: must name a field, not the whole spec");
    // The reference names a field of an object ("/model/path") or an existing element of a
    // list ("/data/train/0"); appending to lists is not allowed.
    nlohmann::json::json_pointer parent = ptr.parent_pointer();
    const bool in_object = spec.contains(parent) && spec[parent].is_object();
    const bool in_list = spec.contains(parent) && spec[parent].is_array() && spec.contains(ptr);
    if (!in_object && !in_list) {
      return InvalidArgumentError(
          field + ".json_pointer: '" + ref.json_pointer +
          "' names neither a field of an object nor an existing list element in spec_json");
    }
    if (spec.contains(ptr) && !spec[ptr].is_string() && !spec[ptr].is_null()) {
      return InvalidArgumentError(field + ".json_pointer: spec_json" + ref.json_pointer +
                                  " must be a string (a file reference)");
    }
    SFT_ASSIGN_OR_RETURN(std::string path, blob_path(ref.sha256));
    spec[ptr] = path;
  }
  return spec;
}

void SetOutputDir(nlohmann::json* spec, const std::string& run_dir) { (*spec)["output_dir"] = run_dir; }

}  // namespace sftctl::agent
