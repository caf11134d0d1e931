// Rental: the one policy of renting a host and giving it back, shared by `sftctl up`, `down`, `hosts`
// and `submit --provider` (docs/remote.md, "Renting a host").
//
// Up: the offers that match (cheapest first, none above --max-price), the user's SSH public key
// registered where the provider needs it, a launch that takes the next offer when one has no capacity,
// the record in RentedHosts the moment the provider accepted it (so it is never an orphan here), a
// wait for the provider's "running" and then for SSH (a progress line on `err`, one time limit for
// both), the host key recorded on first contact (strict known_hosts after), the host set up (bootstrap,
// or only the agent started with --no-bootstrap) with the agent's price, cost cap and stop policy, and
// the record marked "up". Anything that fails after the launch terminates the instance (unless
// keep_on_failure) and says so, so a failed `up` leaves nothing billing.
//
// Down: the record marked "terminating" (before the provider is asked: whatever happens after, the
// record says the host may still bill), the provider asked to terminate, then asked again until it
// reports the instance gone (or forgot it), within a time limit; then the record is "down" and keeps
// its price and times for cost reports.
//
// What the provider says is checked before it is used: its answers are depth-bounded JSON
// (provider_api.h), and an instance's address becomes an SSH target only when it is an IP literal or
// a host name the user's ssh config does not know (CheckProviderAddress).
//
// The seams (RentalSeams) are what touches the host: tests replace them, `sftctl` uses
// DefaultRentalSeams (real SSH, real bootstrap).
//
// Thread safety: none (one rental at a time per call); Down may run on another thread than Up's
// (submit's interrupt handler) as long as each uses its own CloudProvider.
#pragma once

#include <chrono>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "client/cloud/provider.h"
#include "client/remote/agent_connection.h"
#include "client/remote/rented_hosts.h"
#include "common/os/clock.h"
#include "common/status.h"

namespace sftctl::client::cloud {

struct UpOptions {
  std::string gpu;       // --gpu: matched as CloudProvider::ListOffers says
  int gpu_count = 0;     // --count; 0: any
  std::string region;    // --region; empty: any
  std::string name;      // --name; empty: "<provider>-<gpu>-<4 hex>"
  double max_price = 0;  // --max-price per hour; 0: no limit
  double max_cost = 0;   // --max-cost: the agent stops jobs and host past it (sftd --max-cost)
  // The host stops itself when its stop-when-done jobs ended (sftd --stop-action for the provider);
  // with terminate_from_host it terminates itself through the provider's API.
  bool down_when_done = false;
  // --terminate-from-host: the user allows sending the API key to the host (the agent's 0600
  // environment file, never argv) so the host terminates itself even when this laptop is gone.
  bool terminate_from_host = false;
  bool bootstrap = true;                // false: the image has sftd; only start the agent
  bool keep_on_failure = false;         // leave the instance running when `up` fails after the launch
  std::string identity_file;            // -i: the private key; its ".pub" is registered
  std::vector<std::string> agent_args;  // --agent-arg: more `sftd start` flags
  ConnectOptions connect;  // sftd / agent data dir / transport for the new host (host is set here)
  std::chrono::seconds wait_limit{900};  // launch accepted -> SSH answers
  std::chrono::seconds poll{5};
};

// What touches the new host (tests inject). `ready` connects once (SSH handshake and login; records
// the host key when opts.accept_new_host_key); UNAVAILABLE-class errors mean "not yet". `setup`
// installs / starts the agent with `agent_args` (sftd start flags). `set_agent_env` puts "NAME=value"
// lines (values shell-quoted) into the agent's environment file on the host (HostAgentEnvFile:
// lines of the same names replaced, mode 0600, sent through stdin: never on a command line).
struct RentalSeams {
  std::function<Status(const ConnectOptions&)> ready;
  std::function<Status(const ConnectOptions&, bool bootstrap, const std::vector<std::string>& agent_args)>
      setup;
  std::function<Status(const ConnectOptions&, const std::vector<std::string>& lines)> set_agent_env;
};
RentalSeams DefaultRentalSeams();

// "lambda-h100-3f2a": the profile, the GPU asked for (letters and digits only), 4 random hex digits;
// the profile's name cut short where the whole would pass CheckRentedHostName's 63 characters.
std::string DefaultHostName(const std::string& provider, const std::string& gpu);

// The name of the n-th host (n >= 2) of a run that began on the host `first` (--replace-lost):
// "<first>-<n>", with `first` cut short so that the name stays within 63 characters, and never `first`
// itself. Valid (CheckRentedHostName) whenever `first` is.
std::string ReplacementHostName(const std::string& first, int n);

// Whether a replacement for the lost host `lost` may be rented, once giving it back ended with
// `given_back`: only when that worked, as a host that may still bill is not doubled. Else
// FAILED_PRECONDITION naming the host, the give-back's error and `sftctl down <lost>`.
Status CheckReplaceable(const std::string& lost, const Status& given_back);

// Whether `addr`, the address a provider gave for an instance of profile `provider`, may become an SSH
// target (ConnectOptions::host, a known_hosts name): an IPv4 or IPv6 literal, or a host name (letters,
// digits, '.', '-') that the ssh config (`ssh_config_file`, else ~/.ssh/config; a missing file is none)
// does not pick out: a name a Host or Match block applies to, and that a name of nowhere would not get
// the same from, is the user's alias (`prod`) and would set up one of the user's own machines.
// DATA_LOSS naming the profile and the address otherwise; the config's own errors as LookupSshConfig's.
Status CheckProviderAddress(const std::string& provider, const std::string& addr,
                            const std::string& ssh_config_file);

// "$2.49": how renting prints dollars (`up`, `down`, `hosts`).
std::string FormatUsd(double usd);

// Offers matching `o` (region, max price), cheapest first (then more GPU memory, then name).
std::vector<Offer> RankOffers(std::vector<Offer> offers, const UpOptions& o);

// The OpenSSH public key line for identity_file (its ".pub"), else the first of ~/.ssh/id_ed25519.pub,
// id_ecdsa.pub, id_rsa.pub. NOT_FOUND saying how to make one.
StatusOr<std::string> ReadPublicKey(const std::string& identity_file);

// Rents, waits, sets up and records a host (see above). Returns the record ("up").
// Errors: NOT_FOUND (no matching offer, naming what was asked), RESOURCE_EXHAUSTED (every matching
// offer refused for capacity), DEADLINE_EXCEEDED (not reachable within wait_limit), the provider's
// and the setup's errors; each says whether the instance was terminated.
StatusOr<RentedHost> Up(CloudProvider* provider, const RentedHosts& registry, const UpOptions& o,
                        const RentalSeams& seams, const Clock* clock, std::ostream& err);

// Asks the provider to terminate instance `id` and waits (up to `limit`, asking every `poll`) until it
// reports it gone or no longer knows it (preempted and removed: as good as gone); progress lines on
// `err` call it `name` (the rented host's; "" for an instance no record names: "instance <id>"). The
// one wait of `down NAME` (Down) and `down --provider P --instance ID`. Errors: the provider's (the
// instance's answer unreadable: DATA_LOSS), DEADLINE_EXCEEDED after `limit`.
Status TerminateAndWait(CloudProvider* provider, const std::string& id, const std::string& name,
                        const Clock* clock, std::ostream& err,
                        std::chrono::seconds limit = std::chrono::seconds(300),
                        std::chrono::seconds poll = std::chrono::seconds(3));

// Marks `host`'s record "terminating", then TerminateAndWait; then marks it "down" with its end time.
// A record already "down" is OK at once. On an error the record stays "terminating" (live: `down`
// finishes it).
Status Down(CloudProvider* provider, const RentedHosts& registry, RentedHost host, const Clock* clock,
            std::ostream& err, std::chrono::seconds limit = std::chrono::seconds(300),
            std::chrono::seconds poll = std::chrono::seconds(3));

// Whether the provider says `h`'s instance is gone or going (terminating, terminated, preempted,
// stopped, broken, or no longer known to it): then why, in words (the provider's, unescaped); nullopt
// while it is starting or running. Errors: the provider could not be asked.
StatusOr<std::optional<std::string>> GoneBecause(CloudProvider* provider, const RentedHost& h);

// What to do about a rented host this machine lost the connection to, given what the provider says of
// it (`gone`: GoneBecause's answer), how many replacements were rented already, --replace-lost, and
// whether its job can be followed again (it was submitted, and the tries are not used up):
//   * the provider reports it gone: kReplace while replacements are left, else kGiveBack;
//   * it reports it running, or cannot be asked (this machine may be the one offline): kFollowAgain
//     when the job can be followed again (the connection, not the host, failed), else kGiveBack.
// `why` says which, for the user (holding the provider's words: escape it for a terminal).
enum class LostHostAction { kFollowAgain, kReplace, kGiveBack };
struct LostHostVerdict {
  LostHostAction action = LostHostAction::kGiveBack;
  std::string why;
};
LostHostVerdict DecideOnLostHost(const RentedHost& host, const StatusOr<std::optional<std::string>>& gone,
                                 int replaced, int allowed, bool can_follow_again);

// --max-cost across the hosts of one run (submit --replace-lost): the host rented first and its
// replacements share the one cap. Each lost host given back is charged what it cost (its record's
// RentedHost::SpentUsd: the price from launch to its end, or to `now_unix_ms` when the record has no end;
// nothing when its record cannot be read); the next replacement may cost what is left, and is rented only
// while at least a cent ($0.01) is left. Without a cap (max_cost 0) nothing is read or counted: every
// replacement is allowed, uncapped.
struct ReplacementCost {
  bool allowed = true;
  double max_cost = 0;  // the replacement's --max-cost: what is left of the cap; 0 without a cap
  // For the user, with a cap: "$1.20 of --max-cost $5.00 spent; the replacement may cost the rest", or
  // "...: no replacement"; empty without one.
  std::string why;
};
class RunCostCap {
 public:
  explicit RunCostCap(double max_cost) : max_cost_(max_cost) {}
  // Charges the lost host `name` (its record in `registry`) and says whether a replacement may follow.
  ReplacementCost ChargeLostHost(const RentedHosts& registry, const std::string& name, int64_t now_unix_ms);

 private:
  double max_cost_;
  double spent_ = 0;  // by the hosts charged so far
};

// One line of `sftctl hosts`: a registry record with what its provider says now, or an instance the
// provider bills that the registry does not know (orphan: only `instance` is set).
struct HostRow {
  std::optional<RentedHost> record;
  std::optional<Instance> instance;
  std::string provider;
  bool orphan = false;
  std::string error;  // the provider could not be asked (its status message)
};
// Every live record of the given providers plus their orphans; records of providers not given are
// listed without a live view. A provider that could not be asked (its listing failed) has its error
// on its records' rows, and in *unanswered (when given), one per provider: its orphans are unknown.
std::vector<HostRow> ListRentedHosts(const std::vector<CloudProvider*>& providers,
                                     const RentedHosts& registry, std::vector<Status>* unanswered = nullptr);

// The `sftd start` flags for a rented host: --price-per-hour, --billing-since, --max-cost, and the
// stop policy of down_when_done (--stop-action lambda|runpod when the host can terminate itself).
std::vector<std::string> AgentArgsFor(const RentedHost& host, const ProviderProfile& profile,
                                      const UpOptions& o);

// The agent's environment file on the host, as one word for the host's shell: what the bootstrap
// script and the systemd unit load into sftd's environment (docs/agent.md), and so where the stop
// action finds LAMBDA_API_KEY and LAMBDA_INSTANCE_ID (terminate_from_host).
std::string HostAgentEnvFile();

}  // namespace sftctl::client::cloud
