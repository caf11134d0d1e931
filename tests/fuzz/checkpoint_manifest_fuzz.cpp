// Fuzz target: a bucket checkpoint's MANIFEST.json (common/object_store/checkpoint_store.h
// ParseManifest): the bucket is untrusted. Properties: it never throws; an error is DATA_LOSS naming
// the object; an accepted manifest's paths pass CheckRelativePath and its ToJson parses back to the
// same manifest.
#include "common/object_store/checkpoint_store.h"
#include "common/safe_path.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string where = "s3://b/run/checkpoint-000001/MANIFEST.json";
  auto m = ParseManifest(fuzz::AsView(data, size), where);
  fuzz::Log("ParseManifest", m.status());
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == StatusCode::kDataLoss, m.status().ToString());
    FUZZ_CHECK(m.status().message().rfind(where, 0) == 0, m.status().message());
    return 0;
  }
  for (const ManifestFile& f : m->files) FUZZ_CHECK(CheckRelativePath(f.path).ok(), f.path);
  const std::string text = m->ToJson();
  auto again = ParseManifest(text, where);
  FUZZ_CHECK(again.ok(), again.status().ToString() + "\n" + text);
  FUZZ_CHECK(again->ToJson() == text, "the manifest does not round-trip:\n" + text);
  return 0;
}
