#include "common/spec_yaml.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/spec_fields.h"
#include "common/tokenizer/unicode_normalize.h"

namespace sftctl {
namespace {

using nlohmann::json;

json ScalarToJson(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (node.Tag() == "!") return s;  // quoted: always a string
  static const std::regex kInt(R"([-+]?[0-9]+)");
  static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (std::regex_match(s, kInt)) {
    try {
      return std::stoll(s);
    } catch (const std::out_of_range&) {
      return s;
    }
  }
  // strtod, not stod: a float out of double's range ("1e999", "1e-400") is +-inf or 0, not an exception.
  if (std::regex_match(s, kFloat)) return std::strtod(s.c_str(), nullptr);
  if (s == ".inf" || s == "+.inf") return std::numeric_limits<double>::infinity();
  if (s == "-.inf") return -std::numeric_limits<double>::infinity();
  if (s == ".nan") return std::numeric_limits<double>::quiet_NaN();
  return s;
}

Status Convert(const YAML::Node& node, const std::string& path, const std::string& file, YamlDocument* doc,
               json* out) {
  doc->lines[path] = node.Mark().line + 1;
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      *out = nullptr;
      return OkStatus();
    case YAML::NodeType::Scalar:
      // JSON (spec.json, spec_json) holds UTF-8 only: dump() would throw on other bytes.
      if (!IsValidUtf8(node.Scalar())) {
        return InvalidArgumentError(file + ":" + std::to_string(node.Mark().line + 1) + ": not valid UTF-8");
      }
      *out = ScalarToJson(node);
      return OkStatus();
    case YAML::NodeType::Sequence: {
      *out = json::array();
      size_t i = 0;
      for (const auto& item : node) {
        json v;
        SFT_RETURN_IF_ERROR(Convert(item, path + "[" + std::to_string(i++) + "]", file, doc, &v));
        out->push_back(std::move(v));
      }
      return OkStatus();
    }
    case YAML::NodeType::Map: {
      *out = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return InvalidArgumentError(file + ":" + std::to_string(kv.first.Mark().line + 1) +
                                      ": keys must be plain names");
        }
        std::string key = kv.first.Scalar();
        if (!IsValidUtf8(key)) {
          return InvalidArgumentError(file + ":" + std::to_string(kv.first.Mark().line + 1) +
                                      ": not valid UTF-8");
        }
        std::string child = path.empty() ? key : path + "." + key;
        if (out->contains(key)) {
          return InvalidArgumentError(file + ":" + std::to_string(kv.first.Mark().line + 1) + ": field '" +
                                      child + "' is given twice");
        }
        json v;
        SFT_RETURN_IF_ERROR(Convert(kv.second, child, file, doc, &v));
        doc->lines[child] = kv.first.Mark().line + 1;
        (*out)[key] = std::move(v);
      }
      return OkStatus();
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<YamlDocument> YamlToJson(const std::string& text, const std::string& file_name) {
  YamlDocument doc;
  try {
    YAML::Node root = YAML::Load(text);
    SFT_RETURN_IF_ERROR(Convert(root, "", file_name, &doc, &doc.value));
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(file_name + ":" + std::to_string(e.mark.line + 1) +
                                ": invalid YAML: " + e.msg);
  }
  return doc;
}

StatusOr<JobSpec> LoadSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read spec file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  SFT_ASSIGN_OR_RETURN(YamlDocument doc, YamlToJson(ss.str(), path));
  if (doc.value.is_null()) return InvalidArgumentError(path + ": the spec file is empty");
  const auto& lines = doc.lines;
  FieldLocator locate = [&lines, &path](const std::string& field) {
    // The field itself, or its nearest enclosing field that exists.
    std::string f = field;
    for (;;) {
      auto it = lines.find(f);
      if (it != lines.end() && !f.empty()) return path + ":" + std::to_string(it->second);
      size_t dot = f.rfind('.');
      if (dot == std::string::npos) return path;
      f.resize(dot);
    }
  };
  std::filesystem::path p(path);
  std::string base = p.has_parent_path() ? p.parent_path().string() : ".";
  if (!doc.value.contains("name") && doc.value.is_object()) doc.value["name"] = p.stem().string();
  SFT_ASSIGN_OR_RETURN(JobSpec spec, ParseSpec(doc.value, std::filesystem::absolute(base).string(), locate));
  return spec;
}

Status ApplySetOverrides(const std::vector<std::string>& sets, nlohmann::json* j) {
  for (const auto& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgumentError("--set '" + s + "': expected FIELD=VALUE, e.g. --set train.lr=1e-4");
    }
    const std::string path = s.substr(0, eq);
    const std::string text = s.substr(eq + 1);
    auto value = YamlToJson(text, "--set " + path);
    if (!value.ok()) return value.status();
    // A field of the spec may be absent from the JSON (ToJson leaves out knobs at their default,
    // and an absent lora or slurm section is null): its path is created. Other paths (inside
    // model.config) must exist.
    const SpecField* field = FindSpecField(path);
    nlohmann::json* node = j;
    size_t start = 0;
    for (;;) {
      const size_t dot = path.find('.', start);
      const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      if (field != nullptr && node->is_null()) *node = nlohmann::json::object();
      if (!node->is_object() || (!node->contains(key) && field == nullptr)) {
        return InvalidArgumentError("--set: unknown field '" + path + "' (see docs/spec.md)");
      }
      node = &(*node)[key];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    // A string field takes a plain scalar as written: --set checkpoint.region=1 or name=1e3.
    const bool scalar = value->value.is_number() || value->value.is_boolean();
    *node =
        field != nullptr && field->kind == SpecKind::kString && scalar ? nlohmann::json(text) : value->value;
  }
  return OkStatus();
}

}  // namespace sftctl
