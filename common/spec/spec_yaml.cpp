#include "common/spec/spec_yaml.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/spec/spec_fields.h"
#include "common/spec/spec_paths.h"
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

// Where `--set PATH=...` writes in the canonical JSON `j`. A field of the spec may be absent from it
// (ToJson leaves out knobs at their default, and an absent lora or slurm section is null): its path is
// created. Other paths (inside model.config) must exist.
StatusOr<json*> SetTarget(const std::string& path, const SpecField* field, json* j) {
  json* node = j;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (field != nullptr && node->is_null()) *node = json::object();
    if (!node->is_object() || (!node->contains(key) && field == nullptr)) {
      return InvalidArgumentError("--set: unknown field '" + path + "' (see docs/spec.md)");
    }
    node = &(*node)[key];
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

// A string (a string field's value, a list's entry) takes a plain scalar as written: --set
// checkpoint.region=1 or name=1e3.
json AsText(const std::string& text, const json& value) {
  return value.is_number() || value.is_boolean() ? json(text) : value;
}

// SpecDefaults(), for reading a default list (the table's accessors point into the spec; only read).
JobSpec& DefaultsForAdd() { return const_cast<JobSpec&>(SpecDefaults()); }

// `--set PATH+=VALUE` at `node`: VALUE's entries after a list's, or VALUE's fields over a section's.
Status AddTo(const std::string& path, const SpecField* field, const std::string& text, const json& value,
             json* node) {
  if (field != nullptr && field->kind == SpecKind::kList && !value.is_null() && !value.is_object()) {
    // A file's JSON may leave the list out (its default) or give its all-alias ("all-linear").
    if (node->is_null()) *node = *std::get<std::vector<std::string>*>(field->value(DefaultsForAdd()));
    if (node->is_string() && !field->all_alias.empty() && *node == field->all_alias) *node = field->choices;
    if (node->is_string()) *node = json::array({*node});  // one string: a list of one
    if (!node->is_array()) return InvalidArgumentError("--set " + path + "+=: the field is not a list");
    if (!value.is_array()) {
      node->push_back(AsText(text, value));
      return OkStatus();
    }
    for (const json& v : value) node->push_back(v);
    return OkStatus();
  }
  if (field != nullptr && field->kind == SpecKind::kSection && (value.is_null() || value.is_object())) {
    if (node->is_null()) *node = json::object();
    if (!node->is_object()) return InvalidArgumentError("--set " + path + "+=: the section is not a mapping");
    if (value.is_object())
      for (const auto& [key, v] : value.items()) (*node)[key] = v;
    return OkStatus();
  }
  return InvalidArgumentError("--set '" + path + "+=" + text +
                              "': += adds entries to a list field or fields to a section ({name: value})");
}

// The FIELD of each `--set FIELD=VALUE` / `FIELD+=VALUE` (malformed ones are ApplySetOverrides'
// to report).
std::vector<std::string> OverriddenFields(const std::vector<std::string>& overrides) {
  std::vector<std::string> out;
  for (const std::string& s : overrides) {
    size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    if (eq > 1 && s[eq - 1] == '+') --eq;
    out.push_back(s.substr(0, eq));
  }
  return out;
}

// A field an override set: one of `overridden`, or inside one ("lora.r" after `--set lora+={r: 4}`).
bool IsOverridden(const std::vector<std::string>& overridden, const std::string& field) {
  for (const std::string& o : overridden) {
    if (field == o ||
        (field.size() > o.size() && field.compare(0, o.size(), o) == 0 && field[o.size()] == '.'))
      return true;
  }
  return false;
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

StatusOr<JobSpec> LoadSpecFile(const std::string& path) { return LoadSpecFile(path, {}); }

StatusOr<JobSpec> LoadSpecFile(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read spec file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  SFT_ASSIGN_OR_RETURN(YamlDocument doc, YamlToJson(ss.str(), path));
  if (doc.value.is_null()) return InvalidArgumentError(path + ": the spec file is empty");
  const auto& lines = doc.lines;
  const std::vector<std::string> overridden = OverriddenFields(overrides);
  FieldLocator locate = [&lines, &path, &overridden](const std::string& field) {
    if (IsOverridden(overridden, field)) return std::string("command line");
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
  std::string base = std::filesystem::absolute(p.has_parent_path() ? p.parent_path().string() : ".").string();
  if (!doc.value.contains("name") && doc.value.is_object()) doc.value["name"] = p.stem().string();
  if (!overrides.empty() && doc.value.is_object()) {
    // The file's paths mean what they mean in its folder; an override's, what they mean here.
    ResolveSpecPaths(&doc.value, base);
    base.clear();
    SFT_RETURN_IF_ERROR(ApplySetOverrides(overrides, &doc.value));
  }
  return ParseSpec(doc.value, base, locate);  // the one parse
}

StatusOr<JobSpec> OverrideSpec(const JobSpec& spec, const std::vector<std::string>& overrides) {
  if (overrides.empty()) return spec;
  json j = ToJson(spec);
  SFT_RETURN_IF_ERROR(ApplySetOverrides(overrides, &j));
  return ParseSpec(j, "", [](const std::string&) { return std::string("command line"); });
}

Status ApplySetOverrides(const std::vector<std::string>& sets, json* j) {
  for (const auto& s : sets) {
    const size_t eq = s.find('=');
    const bool add = eq != std::string::npos && eq > 1 && s[eq - 1] == '+';  // FIELD+=VALUE
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgumentError("--set '" + s + "': expected FIELD=VALUE, e.g. --set train.lr=1e-4");
    }
    const std::string path = s.substr(0, add ? eq - 1 : eq);
    const std::string text = s.substr(eq + 1);
    auto value = YamlToJson(text, "--set " + path);
    if (!value.ok()) return value.status();
    const SpecField* field = FindSpecField(path);
    SFT_ASSIGN_OR_RETURN(json * node, SetTarget(path, field, j));
    if (add) {
      SFT_RETURN_IF_ERROR(AddTo(path, field, text, value->value, node));
    } else {
      *node =
          field != nullptr && field->kind == SpecKind::kString ? AsText(text, value->value) : value->value;
    }
  }
  return OkStatus();
}

std::string YamlQuoted(std::string_view value) {
  std::string out = "\"";
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {  // YAML's \xNN is U+00NN: the same byte for these
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace sftctl
