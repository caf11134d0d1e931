// `sftctl offers`, `up`, `down`, `hosts`: GPU hosts rented through a provider's API
// (client/cloud/rental.h; docs/remote.md, "Renting a host").
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "client/cloud/provider_config.h"
#include "client/cloud/provider_factory.h"
#include "client/commands/commands.h"
#include "client/commands/rent_flags.h"
#include "client/remote/job_target.h"
#include "client/remote/log_follower.h"
#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

using nlohmann::json;

// The providers to ask: --provider, else every profile with a key (FAILED_PRECONDITION when none).
StatusOr<std::vector<std::unique_ptr<cloud::CloudProvider>>> ProvidersFor(const std::string& name) {
  std::vector<cloud::ProviderProfile> profiles;
  if (!name.empty()) {
    SFT_ASSIGN_OR_RETURN(auto p, cloud::FindProviderProfile(name));
    profiles.push_back(p);
  } else {
    SFT_ASSIGN_OR_RETURN(profiles, cloud::ConfiguredProviderProfiles());
    if (profiles.empty()) {
      return FailedPreconditionError(
          "no provider has an API key: set LAMBDA_API_KEY or RUNPOD_API_KEY "
          "(docs/remote.md, \"Renting a host\")");
    }
  }
  std::vector<std::unique_ptr<cloud::CloudProvider>> out;
  for (const auto& p : profiles) {
    SFT_ASSIGN_OR_RETURN(auto provider, cloud::NewProvider(p, CurlHttpClient()));
    out.push_back(std::move(provider));
  }
  return out;
}

struct OffersArgs {
  std::string provider, gpu, region;
  int count = 0;
  double max_price = 0;
  bool json = false;
};

int Offers(const OffersArgs& a) {
  auto providers = ProvidersFor(a.provider);
  if (!providers.ok()) return ReportError(providers.status(), a.json);
  std::vector<cloud::Offer> all;
  for (auto& p : *providers) {
    auto offers = p->ListOffers(a.gpu, a.count);
    if (!offers.ok()) return ReportError(offers.status(), a.json);
    all.insert(all.end(), offers->begin(), offers->end());
  }
  cloud::UpOptions filter;
  filter.region = a.region, filter.max_price = a.max_price;
  all = cloud::RankOffers(std::move(all), filter);
  if (a.json) {
    json out = json::array();
    for (const auto& o : all) {
      out.push_back({{"provider", o.provider},
                     {"instance_type", o.instance_type},
                     {"gpu", o.gpu},
                     {"gpu_count", o.gpu_count},
                     {"gpu_memory_gib", o.gpu_memory_gib},
                     {"region", o.region},
                     {"price_per_hour", o.price_per_hour},
                     {"vcpus", o.vcpus},
                     {"memory_gib", o.memory_gib}});
    }
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  if (all.empty()) {
    std::cerr << "no offer with capacity now" << (a.gpu.empty() ? "" : " for " + EscapeForTerminal(a.gpu))
              << "\n";
    return kExitAgent;
  }
  std::printf("%-12s %-28s %-22s %4s %6s %-16s %9s\n", "PROVIDER", "INSTANCE TYPE", "GPU", "GPUS", "MEM",
              "REGION", "$/HOUR");
  for (const auto& o : all) {
    std::printf("%-12s %-28s %-22s %4d %5dG %-16s %9.2f\n", EscapeForTerminal(o.provider).c_str(),
                EscapeForTerminal(o.instance_type).c_str(), EscapeForTerminal(o.gpu).c_str(), o.gpu_count,
                o.gpu_memory_gib, EscapeForTerminal(o.region.empty() ? "any" : o.region).c_str(),
                o.price_per_hour);
  }
  return kExitOk;
}

struct UpArgs {
  RentFlags rent;
  RemoteOptions ro;
  bool down_when_done = false;
};

int Up(UpArgs a) {
  // Ctrl-C while renting gives the half-made host back; once it is up, it stays.
  if (a.rent.name.empty()) a.rent.name = cloud::DefaultHostName(a.rent.provider, a.rent.gpu);
  HostReturnGuard guard(a.rent.name);
  auto host = RentHost(a.rent, a.ro, a.down_when_done);
  guard.Release();
  if (!host.ok()) return ReportError(host.status(), a.ro.json);
  if (a.ro.json) {
    std::cout << json({{"name", host->name},
                       {"ssh", host->SshTarget()},
                       {"instance_id", host->instance_id},
                       {"price_per_hour", host->price_per_hour}})
                     .dump()
              << "\n";
  } else {
    std::cerr << "up: " << host->name << " is ready (" << host->SshTarget() << ", "
              << cloud::FormatUsd(host->price_per_hour) << "/h); `sftctl down " << host->name
              << "` ends it\n";
    std::cout << host->name << "\n";
  }
  return kExitOk;
}

struct DownArgs {
  std::vector<std::string> names;
  bool all = false;
  std::string provider, instance;  // an orphan: --provider P --instance ID
  bool force = false;              // terminate though jobs still run there
  bool json = false;
};

// The jobs on `h` that have not ended ("job-3 (RUNNING, step 1200)"), asked of its agent (never
// started for this); none when it has none or does not answer (nothing of it can be saved then).
std::vector<std::string> UnfinishedJobs(const RentedHost& h) {
  auto opts = MakeConnectOptions(RemoteOptions{}, h.name);
  if (!opts.ok()) return {};
  opts->start_agent = false;
  opts->connect_timeout_s = 10;
  auto rc = ConnectHost(*opts);
  v1::ListJobsResponse resp;
  if (!rc.ok() || !ListJobs(rc->get(), &resp).ok()) return {};
  std::vector<std::string> out;
  for (const auto& j : resp.jobs()) {
    if (IsFinal(j.state())) continue;
    out.push_back(EscapeForTerminal(j.id()) + " (" + StateName(j.state()) +
                  (j.last_step() >= 0 ? ", step " + std::to_string(j.last_step()) : "") + ")");
  }
  return out;
}

int Down(const DownArgs& a) {
  if (!a.instance.empty()) {
    auto providers = ProvidersFor(a.provider);
    if (!providers.ok()) return ReportError(providers.status(), a.json);
    Status s = cloud::TerminateAndWait(providers->front().get(), a.instance, "", Clock::Real(), std::cerr);
    if (!s.ok()) return ReportError(s, a.json);
    std::cerr << "down: " << a.provider << " reports instance " << EscapeForTerminal(a.instance) << " gone\n";
    return kExitOk;
  }
  RentedHosts registry;
  std::vector<RentedHost> targets;
  if (a.all) {
    auto hosts = registry.Load();
    if (!hosts.ok()) return ReportError(hosts.status(), a.json);
    for (auto& h : *hosts) {
      if (h.Live()) targets.push_back(h);
    }
  }
  for (const auto& n : a.names) {
    auto h = registry.Get(n);
    if (!h.ok()) return ReportError(h.status(), a.json);
    targets.push_back(*h);
  }
  int rc = kExitOk;
  for (const auto& h : targets) {
    // Terminating deletes the host's disk: a job still running there loses what was not pulled.
    if (const std::vector<std::string> jobs = a.force ? std::vector<std::string>() : UnfinishedJobs(h);
        !jobs.empty()) {
      std::string list;
      for (const auto& j : jobs) list += (list.empty() ? "" : ", ") + j;
      rc =
          ReportError(FailedPreconditionError(h.name + " still runs " + list +
                                              ": pull what you need (`sftctl pull JOB`), then `sftctl down " +
                                              h.name + " --force` terminates it anyway"),
                      a.json);
      continue;
    }
    Status s = ReturnHost(h);
    if (!s.ok()) {
      rc = ReportError(s, a.json);
      continue;
    }
    auto after = registry.Get(h.name);
    const double spent = after.ok() ? after->SpentUsd(NowUnixMs()) : h.SpentUsd(NowUnixMs());
    std::cerr << "down: " << h.name << " is gone (" << cloud::FormatUsd(spent) << " in all)\n";
  }
  return rc;
}

std::string Uptime(int64_t ms) {
  const int64_t m = ms / 60000;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(m / 60),
                static_cast<long long>(m % 60));
  return buf;
}

// One line of `sftctl hosts`: a registry record, the provider's instance, or both.
struct HostLine {
  std::string name, provider, state, instance_id, ssh, error;
  double price_per_hour = 0, spent = 0;
  int64_t uptime_s = 0;
  bool orphan = false;
};

HostLine MakeHostLine(const cloud::HostRow& r, int64_t now) {
  HostLine row;
  row.provider = r.provider;
  row.orphan = r.orphan;
  row.error = r.error;
  row.name = r.record ? r.record->name : (r.instance ? r.instance->name : "");
  row.state = r.instance ? r.instance->status : (r.record ? r.record->state : "");
  row.instance_id = r.record ? r.record->instance_id : (r.instance ? r.instance->id : "");
  row.ssh = r.record ? r.record->SshTarget() : "";
  row.price_per_hour = r.record ? r.record->price_per_hour : (r.instance ? r.instance->price_per_hour : 0);
  const int64_t since =
      r.record ? r.record->launched_unix_ms : (r.instance ? r.instance->created_unix_ms : 0);
  row.uptime_s = since > 0 ? (now - since) / 1000 : 0;
  row.spent =
      r.record ? r.record->SpentUsd(now) : (since > 0 ? row.price_per_hour * (now - since) / 3.6e6 : 0);
  return row;
}

json HostLineJson(const HostLine& row) {
  json j = {{"name", row.name},         {"provider", row.provider},
            {"state", row.state},       {"price_per_hour", row.price_per_hour},
            {"uptime_s", row.uptime_s}, {"spent", row.spent},
            {"orphan", row.orphan},     {"instance_id", row.instance_id},
            {"error", row.error}};
  if (!row.ssh.empty()) j["ssh"] = row.ssh;
  return j;
}

// What follows a row in the table: how to end an orphan, or why the provider could not be asked.
std::string HostLineNote(const HostLine& row) {
  if (row.orphan) {
    return "  ORPHAN: not started by this sftctl (`sftctl down --provider " +
           EscapeForTerminal(row.provider) + " --instance " + EscapeForTerminal(row.instance_id) + "`)";
  }
  return row.error.empty() ? "" : "  (" + EscapeForTerminal(row.error) + ")";
}

int Hosts(const std::string& provider_name, bool as_json) {
  std::vector<std::unique_ptr<cloud::CloudProvider>> owned;
  if (auto providers = ProvidersFor(provider_name); providers.ok()) {
    owned = std::move(*providers);
  } else if (!provider_name.empty()) {
    return ReportError(providers.status(), as_json);
  }
  std::vector<cloud::CloudProvider*> providers;
  for (auto& p : owned) providers.push_back(p.get());
  const int64_t now = NowUnixMs();
  std::vector<HostLine> rows;
  std::vector<Status> unanswered;
  for (const auto& r : cloud::ListRentedHosts(providers, RentedHosts(), &unanswered))
    rows.push_back(MakeHostLine(r, now));
  // A provider that could not be asked may bill instances no row shows: the listing is incomplete.
  int rc = kExitOk;
  for (const Status& s : unanswered) rc = ReportError(s, /*json=*/false);
  if (as_json) {
    json out = json::array();
    for (const HostLine& row : rows) out.push_back(HostLineJson(row));
    std::cout << out.dump(2) << "\n";
    return rc;
  }
  std::printf("%-24s %-12s %-12s %8s %9s %9s\n", "NAME", "PROVIDER", "STATE", "$/HOUR", "UPTIME", "SPENT");
  for (const HostLine& row : rows) {
    std::printf("%-24s %-12s %-12s %8.2f %9s %9s%s\n", EscapeForTerminal(row.name).c_str(),
                EscapeForTerminal(row.provider).c_str(), EscapeForTerminal(row.state).c_str(),
                row.price_per_hour, Uptime(row.uptime_s * 1000).c_str(), cloud::FormatUsd(row.spent).c_str(),
                HostLineNote(row).c_str());
  }
  return rc;
}

}  // namespace

void RegisterCloudCommands(CLI::App& app, CommandContext& ctx) {
  auto oa = std::make_shared<OffersArgs>();
  auto* offers = app.add_subcommand("offers", "GPU instances that can be rented now, cheapest first");
  offers->add_option("--provider", oa->provider, "Only this provider (default: every one with an API key)");
  offers->add_option("--gpu", oa->gpu, "GPU model, e.g. H100 (a substring, any case)");
  offers->add_option("--count", oa->count, "GPUs per instance")->check(CLI::PositiveNumber);
  offers->add_option("--region", oa->region, "Only this region");
  offers->add_option("--max-price", oa->max_price, "At most this many dollars per hour")
      ->check(CLI::PositiveNumber);
  offers->add_flag("--json", oa->json, "Machine-readable output");
  offers->callback([oa, &ctx] { ctx.exit_code = Offers(*oa); });

  auto ua = std::make_shared<UpArgs>();
  auto* up =
      app.add_subcommand("up", "Rent a GPU host through a provider's API and set it up (prints its name)");
  AddRentFlags(up, &ua->rent, /*provider_required=*/true);
  up->add_flag(
      "--down-when-done", ua->down_when_done,
      "The host stops itself once its stop-when-done jobs ended (with --terminate-from-host on Lambda)");
  AddRemoteOptions(up, &ua->ro, "");
  up->remove_option(up->get_option("--host"));  // the host is the one rented
  up->callback([ua, &ctx] { ctx.exit_code = Up(*ua); });

  auto da = std::make_shared<DownArgs>();
  auto* down = app.add_subcommand(
      "down", "Terminate rented hosts (or --instance) and wait until the provider reports them gone");
  down->add_option("name", da->names, "Rented host names (`sftctl hosts`)");
  down->add_flag("--all", da->all, "Every rented host that is up");
  down->add_option("--provider", da->provider, "With --instance: the provider of an orphan");
  down->add_option("--instance", da->instance, "Terminate an instance the registry does not know (an orphan)")
      ->needs("--provider");
  down->add_flag("--force", da->force, "Terminate even a host whose jobs still run (they are lost)");
  down->add_flag("--json", da->json, "Errors as JSON");
  down->callback([da, &ctx] {
    if (da->names.empty() && !da->all && da->instance.empty()) {
      ctx.exit_code = ReportError(InvalidArgumentError("down: name a host, or --all"), da->json);
      return;
    }
    ctx.exit_code = Down(*da);
  });

  auto ha = std::make_shared<std::pair<std::string, bool>>();
  auto* hosts = app.add_subcommand("hosts",
                                   "Rented hosts: state, uptime, money spent; flags orphans (exit non-zero "
                                   "when a provider cannot be asked)");
  hosts->add_option("--provider", ha->first, "Only this provider (default: every one with an API key)");
  hosts->add_flag("--json", ha->second, "Machine-readable output");
  hosts->callback([ha, &ctx] { ctx.exit_code = Hosts(ha->first, ha->second); });
}

}  // namespace sftctl::client
