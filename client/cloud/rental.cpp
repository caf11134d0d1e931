#include "client/cloud/rental.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>

#include "client/bootstrap/bootstrap.h"
#include "client/remote/remote_options.h"
#include "client/remote/ssh/remote_agent.h"
#include "client/remote/ssh/ssh_config.h"
#include "common/os/file_system.h"
#include "common/terminal_text.h"

namespace sftctl::client::cloud {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

namespace {

constexpr size_t kMaxHostName = 63;  // CheckRentedHostName's limit

// `base` cut short so that `base + suffix` fits kMaxHostName.
std::string FitHostName(const std::string& base, const std::string& suffix) {
  return base.substr(0, kMaxHostName > suffix.size() ? kMaxHostName - suffix.size() : 0) + suffix;
}

}  // namespace

std::string DefaultHostName(const std::string& provider, const std::string& gpu) {
  std::string g;
  for (char c : Lower(gpu)) {
    if (std::isalnum(static_cast<unsigned char>(c))) g += c;
  }
  return FitHostName(provider, "-" + (g.empty() ? "gpu" : g.substr(0, 16)) + "-" + RandomHex(2));
}

std::string ReplacementHostName(const std::string& first, int n) {
  const std::string suffix = "-" + std::to_string(n);
  std::string name = FitHostName(first, suffix);
  // A first name of 63 characters that ends as its replacement would ("...-2"): one character less.
  if (name == first) name = first.substr(0, kMaxHostName - suffix.size() - 1) + suffix;
  return name;
}

Status CheckReplaceable(const std::string& lost, const Status& given_back) {
  if (given_back.ok()) return OkStatus();
  return FailedPreconditionError("no replacement is rented while " + lost +
                                 " may still bill (giving it back failed: " + given_back.message() +
                                 "): `sftctl down " + lost + "` ends it");
}

namespace {

bool IsIpLiteral(const std::string& addr) {
  unsigned char buf[sizeof(struct in6_addr)];
  return ::inet_pton(AF_INET, addr.c_str(), buf) == 1 || ::inet_pton(AF_INET6, addr.c_str(), buf) == 1;
}

// What the ssh config says of `name`, with `name` itself written as %h (so a `Host *` block's
// "HostName %h.corp" reads the same for every name).
std::string WhatConfigSays(const ssh::SshConfigEntry& e, const std::string& name) {
  auto generic = [&](std::string v) {
    for (size_t at = v.find(name); !name.empty() && at != std::string::npos; at = v.find(name, at + 2))
      v.replace(at, name.size(), "%h");
    return v;
  };
  std::string s = generic(e.hostname.empty() ? name : e.hostname) + "\n" + e.user + "\n" +
                  (e.port ? std::to_string(*e.port) : "") + "\n" + (e.proxy_set ? "proxy " : "") +
                  generic(e.proxy_command) + "\n";
  for (const auto& f : e.identity_files) s += generic(f) + "\n";
  for (const auto& j : e.proxy_jump)
    s += j.user + "@" + j.host + ":" + std::to_string(j.port.value_or(22)) + "\n";
  return s;
}

}  // namespace

Status CheckProviderAddress(const std::string& provider, const std::string& addr,
                            const std::string& ssh_config_file) {
  bool ok = !addr.empty() && addr.size() <= 253 && addr[0] != '-';
  for (char c : addr)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':');
  if (!ok) {
    return DataLossError(provider + ": the instance's address '" + EscapeForTerminal(addr) +
                         "' is not a host name");
  }
  if (IsIpLiteral(addr)) return OkStatus();
  if (addr.find(':') != std::string::npos) {
    return DataLossError(provider + ": the instance's address '" + EscapeForTerminal(addr) +
                         "' is neither an IP address nor a host name");
  }
  const char* home_env = std::getenv("HOME");
  const std::string home = home_env != nullptr ? home_env : "";
  const std::string config =
      ssh_config_file.empty() ? home + "/.ssh/config" : ssh::ExpandTilde(ssh_config_file, home);
  FileSystem* fs = FileSystem::Default();
  if (!fs->Exists(config)) return OkStatus();
  SFT_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(config));
  // A name the config picks out (a Host or Match block that a name of nowhere does not get) is the
  // user's own alias: connecting to it would set up one of the user's machines as the rented host.
  const std::string nowhere = "sftctl-no-such-host.invalid";
  SFT_ASSIGN_OR_RETURN(ssh::SshConfigEntry named, ssh::LookupSshConfig(text, addr, home, config));
  SFT_ASSIGN_OR_RETURN(ssh::SshConfigEntry other, ssh::LookupSshConfig(text, nowhere, home, config));
  if (WhatConfigSays(named, addr) == WhatConfigSays(other, nowhere)) return OkStatus();
  return DataLossError(provider + ": the instance's address '" + EscapeForTerminal(addr) + "' is a name " +
                       config + " knows (a Host or Match block picks it out): refused, as it would reach " +
                       "a host of yours, not the rented one");
}

namespace {

bool NotYet(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded ||
         s.code() == StatusCode::kUnauthenticated;  // sshd up before the key is installed
}

// Launches the first offer with capacity; *chosen is the one that took.
StatusOr<std::string> LaunchFirst(CloudProvider* p, const std::vector<Offer>& offers, const std::string& name,
                                  const std::string& key_name, const std::string& public_key, Offer* chosen,
                                  std::ostream& err) {
  Status last;
  for (const Offer& offer : offers) {
    err << "up: renting " << EscapeForTerminal(offer.instance_type)
        << (offer.region.empty() ? "" : " in " + EscapeForTerminal(offer.region)) << " at "
        << FormatUsd(offer.price_per_hour) << "/h\n";
    auto id = p->Launch(LaunchRequest{offer, name, key_name, public_key});
    if (id.ok()) {
      *chosen = offer;
      return id;
    }
    if (id.status().code() != StatusCode::kResourceExhausted) return id.status();
    err << "up: no capacity (" << EscapeForTerminal(id.status().message()) << "); trying the next offer\n";
    last = id.status();
  }
  return ResourceExhaustedError(p->profile().name +
                                ": every matching offer is out of capacity (last: " + last.message() + ")");
}

// Polls the provider until the instance runs with an address, then SSH until it answers.
StatusOr<Instance> WaitUntilReachable(CloudProvider* p, const std::string& id, const UpOptions& o,
                                      const RentalSeams& seams, ConnectOptions* opts, const Clock* clock,
                                      std::ostream& err) {
  const auto start = clock->Now();
  const auto deadline = start + o.wait_limit;
  std::string last = "the provider";
  while (true) {
    const int64_t waited = std::chrono::duration_cast<std::chrono::seconds>(clock->Now() - start).count();
    auto inst = p->GetInstance(id);
    if (inst.ok() &&
        (inst->state == InstanceState::kTerminated || inst->state == InstanceState::kUnhealthy)) {
      return FailedPreconditionError(p->profile().name + ": instance " + id + " is " + inst->status +
                                     " before it became reachable");
    }
    if (inst.ok() && inst->state == InstanceState::kRunning && !inst->ssh_host.empty()) {
      SFT_RETURN_IF_ERROR(CheckProviderAddress(p->profile().name, inst->ssh_host, opts->ssh_config_file));
      if (p->profile().ssh_port > 0) inst->ssh_port = p->profile().ssh_port;
      if (!p->profile().ssh_user.empty()) inst->ssh_user = p->profile().ssh_user;
      RentedHost probe;
      probe.ssh_user = inst->ssh_user, probe.ssh_host = inst->ssh_host, probe.ssh_port = inst->ssh_port;
      opts->host = probe.SshTarget();
      Status ssh = seams.ready(*opts);
      if (ssh.ok()) return inst;
      if (!NotYet(ssh)) return ssh;
      last = "SSH on " + opts->host + " (" + ssh.message() + ")";
    } else if (inst.ok()) {
      last = "the instance (" + EscapeForTerminal(inst->status) + ")";
    } else if (inst.status().code() != StatusCode::kNotFound && !NotYet(inst.status())) {
      return inst.status();  // eventual consistency: a new instance may be unknown for a moment
    }
    err << "up: waiting for " << last << ", " << waited << " s\n";
    if (clock->Now() + o.poll > deadline) {
      return DeadlineExceededError(p->profile().name + ": instance " + id + " was not reachable within " +
                                   std::to_string(o.wait_limit.count()) + " s (last: " + last + ")");
    }
    clock->SleepFor(o.poll);
  }
}

// What follows a failure after the launch: terminate (unless kept), mark the record, and say so.
Status AfterFailure(CloudProvider* p, const RentedHosts& registry, RentedHost h, const UpOptions& o,
                    const Status& why, const Clock* clock, std::ostream& err) {
  std::string what;
  if (o.keep_on_failure) {
    what = "; the instance keeps running (--keep-on-failure): `sftctl down " + h.name + "` ends it";
  } else {
    Status down = Down(p, registry, h, clock, err, std::chrono::seconds(300), o.poll);
    what = down.ok() ? "; the instance was terminated"
                     : "; terminating the instance failed too (" + down.message() + "): run `sftctl down " +
                           h.name + "`";
  }
  if (o.keep_on_failure) {
    h.state = "failed";
    (void)registry.Put(h);
  }
  return Status(why.code(), why.message() + what);
}

}  // namespace

std::string FormatUsd(double usd) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "$%.2f", usd);
  return buf;
}

std::vector<Offer> RankOffers(std::vector<Offer> offers, const UpOptions& o) {
  offers.erase(std::remove_if(offers.begin(), offers.end(),
                              [&](const Offer& f) {
                                return (!o.region.empty() && f.region != o.region) ||
                                       (o.max_price > 0 && f.price_per_hour > o.max_price) ||
                                       f.price_per_hour <= 0;
                              }),
               offers.end());
  std::stable_sort(offers.begin(), offers.end(), [](const Offer& a, const Offer& b) {
    if (a.price_per_hour != b.price_per_hour) return a.price_per_hour < b.price_per_hour;
    if (a.gpu_memory_gib != b.gpu_memory_gib) return a.gpu_memory_gib > b.gpu_memory_gib;
    return a.instance_type + a.region < b.instance_type + b.region;
  });
  return offers;
}

StatusOr<std::string> ReadPublicKey(const std::string& identity_file) {
  std::vector<std::string> candidates;
  const char* home = std::getenv("HOME");
  const std::string ssh = std::string(home ? home : "") + "/.ssh/";
  if (!identity_file.empty()) {
    std::string f = identity_file;
    if (f.rfind("~/", 0) == 0) f = std::string(home ? home : "") + f.substr(1);
    candidates.push_back(f + ".pub");
  } else {
    candidates = {ssh + "id_ed25519.pub", ssh + "id_ecdsa.pub", ssh + "id_rsa.pub"};
  }
  FileSystem* fs = FileSystem::Default();
  for (const auto& c : candidates) {
    if (!fs->Exists(c)) continue;
    SFT_ASSIGN_OR_RETURN(std::string text, fs->ReadFile(c));
    std::string line = text.substr(0, text.find('\n'));
    if (line.rfind("ssh-", 0) == 0 || line.rfind("ecdsa-", 0) == 0) return line;
    return InvalidArgumentError(c + ": not an OpenSSH public key line");
  }
  return NotFoundError(
      "no SSH public key (" + candidates.front() +
      "): make one with `ssh-keygen -t ed25519`, or name one with -i KEY (its KEY.pub is used)");
}

std::string HostAgentEnvFile() { return "\"${XDG_CONFIG_HOME:-$HOME/.config}/sftd/env\""; }

std::vector<std::string> AgentArgsFor(const RentedHost& host, const ProviderProfile& profile,
                                      const UpOptions& o) {
  std::vector<std::string> args;
  char price[32];
  std::snprintf(price, sizeof price, "%.4f", host.price_per_hour);
  if (host.price_per_hour > 0) args.insert(args.end(), {"--price-per-hour", price});
  if (host.launched_unix_ms > 0) {
    args.insert(args.end(), {"--billing-since", std::to_string(host.launched_unix_ms / 1000)});
  }
  if (o.max_cost > 0) {
    char cap[32];
    std::snprintf(cap, sizeof cap, "%.2f", o.max_cost);
    args.insert(args.end(), {"--max-cost", cap});
  }
  args.insert(args.end(), o.agent_args.begin(), o.agent_args.end());
  if (o.down_when_done || o.max_cost > 0) {
    // RunPod images carry the pod's own id and key (runpodctl); Lambda needs the key we send.
    if (profile.type == "runpod") args.insert(args.end(), {"--stop-action", "runpod-terminate"});
    if (profile.type == "lambda" && o.terminate_from_host)
      args.insert(args.end(), {"--stop-action", "lambda"});
  }
  return args;
}

StatusOr<RentedHost> Up(CloudProvider* p, const RentedHosts& registry, const UpOptions& o,
                        const RentalSeams& seams, const Clock* clock, std::ostream& err) {
  const ProviderProfile& profile = p->profile();
  const std::string name = o.name.empty() ? DefaultHostName(profile.name, o.gpu) : o.name;
  SFT_RETURN_IF_ERROR(CheckRentedHostName(name));
  if (auto existing = registry.Get(name); existing.ok() && existing->Live()) {
    return AlreadyExistsError("a rented host '" + name + "' is already " + existing->state +
                              " (`sftctl down " + name + "` first, or --name another)");
  }
  SFT_ASSIGN_OR_RETURN(std::vector<Offer> all, p->ListOffers(o.gpu, o.gpu_count));
  std::vector<Offer> offers = RankOffers(all, o);
  if (offers.empty()) {
    return NotFoundError(profile.name + ": no offer with capacity for " +
                         (o.gpu.empty() ? "any GPU" : o.gpu) +
                         (o.gpu_count > 0 ? " x" + std::to_string(o.gpu_count) : "") +
                         (o.region.empty() ? "" : " in " + o.region) +
                         (o.max_price > 0 ? " at most " + FormatUsd(o.max_price) + "/h" : "") + " (" +
                         std::to_string(all.size()) + " offers before region and price)");
  }
  SFT_ASSIGN_OR_RETURN(std::string public_key, ReadPublicKey(o.identity_file));
  SFT_ASSIGN_OR_RETURN(std::string key_name, p->EnsureSshKey(public_key));
  Offer chosen;
  SFT_ASSIGN_OR_RETURN(std::string id, LaunchFirst(p, offers, name, key_name, public_key, &chosen, err));

  RentedHost h;
  h.name = name, h.provider = profile.name, h.instance_id = id;
  h.instance_type = chosen.instance_type, h.region = chosen.region, h.gpu = chosen.gpu;
  h.gpu_count = chosen.gpu_count, h.price_per_hour = chosen.price_per_hour;
  h.launched_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  h.identity_file = o.identity_file, h.max_cost = o.max_cost, h.down_when_done = o.down_when_done;
  h.sftd = o.connect.sftd, h.agent_data_dir = o.connect.agent_data_dir;
  h.known_hosts = registry.KnownHostsFor(name);
  // A new host of an old name starts with no key known (CreateDirs: SSH writes the file there).
  (void)FileSystem::Default()->RemoveAll(h.known_hosts);
  SFT_RETURN_IF_ERROR(
      FileSystem::Default()->CreateDirs(std::filesystem::path(h.known_hosts).parent_path().string()));
  SFT_RETURN_IF_ERROR(registry.Put(h));  // from here on, the instance is ours: never an orphan
  err << "up: " << name << " is instance " << EscapeForTerminal(id) << " (" << FormatUsd(h.price_per_hour)
      << "/h from now)\n";

  ConnectOptions opts = o.connect;
  opts.identity_file = o.identity_file;
  opts.known_hosts_file = h.known_hosts;
  opts.accept_new_host_key = true;  // first contact records the key; later commands check it strictly
  auto inst = WaitUntilReachable(p, id, o, seams, &opts, clock, err);
  if (!inst.ok()) return AfterFailure(p, registry, h, o, inst.status(), clock, err);
  h.ssh_user = inst->ssh_user, h.ssh_host = inst->ssh_host, h.ssh_port = inst->ssh_port;
  SFT_RETURN_IF_ERROR(registry.Put(h));

  opts.accept_new_host_key = false;
  if (o.terminate_from_host && profile.type == "lambda") {
    // What the agent's "lambda" stop action reads from its environment (agent/stopping/stop_policy.h).
    Status sent = seams.set_agent_env(
        opts, {"LAMBDA_API_KEY=" + ShellQuote(profile.api_key), "LAMBDA_INSTANCE_ID=" + ShellQuote(id),
               "LAMBDA_API_URL=" + ShellQuote(profile.api_url)});
    if (!sent.ok()) return AfterFailure(p, registry, h, o, sent, clock, err);
  }
  err << "up: setting up " << name << " (" << (o.bootstrap ? "bootstrap" : "starting the agent") << ")\n";
  Status setup = seams.setup(opts, o.bootstrap, AgentArgsFor(h, profile, o));
  if (!setup.ok()) return AfterFailure(p, registry, h, o, setup, clock, err);
  h.state = "up";
  SFT_RETURN_IF_ERROR(registry.Put(h));
  return h;
}

Status TerminateAndWait(CloudProvider* p, const std::string& id, const std::string& name, const Clock* clock,
                        std::ostream& err, std::chrono::seconds limit, std::chrono::seconds poll) {
  const std::string label = name.empty() ? "instance " + EscapeForTerminal(id) : name;
  // An instance the provider removed already (preempted, terminated by hand) is as good as ended.
  if (Status t = p->Terminate(id); !t.ok() && t.code() != StatusCode::kNotFound) return t;
  const auto deadline = clock->Now() + limit;
  while (true) {
    auto inst = p->GetInstance(id);
    if ((inst.ok() && inst->state == InstanceState::kTerminated) ||
        (!inst.ok() && inst.status().code() == StatusCode::kNotFound)) {
      return OkStatus();
    }
    if (!inst.ok() && !NotYet(inst.status())) return inst.status();
    err << "down: waiting for " << label << " to go ("
        << (inst.ok() ? EscapeForTerminal(inst->status) : inst.status().message()) << ")\n";
    if (clock->Now() + poll > deadline) {
      return DeadlineExceededError(p->profile().name + ": instance " + id +
                                   (name.empty() ? "" : " (" + name + ")") + " still not gone " +
                                   std::to_string(limit.count()) +
                                   " s after terminating it; check the provider's console");
    }
    clock->SleepFor(poll);
  }
}

Status Down(CloudProvider* p, const RentedHosts& registry, RentedHost h, const Clock* clock,
            std::ostream& err, std::chrono::seconds limit, std::chrono::seconds poll) {
  if (h.state == "down") return OkStatus();
  // Recorded before the provider is asked, so whatever happens next (an error, a crash, a kill), the
  // record says the host may still bill and `down` / `hosts` find it again.
  h.state = "terminating";
  SFT_RETURN_IF_ERROR(registry.Put(h));
  SFT_RETURN_IF_ERROR(TerminateAndWait(p, h.instance_id, h.name, clock, err, limit, poll));
  h.state = "down";
  h.ended_unix_ms = NowUnixMs();
  if (!h.known_hosts.empty()) (void)FileSystem::Default()->RemoveAll(h.known_hosts);  // the key died with it
  return registry.Put(h);
}

StatusOr<std::optional<std::string>> GoneBecause(CloudProvider* p, const RentedHost& h) {
  auto inst = p->GetInstance(h.instance_id);
  if (!inst.ok() && inst.status().code() == StatusCode::kNotFound) {
    return std::optional<std::string>(p->profile().name + " no longer knows instance " + h.instance_id);
  }
  if (!inst.ok()) return inst.status();
  switch (inst->state) {
    case InstanceState::kStopping:
    case InstanceState::kTerminated:
    case InstanceState::kUnhealthy:
      return std::optional<std::string>(p->profile().name + " reports instance " + h.instance_id + " " +
                                        inst->status);
    case InstanceState::kStarting:
    case InstanceState::kRunning:
    case InstanceState::kOther:
      break;
  }
  return std::optional<std::string>();
}

LostHostVerdict DecideOnLostHost(const RentedHost& host, const StatusOr<std::optional<std::string>>& gone,
                                 int replaced, int allowed, bool can_follow_again) {
  if (!gone.ok() || !*gone) {
    const std::string seen = !gone.ok() ? "cannot ask " + host.provider + " about " + host.name + " (" +
                                              gone.status().message() + ")"
                                        : host.provider + " still reports " + host.name + " running";
    if (can_follow_again) return {LostHostAction::kFollowAgain, seen + "; following its job again"};
    return {LostHostAction::kGiveBack, seen + ", but it stayed out of reach; giving it back"};
  }
  const std::string lost = "lost " + host.name + ": " + **gone;
  if (replaced < allowed) return {LostHostAction::kReplace, lost};
  return {LostHostAction::kGiveBack,
          lost + (allowed == 0 ? "" : "; --replace-lost " + std::to_string(allowed) + " used up")};
}

ReplacementCost RunCostCap::ChargeLostHost(const RentedHosts& registry, const std::string& name,
                                           int64_t now_unix_ms) {
  ReplacementCost cost;
  if (max_cost_ <= 0) return cost;
  auto ended = registry.Get(name);
  spent_ += ended.ok() ? ended->SpentUsd(now_unix_ms) : 0;
  cost.max_cost = max_cost_ - spent_;
  cost.allowed = cost.max_cost >= 0.01;
  cost.why = FormatUsd(spent_) + " of --max-cost " + FormatUsd(max_cost_) + " spent" +
             (cost.allowed ? "; the replacement may cost the rest" : ": no replacement");
  return cost;
}

std::vector<HostRow> ListRentedHosts(const std::vector<CloudProvider*>& providers,
                                     const RentedHosts& registry, std::vector<Status>* unanswered) {
  std::vector<HostRow> rows;
  auto records = registry.Load();
  std::vector<RentedHost> live;
  if (records.ok()) {
    for (auto& r : *records) {
      if (r.Live()) live.push_back(r);
    }
  }
  for (CloudProvider* p : providers) {
    auto instances = p->ListInstances();
    if (!instances.ok() && unanswered != nullptr) unanswered->push_back(instances.status());
    for (const RentedHost& r : live) {
      if (r.provider != p->profile().name) continue;
      HostRow row{r, std::nullopt, r.provider, false, instances.ok() ? "" : instances.status().message()};
      if (instances.ok()) {
        for (const auto& i : *instances) {
          if (i.id == r.instance_id) row.instance = i;
        }
      }
      rows.push_back(std::move(row));
    }
    if (!instances.ok()) continue;
    for (const auto& i : *instances) {
      bool known = false;
      for (const auto& r : live) known = known || (r.provider == p->profile().name && r.instance_id == i.id);
      if (!known && i.state != InstanceState::kTerminated) {
        rows.push_back(HostRow{std::nullopt, i, p->profile().name, true, ""});
      }
    }
  }
  for (const RentedHost& r : live) {
    bool listed = false;
    for (const auto& row : rows) listed = listed || (row.record && row.record->name == r.name);
    if (!listed) rows.push_back(HostRow{r, std::nullopt, r.provider, false, "provider not configured here"});
  }
  return rows;
}

}  // namespace sftctl::client::cloud
