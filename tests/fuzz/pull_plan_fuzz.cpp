// Fuzz target: what an untrusted agent sends the client about a job's files, and the client's
// defences: PlanPull (client/transfer/pull_plan.h) over a fuzzed ListArtifacts response, the safe-path
// policy (common/safe_path.h: CheckRelativePath, PathBeneath) and EscapeForTerminal
// (common/terminal_text.h) on every path and error message the client would print.
//
// Input: one artifact per line, "<path>\t<checkpoint_step>\t<complete 0|1>\t<size>\t<sha256>"
// (missing fields: the step parsed from "run/checkpoint-N/", complete, size 0); a line
// "@step N" picks the checkpoint step asked for (default: the newest complete one).
// The destination folder holds a symbolic link, a file and a real checkpoint folder with a link
// inside, so PathBeneath's refusals are reached.
//
// Properties checked: a plan's every local path is <dest>/<a path CheckRelativePath accepts> with
// no symbolic link below <dest>, completion markers come last, every item is a top-level run/ file or
// inside a run/checkpoint-* folder; EscapeForTerminal's output holds no control sequence
// and escaping twice changes nothing.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "client/transfer/pull_plan.h"
#include "common/safe_path.h"
#include "common/terminal_text.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

namespace {

const std::string& Dest() {
  static const std::string dest = [] {
    namespace fs = std::filesystem;
    const std::string root = fuzz::ScratchDir() + "/pull";
    const std::string d = root + "/dest";
    fs::create_directories(d + "/checkpoint-000002");
    fs::create_directories(root + "/elsewhere");
    fs::create_directory_symlink(root + "/elsewhere", d + "/checkpoint-000001");
    fs::create_directory_symlink(root + "/elsewhere", d + "/checkpoint-000002/sub");
    fuzz::WriteFile(d + "/metrics.jsonl", "{}\n");
    fuzz::WriteFile(d + "/checkpoint-000002/model.safetensors", "w");
    return d;
  }();
  return dest;
}

std::string Escaped(std::string_view s) {
  std::string e = EscapeForTerminal(s);
  FUZZ_CHECK(fuzz::IsTerminalSafe(e), "EscapeForTerminal left a control sequence");
  FUZZ_CHECK(EscapeForTerminal(e) == e, "EscapeForTerminal is not idempotent");
  return e;
}

int64_t ToInt(std::string_view s, int64_t def) {
  if (s.empty() || s.size() > 18) return def;
  char* end = nullptr;
  const std::string str(s);
  const long long v = std::strtoll(str.c_str(), &end, 10);
  return end != nullptr && *end == '\0' ? v : def;
}

bool IsLinkFreeBelow(const std::string& dest, const std::string& rel) {
  std::string path = dest;
  for (std::string_view part : fuzz::Split(rel, "/")) {
    path += "/";
    path += part;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return true;  // the rest does not exist yet
    if (S_ISLNK(st.st_mode)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dest = Dest();
  v1::ListArtifactsResponse list;
  int64_t step = -1;
  for (std::string_view line : fuzz::Split(fuzz::AsView(data, size), "\n")) {
    if (line.rfind("@step ", 0) == 0) {
      step = ToInt(line.substr(6), -1);
      continue;
    }
    const auto f = fuzz::Split(line, "\t");
    v1::Artifact* a = list.add_artifacts();
    a->set_path(std::string(f[0]));
    int64_t implied = -1;
    if (f[0].rfind("run/checkpoint-", 0) == 0) implied = ToInt(fuzz::Split(f[0].substr(15), "/")[0], -1);
    a->set_checkpoint_step(f.size() > 1 ? ToInt(f[1], implied) : implied);
    a->set_checkpoint_complete(f.size() > 2 ? f[2] == "1" : true);
    a->set_size(static_cast<uint64_t>(f.size() > 3 ? ToInt(f[3], 0) : 0));
    if (f.size() > 4) a->set_sha256(std::string(f[4]));

    // The policy on its own, for every path.
    const std::string_view rel = f[0].rfind("run/", 0) == 0 ? f[0].substr(4) : f[0];
    const Status checked = CheckRelativePath(rel);
    (void)Escaped(checked.message());
    auto beneath = PathBeneath(dest, rel);
    if (beneath.ok()) {
      FUZZ_CHECK(checked.ok(), "PathBeneath accepted a path CheckRelativePath refuses");
      FUZZ_CHECK(*beneath == dest + "/" + std::string(rel), "PathBeneath did not join beneath the folder");
      FUZZ_CHECK(IsLinkFreeBelow(dest, std::string(rel)), "PathBeneath accepted a path through a link");
    } else {
      (void)Escaped(beneath.status().message());
    }
    (void)Escaped(f[0]);
  }

  auto plan = client::PlanPull(list, step, dest, "gpu/job-1");
  fuzz::Log("PlanPull", plan.status());
  if (!plan.ok()) {
    (void)Escaped(plan.status().message());
    return 0;
  }
  bool seen_marker = false;
  uint64_t total = 0;
  for (const client::PullItem& it : plan->items) {
    FUZZ_CHECK(it.remote_path.rfind("run/", 0) == 0, "an item outside run/: " + it.remote_path);
    const std::string rel = it.remote_path.substr(4);
    FUZZ_CHECK(CheckRelativePath(rel).ok(), "a planned path the policy refuses: " + Escaped(rel));
    FUZZ_CHECK(it.local_path == dest + "/" + rel,
               "a planned local path outside the folder: " + Escaped(it.local_path));
    FUZZ_CHECK(IsLinkFreeBelow(dest, rel), "a planned path through a symbolic link: " + Escaped(rel));
    const bool top = rel.find('/') == std::string::npos;
    FUZZ_CHECK(top || rel.rfind("checkpoint-", 0) == 0,
               "a planned file outside run/ and its checkpoints: " + Escaped(rel));
    FUZZ_CHECK(rel != client::kPullStateFile, "the listing planned to write the pull state");
    FUZZ_CHECK(top || rel.substr(0, rel.find('/')) == plan->checkpoint_dir,
               "a planned checkpoint file outside the plan's one folder: " + Escaped(rel));
    const bool marker = client::IsCompletionMarker(it.remote_path);
    FUZZ_CHECK(marker || !seen_marker, "a completion marker before other files");
    seen_marker |= marker;
    total += it.size;
  }
  FUZZ_CHECK(total == plan->total_bytes, "total_bytes");
  FUZZ_CHECK(step < 0 || plan->step == step, "a plan for another step than asked");
  return 0;
}
