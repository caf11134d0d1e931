#include "client/remote/remote_options.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "client/remote/rented_hosts.h"
#include "common/terminal_text.h"

namespace sftctl::client {

void AddRemoteOptions(CLI::App* cmd, RemoteOptions* o, const std::string& host_help, bool multi_host) {
  // One value per --host, so `--host H SPEC` leaves SPEC to the positional argument.
  auto* host = cmd->add_option("--host", o->hosts, host_help)->allow_extra_args(false);
  if (!multi_host) host->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  cmd->add_option("-i,--identity", o->identity_file,
                  "SSH private key (default: ssh-agent, ssh config, ~/.ssh/id_*)");
  cmd->add_flag("--accept-new-host-key", o->accept_new_host_key,
                "Record an unknown SSH host key (like StrictHostKeyChecking=accept-new)");
  cmd->add_option("--transport", o->transport,
                  "auto (SSH port forwarding, else `sftd bridge`), forward or bridge")
      ->check(CLI::IsMember({"auto", "forward", "bridge"}));
  cmd->add_option("--sftd", o->sftd,
                  "Path of sftd on the host (default: sftd on PATH, then ~/.local/bin/sftd)");
  cmd->add_option("--agent-data-dir", o->agent_data_dir, "sftd --data-dir on the host (default: sftd's)");
  cmd->add_flag("--json", o->json, "Machine-readable output (JSON) for scripts");
}

StatusOr<Transport> ParseTransport(const std::string& name) {
  if (name == "auto" || name.empty()) return Transport::kAuto;
  if (name == "forward") return Transport::kForward;
  if (name == "bridge") return Transport::kBridge;
  return InvalidArgumentError("--transport '" + name + "': expected auto, forward or bridge");
}

const char* TransportName(Transport t) {
  switch (t) {
    case Transport::kForward:
      return "forward";
    case Transport::kBridge:
      return "bridge";
    default:
      return "auto";
  }
}

StatusOr<ConnectOptions> MakeConnectOptions(const RemoteOptions& o, const std::string& host) {
  ConnectOptions c;
  c.host = host;
  // A host rented with `sftctl up` is named by its registry name (client/remote/rented_hosts.h).
  std::optional<RentedHost> rented = RentedHosts().FindLive(host);
  if (rented) {
    c.host = rented->SshTarget();
    c.known_hosts_file = rented->known_hosts;
  }
  if (host.rfind("local:", 0) == 0 && host.size() > 6 && host[6] != '/') {
    // "local:<relative dir>": recorded absolute, so the registry names the same agent from anywhere.
    std::error_code ec;
    c.host = "local:" + std::filesystem::absolute(host.substr(6), ec).lexically_normal().string();
    while (c.host.size() > 7 && c.host.back() == '/') c.host.pop_back();
  }
  c.identity_file = o.identity_file.empty() && rented ? rented->identity_file : o.identity_file;
  if (!c.identity_file.empty() && c.identity_file[0] != '/' && c.identity_file[0] != '~') {
    // Recorded in the job registry: absolute, so later commands find it from any folder.
    std::error_code ec;
    c.identity_file = std::filesystem::absolute(c.identity_file, ec).lexically_normal().string();
  }
  c.accept_new_host_key = o.accept_new_host_key;
  c.sftd = o.sftd.empty() && rented ? rented->sftd : o.sftd;
  c.agent_data_dir = o.agent_data_dir.empty() && rented ? rented->agent_data_dir : o.agent_data_dir;
  auto t = ParseTransport(o.transport);
  if (!t.ok()) return t.status();
  c.transport = *t;
  return c;
}

int ExitCodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kOutOfRange:
      return kExitInput;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kUnauthenticated:
    case StatusCode::kPermissionDenied:
      return kExitUnreachable;
    default:
      return kExitAgent;
  }
}

int ReportError(const Status& s, bool json) {
  std::cerr << "error: " << EscapeForTerminal(s.message()) << std::endl;  // may quote the agent
  if (json) {
    nlohmann::json j = {{"error", {{"code", StatusCodeName(s.code())}, {"message", s.message()}}}};
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
  }
  return ExitCodeFor(s);
}

bool StderrIsTty() { return ::isatty(2) == 1; }

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  bool ok = false;
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ok = ::read(fd, raw.data(), bytes) == static_cast<ssize_t>(bytes);
    ::close(fd);
  }
  if (!ok) {
    std::random_device rd;
    for (auto& c : raw) c = static_cast<char>(rd());
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatTime(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace sftctl::client
