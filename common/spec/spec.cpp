#include "common/spec/spec.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/spec/hub_path.h"
#include "common/spec/spec_fields.h"
#include "common/spec/spec_paths.h"

namespace sftctl {
namespace {

using nlohmann::json;

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const char* TypeName(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "a mapping";
}

// Reads the fields of one JSON object, remembering which keys were consumed, so that
// unknown keys can be reported with a "did you mean" suggestion.
class ObjectReader {
 public:
  ObjectReader(const json& obj, std::string prefix, const FieldLocator& locate)
      : obj_(obj), prefix_(std::move(prefix)), locate_(locate) {}

  std::string Path(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

  Status Error(const std::string& key, const std::string& problem) const {
    std::string path = Path(key);
    std::string where = locate_ ? locate_(path) : std::string();
    return FieldError(where, path, problem);
  }

  const json* Get(const std::string& key) {
    known_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status Int(const std::string& key, int64_t* out, int64_t min_value) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    // A float counts when it is a whole number in int64's range (casting one outside it is undefined).
    if (v->is_number_float() && v->get<double>() >= -0x1p63 && v->get<double>() < 0x1p63 &&
        v->get<double>() == std::trunc(v->get<double>())) {
      *out = static_cast<int64_t>(v->get<double>());
    } else if (v->is_number_integer() || v->is_number_unsigned()) {
      *out = v->get<int64_t>();
    } else {
      return Error(key, std::string("must be an integer, got ") + TypeName(*v));
    }
    if (*out < min_value)
      return Error(key, "must be >= " + std::to_string(min_value) + ", got " + std::to_string(*out));
    return OkStatus();
  }

  Status Double(const std::string& key, double* out, double min_value, double max_value) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_number()) return Error(key, std::string("must be a number, got ") + TypeName(*v));
    *out = v->get<double>();
    if (!(*out >= min_value && *out <= max_value)) {
      return Error(key, "must be in [" + Num(min_value) + ", " + Num(max_value) + "], got " + Num(*out));
    }
    return OkStatus();
  }

  Status Bool(const std::string& key, bool* out) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_boolean()) return Error(key, std::string("must be true or false, got ") + TypeName(*v));
    *out = v->get<bool>();
    return OkStatus();
  }

  Status String(const std::string& key, std::string* out) {
    const json* v = Get(key);
    if (v == nullptr) return OkStatus();
    if (!v->is_string()) return Error(key, std::string("must be a string, got ") + TypeName(*v));
    *out = v->get<std::string>();
    return OkStatus();
  }

  // A nested object: *out is null when it was not given.
  Status Object(const std::string& key, const json** out) {
    *out = Get(key);
    if (*out != nullptr && !(*out)->is_object())
      return Error(key, std::string("must be a mapping, got ") + TypeName(**out));
    return OkStatus();
  }

  // Reports the first key that no reader asked for.
  Status CheckNoUnknown() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (known_.count(it.key())) continue;
      std::string best;
      size_t best_d = 3;
      for (const auto& k : known_) {
        size_t d = EditDistance(it.key(), k);
        if (d < best_d) best_d = d, best = k;
      }
      return Error(it.key(), "unknown field" +
                                 (best.empty() ? std::string() : " (did you mean '" + Path(best) + "'?)"));
    }
    return OkStatus();
  }

  static std::string Resolve(const std::string& p, const std::string& base_dir) {
    if (p.empty() || base_dir.empty() || p[0] == '/' || IsHubPath(p)) return p;
    return (std::filesystem::path(base_dir) / p).lexically_normal().string();
  }

  static std::string Num(double d) {
    std::ostringstream os;
    os << d;
    return os.str();
  }

 private:
  const json& obj_;
  std::string prefix_;
  const FieldLocator& locate_;
  std::set<std::string> known_;
};

// A value kept as written: one of the field's `keep` words, or a prefix of them ending in "://".
bool KeptAsIs(const SpecField& f, const std::string& v) {
  for (const auto& k : f.keep) {
    const bool prefix = k.size() > 3 && k.compare(k.size() - 3, 3, "://") == 0;
    if (prefix ? v.rfind(k, 0) == 0 : v == k) return true;
  }
  return false;
}

// A string field's checks apply to its default too (every default passes them).
Status ReadString(ObjectReader& r, const SpecField& f, std::string* out, const std::string& base_dir) {
  SFT_RETURN_IF_ERROR(r.String(f.name, out));
  if (f.non_empty && out->empty()) return r.Error(f.name, "must not be empty");
  if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), *out) == f.choices.end()) {
    std::string list;
    for (const auto& c : f.choices) list += (list.empty() ? "" : ", ") + c;
    return r.Error(f.name, "must be one of " + list + ", got '" + *out + "'");
  }
  if (f.check != nullptr) {
    if (std::string problem = f.check(*out); !problem.empty()) return r.Error(f.name, problem);
  }
  if (f.is_path && !KeptAsIs(f, *out)) *out = ObjectReader::Resolve(*out, base_dir);
  return OkStatus();
}

// One entry of a list field, appended to *list.
Status ReadListItem(const ObjectReader& r, const SpecField& f, const json& e,
                    std::vector<std::string>* list) {
  if (!e.is_string()) return r.Error(f.name, "must list " + f.items + ", found " + TypeName(e));
  const std::string v = e.get<std::string>();
  if (f.items_non_empty && v.empty()) return r.Error(f.name, f.items + " must not be empty");
  if (!f.choices.empty() && std::find(f.choices.begin(), f.choices.end(), v) == f.choices.end()) {
    std::string all;
    for (const auto& c : f.choices) all += (all.empty() ? "" : ", ") + c;
    return r.Error(f.name, "'" + v + "' " + f.choice_problem + " (" + all + ")");
  }
  if (!f.dedupe || std::find(list->begin(), list->end(), v) == list->end()) list->push_back(v);
  return OkStatus();
}

Status ReadList(ObjectReader& r, const SpecField& f, std::vector<std::string>* out,
                const std::string& base_dir) {
  if (const json* v = r.Get(f.name); v != nullptr) {
    std::vector<std::string> list;
    const bool alias = v->is_string() && !f.all_alias.empty() && v->get<std::string>() == f.all_alias;
    if (alias) {
      list = f.choices;
    } else if (v->is_string() && f.one_string_ok) {
      list.push_back(v->get<std::string>());
    } else if (v->is_array() && !(f.list_non_empty && v->empty())) {
      for (const auto& e : *v) SFT_RETURN_IF_ERROR(ReadListItem(r, f, e, &list));
    } else {
      const std::string what = f.one_string_ok
                                   ? "a " + f.item + " or a list of " + f.items
                                   : std::string(f.list_non_empty ? "a non-empty " : "a ") + "list of " +
                                         f.items + (f.all_alias.empty() ? "" : " or '" + f.all_alias + "'");
      return r.Error(f.name, "must be " + what + ", got " + TypeName(*v));
    }
    if (f.is_path) {
      for (auto& p : list) p = ObjectReader::Resolve(p, base_dir);
    }
    *out = std::move(list);
  }
  if (!f.required.empty() && out->empty()) return r.Error(f.name, f.required);
  return OkStatus();
}

Status ReadFields(ObjectReader& r, const std::vector<SpecField>& fields, JobSpec* s,
                  const std::string& base_dir, const FieldLocator& locate);

// A section: absent leaves its defaults (an optional one stays absent); present, its fields are
// read and nothing else may be in it.
Status ReadSection(ObjectReader& r, const SpecField& f, JobSpec* s, const std::string& base_dir,
                   const FieldLocator& locate) {
  const json* obj = nullptr;
  SFT_RETURN_IF_ERROR(r.Object(f.name, &obj));
  if (obj == nullptr) return f.required.empty() ? OkStatus() : r.Error(f.name, f.required);
  if (f.enable != nullptr) f.enable(*s);
  ObjectReader section(*obj, r.Path(f.name), locate);
  SFT_RETURN_IF_ERROR(ReadFields(section, *f.fields, s, base_dir, locate));
  if (f.section_check != nullptr) {
    if (std::string problem = f.section_check(*s); !problem.empty())
      return section.Error(f.check_at, problem);
  }
  return OkStatus();
}

Status ReadField(ObjectReader& r, const SpecField& f, JobSpec* s, const std::string& base_dir,
                 const FieldLocator& locate) {
  if (f.kind == SpecKind::kSection) return ReadSection(r, f, s, base_dir, locate);
  const SpecValue value = f.value(*s);
  switch (f.kind) {
    case SpecKind::kInt:
      return r.Int(f.name, std::get<int64_t*>(value), f.int_min);
    case SpecKind::kNumber: {
      double* d = std::get<double*>(value);
      SFT_RETURN_IF_ERROR(r.Double(f.name, d, f.min, f.max));
      if (f.above_min && *d <= f.min) return r.Error(f.name, "must be > " + ObjectReader::Num(f.min));
      return OkStatus();
    }
    case SpecKind::kBool:
      return r.Bool(f.name, std::get<bool*>(value));
    case SpecKind::kString:
      return ReadString(r, f, std::get<std::string*>(value), base_dir);
    case SpecKind::kList:
      return ReadList(r, f, std::get<std::vector<std::string>*>(value), base_dir);
    case SpecKind::kJson: {
      const json* obj = nullptr;
      SFT_RETURN_IF_ERROR(r.Object(f.name, &obj));
      if (obj != nullptr) *std::get<json*>(value) = *obj;
      return OkStatus();
    }
    case SpecKind::kSection:
      break;
  }
  return OkStatus();
}

// Reads `fields` in table order (the first problem found is the one reported), then refuses
// any other key.
Status ReadFields(ObjectReader& r, const std::vector<SpecField>& fields, JobSpec* s,
                  const std::string& base_dir, const FieldLocator& locate) {
  for (const auto& f : fields) SFT_RETURN_IF_ERROR(ReadField(r, f, s, base_dir, locate));
  return r.CheckNoUnknown();
}

json ValueJson(const SpecValue& v) {
  return std::visit([](auto* p) { return json(*p); }, v);
}

// `s` is only read: the table's accessors return pointers into it.
json WriteFields(const std::vector<SpecField>& fields, JobSpec& s) {
  JobSpec& defaults = const_cast<JobSpec&>(SpecDefaults());
  json out = json::object();
  for (const auto& f : fields) {
    if (f.kind == SpecKind::kSection) {
      if (f.present != nullptr && !f.present(s)) {
        if (f.null_when_absent) out[f.name] = nullptr;
        continue;
      }
      json section = WriteFields(*f.fields, s);
      if (f.emit == SpecEmit::kAlways || !section.empty()) out[f.name] = std::move(section);
      continue;
    }
    json v = ValueJson(f.value(s));
    if (f.emit == SpecEmit::kUnlessDefault && v == ValueJson(f.value(defaults))) continue;
    out[f.name] = std::move(v);
  }
  return out;
}

// Calls fn(field, dotted path, JSON pointer, value) for each string of every path field (SpecField::
// is_path) of `s` under `fields`, in table order; an absent optional section is skipped. A list's
// entries are "/data/train/0", ... as ToJson writes them.
template <typename Fn>
void ForEachPathString(const std::vector<SpecField>& fields, JobSpec& s, const std::string& prefix, Fn&& fn) {
  for (const auto& f : fields) {
    const std::string path = prefix.empty() ? f.name : prefix + "." + f.name;
    if (f.kind == SpecKind::kSection) {
      if (f.present == nullptr || f.present(s)) ForEachPathString(*f.fields, s, path, fn);
      continue;
    }
    if (!f.is_path) continue;
    std::string pointer = "/" + path;
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    const SpecValue value = f.value(s);
    if (f.kind == SpecKind::kString) fn(f, path, pointer, *std::get<std::string*>(value));
    if (f.kind != SpecKind::kList) continue;
    std::vector<std::string>& list = *std::get<std::vector<std::string>*>(value);
    for (size_t i = 0; i < list.size(); ++i) fn(f, path, pointer + "/" + std::to_string(i), list[i]);
  }
}

// ResolveSpecPaths's walk: the path fields of `fields` in `j`, a section's JSON.
void ResolveJsonPaths(const std::vector<SpecField>& fields, json* j, const std::string& base_dir) {
  for (const auto& f : fields) {
    auto it = j->find(f.name);
    if (it == j->end()) continue;
    if (f.kind == SpecKind::kSection) {
      if (it->is_object()) ResolveJsonPaths(*f.fields, &*it, base_dir);
      continue;
    }
    if (!f.is_path) continue;
    const bool one = it->is_string() &&
                     (f.kind == SpecKind::kList ? f.one_string_ok : !KeptAsIs(f, it->get<std::string>()));
    if (one) *it = ObjectReader::Resolve(it->get<std::string>(), base_dir);
    if (f.kind != SpecKind::kList || !it->is_array()) continue;
    for (json& e : *it) {
      if (e.is_string()) e = ObjectReader::Resolve(e.get<std::string>(), base_dir);
    }
  }
}

}  // namespace

void ResolveSpecPaths(json* j, const std::string& base_dir) {
  if (!j->is_object() || base_dir.empty()) return;
  ResolveJsonPaths(SpecFields(), j, base_dir);
  // ParseSpec's default output_dir, runs/<name>, from the name as it is now.
  auto out = j->find("output_dir");
  if (out != j->end() && !out->is_null() && !(out->is_string() && out->get_ref<const std::string&>().empty()))
    return;
  auto name = j->find("name");
  if (name != j->end() && !name->is_null() && !name->is_string()) return;  // ParseSpec reports it
  const bool named = name != j->end() && name->is_string() && !name->get_ref<const std::string&>().empty();
  (*j)["output_dir"] = ObjectReader::Resolve("runs/" + (named ? name->get<std::string>() : "run"), base_dir);
}

std::vector<SpecHubPath> HubPaths(const JobSpec& spec) {
  std::vector<SpecHubPath> out;
  // Read only: the table's accessors return pointers into it.
  ForEachPathString(
      SpecFields(), const_cast<JobSpec&>(spec), "",
      [&out](const SpecField& f, const std::string& path, const std::string& pointer, const std::string& v) {
        if (f.hub != SpecHub::kNone && IsHubPath(v)) out.push_back({path, pointer, v, f.hub});
      });
  return out;
}

Status ReplaceHubPath(JobSpec* spec, const SpecHubPath& path, const std::string& local) {
  bool replaced = false;
  ForEachPathString(
      SpecFields(), *spec, "",
      [&](const SpecField& f, const std::string&, const std::string& pointer, std::string& v) {
        if (replaced || pointer != path.json_pointer || f.hub == SpecHub::kNone || !IsHubPath(v)) return;
        v = local;
        replaced = true;
      });
  if (!replaced) return InternalError("the spec holds no hf:// path at " + path.json_pointer);
  return OkStatus();
}

StatusOr<JobSpec> ParseSpec(const json& j, const std::string& base_dir, const FieldLocator& locate) {
  if (!j.is_object()) {
    std::string where = locate ? locate("") : std::string();
    return InvalidArgumentError((where.empty() ? "" : where + ": ") +
                                "a job spec must be a mapping of fields");
  }
  JobSpec s;
  ObjectReader top(j, "", locate);
  SFT_RETURN_IF_ERROR(ReadFields(top, SpecFields(), &s, base_dir, locate));
  if (s.name.empty()) s.name = "run";
  if (s.output_dir.empty()) s.output_dir = ObjectReader::Resolve("runs/" + s.name, base_dir);
  return s;
}

json ToJson(const JobSpec& s) {
  return WriteFields(SpecFields(), const_cast<JobSpec&>(s));  // read only (WriteFields)
}

StatusOr<std::string> RunSpecJson(const JobSpec& spec) {
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (ec) return InternalError("cannot read the working directory (for spec.json's paths): " + ec.message());
  // The path fields resolved as ParseSpec resolves them against a spec's folder (a list's every
  // entry; a string unless it is one of the values its field keeps as written), hf:// kept.
  JobSpec absolute = spec;
  if (absolute.name.empty()) absolute.name = "run";  // ParseSpec's defaults, for a spec made in code
  if (absolute.output_dir.empty()) absolute.output_dir = "runs/" + absolute.name;
  ForEachPathString(SpecFields(), absolute, "",
                    [&cwd](const SpecField& f, const std::string&, const std::string&, std::string& v) {
                      if (f.kind == SpecKind::kList || !KeptAsIs(f, v))
                        v = ObjectReader::Resolve(v, cwd.string());
                    });
  return ToJson(absolute).dump(2) + "\n";
}

Status CheckSpecFiles(const JobSpec& spec) {
  auto check = [](const std::string& field, const std::string& path) -> Status {
    if (IsHubPath(path)) return OkStatus();  // downloaded before the trainer starts (common/hub/hub_spec.h)
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      return NotFoundError("field '" + field + "': file '" + path + "' does not exist");
    if (!S_ISREG(st.st_mode))
      return InvalidArgumentError("field '" + field + "': '" + path + "' is not a regular file");
    return OkStatus();
  };
  for (const auto& f : spec.data.train) SFT_RETURN_IF_ERROR(check("data.train", f));
  for (const auto& f : spec.data.eval) SFT_RETURN_IF_ERROR(check("data.eval", f));
  if (!spec.model.path.empty() && !IsHubPath(spec.model.path)) {
    SFT_RETURN_IF_ERROR(check("model.path", spec.model.path + "/config.json"));
  }
  return OkStatus();
}

}  // namespace sftctl
