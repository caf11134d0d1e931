#include "client/remote/local_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "client/local/trainer_exec.h"
#include "client/remote/ssh/agent_identity_check.h"
#include "common/json_parse.h"
#include "common/os/fd_util.h"
#include "common/os/file_system.h"
#include "common/rpc_limits.h"

extern char** environ;

namespace sftctl::client {
namespace {

struct Captured {
  int exit_code = -1;
  std::string out, err;
};

// Runs `path args...` with stdin from /dev/null and captures stdout and stderr until both close
// (a detached sftd closes the descriptors it inherited) and the child exits.
StatusOr<Captured> RunCapture(const std::string& path, const std::vector<std::string>& args) {
  int out[2], err[2];
  if (Status s = MakePipe(out); !s.ok()) return s.WithContext("running '" + path + "'");
  if (Status s = MakePipe(err); !s.ok()) {
    ::close(out[0]);
    ::close(out[1]);
    return s.WithContext("running '" + path + "'");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, path.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return ErrnoError("cannot run", path, rc);
  }
  Captured c;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* sinks[2] = {&c.out, &c.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return c;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

class LocalConnection : public AgentConnection {
 public:
  LocalConnection(std::shared_ptr<grpc::Channel> channel, std::string token, std::string host,
                  std::string data_dir)
      : channel_(std::move(channel)),
        token_(std::move(token)),
        host_(std::move(host)),
        data_dir_(std::move(data_dir)) {}
  std::shared_ptr<grpc::Channel> channel() const override { return channel_; }
  const std::string& token() const override { return token_; }
  std::string description() const override { return "local agent (" + data_dir_ + ")"; }
  const std::string& host() const override { return host_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::string token_, host_, data_dir_;
};

// The running agent's `sftd status --json` object (addr, token_file, data_dir), or, when none runs
// and `start` is set, the SFTD_READY object of the one `sftd start --detach` started. `data_dir` ""
// means sftd's default; `host` names the agent in messages.
StatusOr<nlohmann::json> LocalAgentInfo(const std::string& sftd, const std::string& data_dir,
                                        const std::string& host, bool start) {
  std::vector<std::string> dd;
  if (!data_dir.empty()) dd = {"--data-dir", data_dir};
  // `sftd status --json` exits 0 with addr and token_file, 3 when not running.
  std::vector<std::string> args = {"status", "--json"};
  args.insert(args.end(), dd.begin(), dd.end());
  SFT_ASSIGN_OR_RETURN(Captured st, RunCapture(sftd, args));
  if (st.exit_code == 0) {
    StatusOr<nlohmann::json> info = ParseJson(Trim(st.out), "`sftd status --json`");
    if (!info.ok()) {
      return UnavailableError(host + ": `sftd status --json` printed no JSON: " + Trim(st.out + st.err));
    }
    return info;
  }
  if (st.exit_code != 3) {
    return UnavailableError(host + ": `" + sftd + " status` failed (exit " + std::to_string(st.exit_code) +
                            "): " + Trim(st.err + st.out));
  }
  if (!start) {
    return UnavailableError(host + ": no agent is running" +
                            (data_dir.empty() ? std::string() : " for data dir " + data_dir));
  }
  args = {"start", "--detach"};
  args.insert(args.end(), dd.begin(), dd.end());
  SFT_ASSIGN_OR_RETURN(Captured started, RunCapture(sftd, args));
  const size_t at = started.out.find("SFTD_READY ");
  if (started.exit_code != 0 || at == std::string::npos) {
    return UnavailableError(host + ": cannot start the agent (`sftd start --detach`, exit " +
                            std::to_string(started.exit_code) + "): " + Trim(started.err + started.out));
  }
  std::string line = started.out.substr(at + 11);
  line = line.substr(0, line.find('\n'));
  StatusOr<nlohmann::json> info = ParseJson(line, "SFTD_READY");
  if (!info.ok()) return UnavailableError(host + ": unreadable SFTD_READY line: " + line);
  return info;
}

// The agent answers Version() within the connect timeout and speaks this client's protocol.
Status CheckLocalAgentVersion(const AgentConnection& conn, const std::string& addr, const std::string& host,
                              int timeout_s) {
  auto stub = conn.NewStub();
  grpc::ClientContext ctx;
  conn.Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
  ctx.set_wait_for_ready(true);
  v1::VersionResponse version;
  grpc::Status s = stub->Version(&ctx, v1::VersionRequest(), &version);
  if (!s.ok()) {
    return Status(static_cast<StatusCode>(s.error_code()),
                  host + ": the agent at " + addr + " does not answer Version(): " + s.error_message());
  }
  if (version.protocol() != 1) {
    return FailedPreconditionError(host + ": the agent speaks protocol " +
                                   std::to_string(version.protocol()) +
                                   ", this sftctl speaks 1 (install matching versions)");
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<AgentConnection>> ConnectLocalAgent(const ConnectOptions& opts) {
  // "local:<dir>" names the data dir; "local"/"localhost" use --agent-data-dir or sftd's default.
  std::string data_dir = opts.agent_data_dir;
  std::string host = opts.host;
  if (opts.host.rfind("local:", 0) == 0) {
    data_dir = opts.host.substr(6);
    if (data_dir.empty()) return InvalidArgumentError("host 'local:': give a data dir, e.g. local:/tmp/sftd");
    std::error_code ec;
    data_dir = std::filesystem::absolute(data_dir, ec).lexically_normal().string();
    while (data_dir.size() > 1 && data_dir.back() == '/') data_dir.pop_back();
    host = "local:" + data_dir;
  }
  std::string sftd = opts.sftd;
  if (sftd.empty()) {
    auto found = FindSiblingBinary("sftd");
    if (!found.ok()) return UnavailableError(host + ": " + found.status().message());
    sftd = *found;
  }
  if (::access(sftd.c_str(), X_OK) != 0) {
    return UnavailableError(host + ": cannot run sftd '" + sftd + "': " + std::strerror(errno));
  }
  SFT_ASSIGN_OR_RETURN(nlohmann::json info, LocalAgentInfo(sftd, data_dir, host, opts.start_agent));
  std::string addr, token_file;
  try {
    addr = info.at("addr").get<std::string>();
    token_file = info.at("token_file").get<std::string>();
    if (info.contains("data_dir") && data_dir.empty()) data_dir = info["data_dir"].get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return UnavailableError(host + ": the agent's status lacks addr/token_file: " + info.dump());
  }
  auto token = FileSystem::Default()->ReadFile(token_file);
  if (!token.ok())
    return UnauthenticatedError(host + ": cannot read the agent token: " + token.status().message());

  grpc::ChannelArguments ch_args;
  ch_args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);  // never send loopback traffic through $http_proxy
  ch_args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, opts.keepalive_s * 1000);
  ch_args.SetMaxReceiveMessageSize(kMaxRpcMessageBytes);
  auto channel = grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), ch_args);
  auto conn = std::make_unique<LocalConnection>(channel, Trim(*token), host, data_dir);

  // This machine's agent is this build's: it must prove itself (another local user may hold a port
  // the agent left).
  SFT_RETURN_IF_ERROR(CheckAgentIdentity(*conn, addr, /*allow_legacy=*/false, opts.connect_timeout_s, host));
  SFT_RETURN_IF_ERROR(CheckLocalAgentVersion(*conn, addr, host, opts.connect_timeout_s));
  return std::unique_ptr<AgentConnection>(std::move(conn));
}

}  // namespace sftctl::client
