// RentedHosts: the hosts this user rented through a provider's API (`sftctl up`), so `submit --host
// NAME`, `status`, `hosts` and `down NAME` know them, and so `hosts` can tell the provider's
// instances that nobody here started (orphans) from ours.
//
// One JSON file, $XDG_CONFIG_HOME/sftctl/hosts.json (default ~/.config/sftctl/hosts.json):
//   {"version": 1, "hosts": [{"name": "lambda-h100-1a2b", "provider": "lambda", "instance_id": "...",
//     "instance_type": "gpu_1x_h100_pcie", "region": "us-east-1", "gpu": "H100 PCIe", "gpu_count": 1,
//     "price_per_hour": 2.49, "launched_unix_ms": ..., "ended_unix_ms": 0, "state": "up",
//     "ssh_user": "ubuntu", "ssh_host": "192.0.2.10", "ssh_port": 22, "identity_file": "",
//     "sftd": "", "agent_data_dir": "", "known_hosts": "~/.config/sftctl/known_hosts.d/lambda-h100-1a2b",
//     "max_cost": 25, "down_when_done": false}]}
// No API key, token or other secret is ever part of a record. A record is written the moment the
// provider accepted the launch (state "starting"), before anything else can fail, so an instance
// this sftctl started is never an orphan to it; and `down` writes "terminating" before it asks the
// provider, "down" once the provider reports it gone, so an interrupted `down` leaves a true record.
// The file is read with ParseJson (common/json_parse.h): one edited by hand nests at most 64 deep. Updates
// take an exclusive flock on hosts.json.lock, read, modify, and replace the file atomically, as jobs.json
// (job_registry.h).
//
// Host names: letters, digits, '.', '_' and '-', starting with a letter (at most 63); they never
// contain '@', ':' or '/', so a name cannot be mistaken for "user@host:port" or a job reference.
//
// Thread safety: a RentedHosts is a path; concurrent use from threads and processes is safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "client/remote/agent_connection.h"
#include "common/status.h"

namespace sftctl::client {

struct RentedHost {
  std::string name;
  std::string provider;  // the provider profile's name
  std::string instance_id;
  std::string instance_type, region, gpu;
  int gpu_count = 0;
  double price_per_hour = 0;
  int64_t launched_unix_ms = 0;
  int64_t ended_unix_ms = 0;  // when `down` saw it gone; 0 while it may bill
  // "starting" (launched, not ready), "up" (bootstrapped), "terminating" (`down` is asking the
  // provider to end it, or asked and did not see it gone: it may still bill), "failed" (up gave up
  // and kept it: --keep-on-failure), "down" (terminated, confirmed gone).
  std::string state = "starting";
  std::string ssh_user, ssh_host;
  int ssh_port = 22;
  std::string identity_file;
  std::string sftd, agent_data_dir;  // as given to `up` (--sftd, --agent-data-dir): later commands use them
  // This host's own known_hosts file (RentedHosts::KnownHostsFor): its key recorded at first contact
  // and checked strictly after, never mixed with ~/.ssh/known_hosts, where a provider's reused address
  // would hold another instance's key. Removed by `down`.
  std::string known_hosts;
  double max_cost = 0;  // --max-cost; 0: none
  bool down_when_done = false;

  // "user@host:port" (ConnectOptions::host; an IPv6 address in brackets: "root@[2001:db8::7]:22022",
  // "root@[2001:db8::7]"); "" until the provider gave an address.
  std::string SshTarget() const;
  // Hours billed so far (until ended_unix_ms, else `now_unix_ms`) x price_per_hour.
  double SpentUsd(int64_t now_unix_ms) const;
  // May still bill: "starting", "up" or "terminating".
  bool Live() const { return state == "starting" || state == "up" || state == "terminating"; }
};

// INVALID_ARGUMENT naming the name when it breaks the rule above.
Status CheckRentedHostName(const std::string& name);

class RentedHosts {
 public:
  // $XDG_CONFIG_HOME/sftctl/hosts.json, else $HOME/.config/sftctl/hosts.json.
  static std::string DefaultPath();

  explicit RentedHosts(std::string path = DefaultPath()) : path_(std::move(path)) {}
  const std::string& path() const { return path_; }

  // Every record, oldest first. A missing file is none. DATA_LOSS naming the file when it is not
  // this format; records with an unusable name are skipped.
  StatusOr<std::vector<RentedHost>> Load() const;
  // Adds or replaces (same name) one record. INVALID_ARGUMENT for a bad name.
  Status Put(const RentedHost& h) const;
  // The record called `name`; NOT_FOUND naming the registry file.
  StatusOr<RentedHost> Get(const std::string& name) const;
  // known_hosts.d/<name> beside the registry file: the known_hosts file of the host called `name`.
  std::string KnownHostsFor(const std::string& name) const;
  // The live record whose name or SSH target ("user@host:port", as the job registry records it) is
  // `host`, if there is one: what MakeConnectOptions uses to turn a rented
  // host's name into its SSH target and known_hosts file (and its key, sftd and data dir unless the
  // command names them). nullopt
  // for anything else (also when the file cannot be read).
  std::optional<RentedHost> FindLive(const std::string& host) const;
  // The newest record given back ("down") whose name or SSH target is `host`, when no live record
  // is: a host whose jobs went with it, which `list` and `status` need not try to reach. nullopt
  // otherwise (also when the file cannot be read).
  std::optional<RentedHost> FindGivenBack(const std::string& host) const;

 private:
  std::string path_;
};

}  // namespace sftctl::client
