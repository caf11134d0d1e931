// `submit --provider`: contracts in submit_rented.h.
#include "client/commands/submit_rented.h"

#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "client/cloud/rental.h"
#include "client/commands/rent_flags.h"
#include "client/commands/submit_follow.h"
#include "client/remote/remote_options.h"
#include "client/remote/rented_hosts.h"
#include "client/transfer/pull_plan.h"
#include "common/object_store/s3_location.h"
#include "common/os/file_system.h"
#include "common/spec/spec_yaml.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

// Where a replacement for a lost host continues the run: the bucket the checkpoints went to (the
// agent downloads the newest complete one; `spec_upload_to`: the spec's checkpoint.upload_to), else the
// newest complete checkpoint pulled into --sync-to (uploaded with the job); nullopt: nothing survived,
// the run starts over. The lost run's partial downloads in --sync-to are moved aside
// (`<folder>.partial-<lost host>`), never deleted (the folder may hold the user's own): they can never
// complete, and the replacement's checkpoints of those steps need not match them.
std::optional<std::string> ReplacementResume(SubmitArgs* a, const std::string& spec_upload_to,
                                             const std::string& lost) {
  LocalCheckpoints local;
  if (!a->sync_to.empty()) local = ScanLocalCheckpoints(a->sync_to);
  for (const std::string& partial : local.partial) {
    const std::string aside = partial + ".partial-" + lost;
    if (FileSystem::Default()->Exists(aside)) continue;  // (never over anything)
    if (FileSystem::Default()->Rename(partial, aside).ok())
      std::cerr << "submit: moved " << EscapeForTerminal(partial) << " aside to " << EscapeForTerminal(aside)
                << ": a partial download of the lost run\n";
  }
  const std::string bucket = a->spec.upload_to.empty() ? spec_upload_to : a->spec.upload_to;
  if (IsS3Url(bucket)) {
    a->spec.resume_from = bucket;
    return bucket;
  }
  if (!local.newest_complete) return std::nullopt;
  std::error_code ec;
  const std::string path = std::filesystem::absolute(*local.newest_complete, ec).lexically_normal().string();
  a->spec.resume_from.clear();                           // (a --resume-from would come after it)
  a->spec.sets.push_back("resume=" + YamlQuoted(path));  // after the spec's and the user's: this wins
  return path;
}

// Gives `name` back (rent_flags.h's ReturnHost on its current record); an error is reported, and
// returned as the exit code unless `code` already is one. *down: how giving it back ended.
int GiveBack(const std::string& name, int code, bool json, Status* down) {
  auto now = RentedHosts().Get(name);
  *down = now.ok() ? ReturnHost(*now) : now.status();
  if (!down->ok()) {
    ReportError(*down, json);
    return code != kExitOk ? code : ExitCodeFor(*down);
  }
  std::cerr << "submit: " << name << " was given back\n";
  return code;
}

// The exit code of one host's submit or follow; its error reported here (the run goes on to decide
// about the host and give it back).
int ReportedCode(const StatusOr<int>& code, bool json) {
  return code.ok() ? *code : ReportError(code.status(), json);
}

// Submits the job (`spec`: loaded for this host, or the error of loading it) to `host` and follows
// it; while the connection is lost (exit 4), asks the provider (rental.h's DecideOnLostHost): follows
// the job again while the host runs, up to kFollowTries tries without an event between them. Returns
// the exit code and the action that ended it.
std::pair<int, cloud::LostHostAction> FollowOnRentedHost(const SubmitArgs& a, StatusOr<SubmitSpec> spec,
                                                         const RentedHost& host, int replaced) {
  constexpr int kFollowTries = 20;
  JobRecord rec;
  uint64_t printed = 0;
  int code = ReportedCode(
      spec.ok() ? SubmitThenFollow(a, std::move(*spec), &rec, &printed) : StatusOr<int>(spec.status()),
      a.ro.json);
  cloud::LostHostAction action = cloud::LostHostAction::kGiveBack;
  for (int tries = 0; code == kExitUnreachable; ++tries) {
    const cloud::LostHostVerdict v = cloud::DecideOnLostHost(
        host, RentedHostGone(host), replaced, a.replace_lost, !rec.id.empty() && tries < kFollowTries);
    std::cerr << "submit: " << EscapeForTerminal(v.why) << "\n";
    action = v.action;
    if (action != cloud::LostHostAction::kFollowAgain) break;
    std::this_thread::sleep_for(std::chrono::seconds(10));
    const uint64_t before = printed;
    code = ReportedCode(FollowAgain(a, rec, &printed), a.ro.json);
    if (printed != before) tries = 0;  // it got through for a while: a new outage
  }
  return {code, action};
}

// The job on `host` with --down-when-done: submitted, followed and pulled, then the host given back;
// a lost connection to a host that still runs is followed again (FollowOnRentedHost); with
// --replace-lost, a host the provider took away is replaced and the job continues there
// (ReplacementResume), within what is left of --max-cost (rental.h's RunCostCap). The first host runs
// `first`; each replacement loads the spec again, with the resume ReplacementResume set. `guard`
// follows the host in use.
StatusOr<int> RunOnRentedHosts(SubmitArgs a, SubmitSpec first, RentedHost host, HostReturnGuard* guard) {
  const bool json = a.ro.json;
  const std::string first_name = a.rent.name;
  const std::string spec_upload_to = first.remote.spec.checkpoint.upload_to;
  cloud::RunCostCap cost_cap(a.rent.max_cost);  // --max-cost covers the replacements too
  for (int replaced = 0;; ++replaced) {
    a.ro.hosts = {host.name};
    StatusOr<SubmitSpec> spec = replaced == 0 ? StatusOr<SubmitSpec>(std::move(first)) : LoadSubmitSpec(a);
    const auto [code, action] = FollowOnRentedHost(a, std::move(spec), host, replaced);
    bool replace = action == cloud::LostHostAction::kReplace;
    Status down;
    const int given_back = GiveBack(host.name, code, json, &down);
    if (Status may = cloud::CheckReplaceable(host.name, down); replace && !may.ok()) {
      std::cerr << "submit: " << EscapeForTerminal(may.message()) << "\n";
      return given_back;
    }
    if (replace) {
      const cloud::ReplacementCost cost = cost_cap.ChargeLostHost(RentedHosts(), host.name, NowUnixMs());
      if (!cost.why.empty()) std::cerr << "submit: " << cost.why << "\n";
      a.rent.max_cost = cost.max_cost;  // what the replacement may cost (0: no --max-cost)
      replace = cost.allowed;
    }
    if (!replace) return given_back;
    const std::optional<std::string> from = ReplacementResume(&a, spec_upload_to, host.name);
    a.rent.name = cloud::ReplacementHostName(first_name, replaced + 2);
    std::cerr << "submit: renting " << a.rent.name << " to continue "
              << (from ? "from " + EscapeForTerminal(*from)
                       : std::string("from the start (no checkpoint survived)"))
              << " (replacement " << replaced + 1 << " of " << a.replace_lost << ")\n";
    guard->Watch(a.rent.name);
    SFT_ASSIGN_OR_RETURN(host, RentHost(a.rent, a.ro, a.down_when_done));
  }
}

}  // namespace

StatusOr<int> SubmitRented(SubmitArgs a, SubmitSpec spec) {
  SFT_ASSIGN_OR_RETURN(const bool stops_itself, HostStopsItself(a.rent));
  if (a.rent.name.empty()) a.rent.name = cloud::DefaultHostName(a.rent.provider, a.rent.gpu);
  HostReturnGuard guard(a.rent.name);
  SFT_ASSIGN_OR_RETURN(RentedHost host, RentHost(a.rent, a.ro, a.down_when_done));
  if (!a.down_when_done) {
    guard.Release();
    a.ro.hosts = {host.name};
    std::cerr << "submit: " << host.name << " stays up: `sftctl down " << host.name << "` ends it\n";
    return SubmitThenFollow(a, std::move(spec));
  }
  a.follow = true;
  a.stop_when_done = a.stop_when_done || stops_itself;
  if (a.sync_to.empty() && spec.remote.spec.checkpoint.upload_to.empty()) a.sync_to = "./" + host.name;
  if (!a.sync_to.empty()) std::cerr << "submit: the checkpoints come to " << a.sync_to << "\n";
  StatusOr<int> code = RunOnRentedHosts(std::move(a), std::move(spec), std::move(host), &guard);
  guard.Release();
  return code;
}

}  // namespace sftctl::client
