// Fuzz target: the agent's validation of a SubmitJob request from a client (agent/state/job_spec.h):
// ValidateSpec over the request's spec_json and blob references (the agent's one parse of it), then
// what the supervisor does with an accepted one — MaterializeFolders in a job folder, the run folder
// as output_dir and CanonicalSpecJson.
//
// Input: "<spec_json>" ["\n#####\n" "<blob refs>"], one ref per line:
// "<json_pointer>\t<sha256>\t<dir_entry>". A sha256 field of one character c stands for 64 times
// the hex digit (c % 16), so mutations reach past the sha256 check; other values are used as given.
// blob_path answers "/blobs/<sha>", or FAILED_PRECONDITION for shas starting with "f" (not uploaded).
//
// Properties checked: every folder entry of an accepted request passes CheckRelativePath and is
// materialised beneath the job folder; the accepted spec's canonical text reads back to the same spec.
#include <filesystem>

#include "agent/state/job_spec.h"
#include "common/safe_path.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;
using namespace sftctl::agent;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::Split(fuzz::AsView(data, size), "\n#####\n");
  const std::string spec_json(parts[0]);
  std::vector<SpecBlobRef> refs;
  if (parts.size() > 1) {
    for (std::string_view line : fuzz::Split(parts[1], "\n")) {
      const auto f = fuzz::Split(line, "\t");
      SpecBlobRef r;
      r.json_pointer = std::string(f[0]);
      if (f.size() > 1) {
        r.sha256 = std::string(f[1]);
        if (r.sha256.size() == 1) r.sha256 = std::string(64, "0123456789abcdef"[r.sha256[0] & 15]);
      }
      if (f.size() > 2) r.dir_entry = std::string(f[2]);
      refs.push_back(std::move(r));
    }
  }
  auto blob_path = [](const std::string& sha) -> StatusOr<std::string> {
    if (!sha.empty() && sha[0] == 'f') return FailedPreconditionError("blob " + sha + " is not uploaded");
    return "/blobs/" + sha;
  };
  std::vector<SpecFolder> folders;
  auto spec = ValidateSpec(spec_json, refs, blob_path, &folders);
  fuzz::Log("ValidateSpec", spec.status());
  if (!spec.ok()) {
    FUZZ_CHECK(!spec.status().message().empty(), "an error without a message");
    return 0;
  }
  for (const SpecFolder& f : folders) {
    for (const auto& [entry, path] : f.entries) {
      FUZZ_CHECK(CheckRelativePath(entry).ok(), "an accepted folder entry the policy refuses: " + entry);
    }
  }
  const std::string job_dir = fuzz::ScratchDir() + "/job";
  if (!folders.empty()) {
    Status made = MaterializeFolders(job_dir, folders, &*spec);
    fuzz::Log("MaterializeFolders", made);
    // Everything created lies beneath the job folder (no entry escaped through "..", an absolute
    // path or a link made for another entry).
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(job_dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      const std::string made_path = it->path().string();
      FUZZ_CHECK(made_path == job_dir + "/inputs" || made_path.rfind(job_dir + "/inputs/", 0) == 0,
                 "created outside inputs/: " + made_path);
    }
    std::filesystem::remove_all(job_dir, ec);
  }
  spec->output_dir = job_dir + "/run";
  const std::string text = CanonicalSpecJson(*spec);  // as the supervisor writes it
  auto back = ParseStoredSpec(text, "spec");          // as a restarted agent reads it
  FUZZ_CHECK(back.ok(), "an accepted spec that does not read back: " + back.status().message());
  FUZZ_CHECK(CanonicalSpecJson(**back) == text, "an accepted spec that reads back changed");
  return 0;
}
