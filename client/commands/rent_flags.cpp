#include "client/commands/rent_flags.h"

#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <iostream>

#include "client/cloud/provider_config.h"
#include "client/cloud/provider_factory.h"
#include "common/cli/duration_option.h"
#include "common/net/http_client.h"

namespace sftctl::client {

void AddRentFlags(CLI::App* cmd, RentFlags* f, bool provider_required) {
  // `submit` has --name already (the job's): there the host's name is --host-name.
  const std::string name_flag = provider_required ? "--name" : "--host-name";
  auto* provider =
      cmd->add_option("--provider", f->provider,
                      "Provider profile: lambda, runpod, or one of providers.json (docs/remote.md)");
  if (provider_required) provider->required();
  // On `submit` the other flags mean something only with --provider.
  auto add = [&](CLI::Option* o) { return provider_required ? o : o->needs(provider); };
  add(cmd->add_option("--gpu", f->gpu, "GPU model to rent, e.g. H100, A100 (a substring, any case)"));
  add(cmd->add_option("--count", f->count, "GPUs in the instance (default: any)")
          ->check(CLI::PositiveNumber));
  add(cmd->add_option("--region", f->region, "Only offers in this region"));
  add(cmd->add_option(name_flag, f->name, "Name of the rented host (default: <provider>-<gpu>-<hex>)"));
  add(cmd->add_option("--max-price", f->max_price, "Only offers at most this many dollars per hour")
          ->check(CLI::PositiveNumber));
  add(cmd->add_option("--max-cost", f->max_cost,
                      "Dollars the host may cost in all: past it the agent stops its jobs and the host")
          ->check(CLI::PositiveNumber));
  add(cmd->add_flag(
      "--terminate-from-host", f->terminate_from_host,
      "Send the provider API key to the host (a 0600 file) so it terminates itself when done or "
      "over --max-cost, even when this machine is gone"));
  add(cmd->add_flag("--no-bootstrap", f->no_bootstrap, "The image already has sftd: only start the agent"));
  add(cmd->add_flag("--keep-on-failure", f->keep_on_failure,
                    "Leave the instance running when setting it up fails"));
  add(cmd->add_option(
      "--agent-arg", f->agent_args,
      "One more `sftd start` flag for the host, e.g. --agent-arg=--stop-pull-timeout=10m (repeatable)"));
  add(cli::AddDurationOption(cmd, "--wait", cli::DurationUnit::kSeconds, &f->wait_s,
                             "Longest wait for the instance to answer SSH (default 15m)"));
}

StatusOr<RentedHost> RentHost(const RentFlags& f, const RemoteOptions& ro, bool down_when_done) {
  SFT_ASSIGN_OR_RETURN(cloud::ProviderProfile profile, cloud::FindProviderProfile(f.provider));
  SFT_ASSIGN_OR_RETURN(auto provider, cloud::NewProvider(profile, CurlHttpClient()));
  cloud::UpOptions o;
  o.gpu = f.gpu, o.gpu_count = f.count, o.region = f.region, o.name = f.name;
  o.max_price = f.max_price, o.max_cost = f.max_cost;
  o.down_when_done = down_when_done, o.terminate_from_host = f.terminate_from_host;
  o.bootstrap = !f.no_bootstrap, o.keep_on_failure = f.keep_on_failure;
  o.wait_limit = std::chrono::seconds(f.wait_s);
  o.agent_args = f.agent_args;
  SFT_ASSIGN_OR_RETURN(o.connect, MakeConnectOptions(ro, ""));
  o.identity_file = o.connect.identity_file;
  return cloud::Up(provider.get(), RentedHosts(), o, cloud::DefaultRentalSeams(), Clock::Real(), std::cerr);
}

Status ReturnHost(const RentedHost& host) {
  SFT_ASSIGN_OR_RETURN(cloud::ProviderProfile profile, cloud::FindProviderProfile(host.provider));
  SFT_ASSIGN_OR_RETURN(auto provider, cloud::NewProvider(profile, CurlHttpClient()));
  return cloud::Down(provider.get(), RentedHosts(), host, Clock::Real(), std::cerr);
}

StatusOr<std::optional<std::string>> RentedHostGone(const RentedHost& host) {
  SFT_ASSIGN_OR_RETURN(cloud::ProviderProfile profile, cloud::FindProviderProfile(host.provider));
  SFT_ASSIGN_OR_RETURN(auto provider, cloud::NewProvider(profile, CurlHttpClient()));
  return cloud::GoneBecause(provider.get(), host);
}

StatusOr<bool> HostStopsItself(const RentFlags& f) {
  SFT_ASSIGN_OR_RETURN(cloud::ProviderProfile profile, cloud::FindProviderProfile(f.provider));
  return profile.type == "runpod" || (profile.type == "lambda" && f.terminate_from_host);
}

namespace {

sigset_t GuardedSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR2}) sigaddset(&set, sig);
  return set;
}

}  // namespace

HostReturnGuard::HostReturnGuard(std::string name) : name_(std::move(name)), since_ms_(NowUnixMs()) {
  sigset_t set = GuardedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  waiter_ = std::thread([this, set] {
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    if (sig == SIGUSR2) return;  // Release()
    const std::string name = this->name();
    std::cerr << "\n" << (sig == SIGINT ? "interrupted" : "signalled") << ": giving " << name << " back\n";
    auto host = RentedHosts().Get(name);
    // Only a host this process launched: an older one of the same name is not ours to end.
    if (host.ok() && host->Live() && host->launched_unix_ms >= since_ms_) {
      Status s = ReturnHost(*host);
      if (!s.ok()) std::cerr << "error: " << s.message() << " (`sftctl down " << name << "` ends it)\n";
    }
    std::_Exit(128 + sig);
  });
}

void HostReturnGuard::Watch(std::string name) {
  MutexLock l(&mu_);
  name_ = std::move(name);
}

std::string HostReturnGuard::name() const {
  MutexLock l(&mu_);
  return name_;
}

void HostReturnGuard::Release() {
  if (!waiter_.joinable()) return;
  pthread_kill(waiter_.native_handle(), SIGUSR2);
  waiter_.join();
  sigset_t set = GuardedSignals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

}  // namespace sftctl::client
