// The flags of renting a host, defined once for `sftctl up` and `submit --provider`, and the one
// function both use to rent (client/cloud/rental.h does the work).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/cloud/rental.h"
#include "client/remote/remote_options.h"
#include "common/mutex.h"

namespace sftctl::client {

struct RentFlags {
  std::string provider;  // --provider (a profile of client/cloud/provider_config.h)
  std::string gpu;
  int count = 0;
  std::string region, name;
  double max_price = 0, max_cost = 0;
  bool terminate_from_host = false;
  bool no_bootstrap = false;
  bool keep_on_failure = false;
  int64_t wait_s = 900;
  std::vector<std::string> agent_args;
};

// Adds --gpu, --count, --region, --name (`submit`: --host-name, as --name names the job), --max-price,
// --max-cost, --terminate-from-host,
// --no-bootstrap, --keep-on-failure, --wait, --agent-arg, and --provider (required on `up`, the switch to
// rent on `submit`).
void AddRentFlags(CLI::App* cmd, RentFlags* f, bool provider_required);

// Rents and sets up a host with `f` and the remote options (-i, --sftd, --agent-data-dir), progress
// on stderr. `down_when_done`: the agent stops (terminates, where it can) the host when its
// stop-when-done jobs ended.
StatusOr<RentedHost> RentHost(const RentFlags& f, const RemoteOptions& ro, bool down_when_done);

// Terminates a rented host through its provider and waits until it is gone (rental.h's Down).
Status ReturnHost(const RentedHost& host);

// Whether a host rented with `f` stops itself when its stop-when-done jobs end (the agent gets a stop
// action: RunPod's pods always, Lambda with --terminate-from-host).
StatusOr<bool> HostStopsItself(const RentFlags& f);

// While it lives, SIGINT, SIGTERM and SIGHUP give the rented host `name` back (if the registry has it
// live and launched after the guard began: terminate, wait until gone) and exit with 128 + the signal,
// instead of leaving it billing. Construct it before any other thread starts (the signals are blocked in this
// thread and so in every thread started after, and waited for on a thread of its own). Release() (or the
// destructor) ends that: signals act as before.
// Watch(name) moves it to another host (a replacement rented after the first was lost). Thread-safe.
class HostReturnGuard {
 public:
  explicit HostReturnGuard(std::string name);
  ~HostReturnGuard() { Release(); }
  HostReturnGuard(const HostReturnGuard&) = delete;
  HostReturnGuard& operator=(const HostReturnGuard&) = delete;
  void Watch(std::string name);
  void Release();

 private:
  std::string name() const;

  mutable Mutex mu_;
  std::string name_ GUARDED_BY(mu_);
  const int64_t since_ms_;  // hosts of that name launched before the guard are left alone
  std::thread waiter_;
};

// Whether the provider says `host` is gone (rental.h's GoneBecause): why, or nullopt while it runs.
StatusOr<std::optional<std::string>> RentedHostGone(const RentedHost& host);

}  // namespace sftctl::client
