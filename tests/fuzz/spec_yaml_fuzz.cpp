// Fuzz target: a job spec as users write it (job.yaml), through LoadSpecFile (yaml-cpp → JSON with
// line numbers → ParseSpec), then what `sftctl run` / `sftctl submit` do with it: ToJson, the
// `--set FIELD=VALUE` overrides (ApplySetOverrides), ParseSpec again, and dump() to spec.json; and the
// same overrides applied before the file's one parse (LoadSpecFile(path, sets)) make the same spec.
//
// Input: the YAML text. Lines "#set FIELD=VALUE" (YAML comments, so they do not change the
// document) are also applied as --set overrides, in order.
//
// Properties checked: an accepted spec's canonical JSON dumps (as `sftctl run` writes it, strict
// UTF-8) and the text parses again (as the trainer reads spec.json) to itself; with overrides, the
// one-parse path and the round trip agree.
#include "common/spec/spec.h"
#include "common/spec/spec_yaml.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::AsView(data, size);
  const std::string path = fuzz::ScratchDir() + "/job.yaml";
  fuzz::WriteFile(path, text);
  std::vector<std::string> sets;
  for (std::string_view line : fuzz::Split(text, "\n")) {
    if (line.rfind("#set ", 0) == 0) sets.emplace_back(line.substr(5));
  }

  auto spec = LoadSpecFile(path);
  fuzz::Log("LoadSpecFile", spec.status());
  if (!spec.ok()) {
    FUZZ_CHECK(!spec.status().message().empty(), "an error without a message");
    return 0;
  }
  nlohmann::json j = ToJson(*spec);
  const std::string dumped = j.dump(2);  // cmd_run.cpp writes ToJson(spec).dump(2) to spec.json
  // ... and the trainer parses that text (trainer/tools/trainer_cli.cpp ReadSpecJson)
  nlohmann::json reread = nlohmann::json::parse(dumped, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!reread.is_discarded(), "the canonical JSON does not parse:\n" + dumped);
  auto again = ParseSpec(reread, "");
  FUZZ_CHECK(again.ok(), "the canonical JSON of an accepted spec is rejected: " + again.status().ToString() +
                             "\n" + dumped);
  FUZZ_CHECK(ToJson(*again).dump(2) == dumped, "the canonical JSON does not round-trip:\n" + dumped);

  if (sets.empty()) return 0;
  Status set = ApplySetOverrides(sets, &j);
  fuzz::Log("ApplySetOverrides", set);
  if (!set.ok()) return 0;
  auto canonical = ParseSpec(j, "", [](const std::string&) { return std::string("command line"); });
  fuzz::Log("ParseSpec after --set", canonical.status());
  if (!canonical.ok()) return 0;
  (void)ToJson(*canonical).dump(2);
  // What `run` and `submit` do: the overrides go into the file's JSON before its one parse, and make
  // the spec that applying them to the canonical JSON made.
  auto once = LoadSpecFile(path, sets);
  FUZZ_CHECK(once.ok(), "the overrides applied before the parse fail where the canonical JSON took them: " +
                            once.status().ToString());
  FUZZ_CHECK(ToJson(*once) == ToJson(*canonical),
             "the overrides applied before the parse make another spec:\n" + ToJson(*once).dump(2) + "\n" +
                 ToJson(*canonical).dump(2));
  return 0;
}
