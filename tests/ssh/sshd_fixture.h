// SshdFixture: a real OpenSSH server (/usr/sbin/sshd) on 127.0.0.1 for tests, header-only.
//
// API (stable; the remote-command e2e tests use it too):
//
//   auto sshd = sftctl::sshtest::SshdFixture::Start();           // StatusOr<unique_ptr<SshdFixture>>
//   auto sshd = SshdFixture::Start({.allow_tcp_forwarding = false});  // RunPod-style: `sftd bridge` path
//   sshd->port(), sshd->user(), sshd->host()                       // host() = "user@127.0.0.1:port"
//   sshd->user_key()            // ed25519 private key in authorized_keys (no passphrase)
//   sshd->home()                // a temp HOME; home()/.ssh/known_hosts holds the host key unless
//                               //   SshdOptions::known_hosts says otherwise (WriteKnownHosts to change)
//   sshd->known_hosts()         // home()/.ssh/known_hosts
//   sshd->agent_data_dir()      // a temp sftd --data-dir (sshd's exec env has a minimal PATH and the
//                               //   real HOME, so tests pass the sftd path and data dir explicitly)
//   sshd->Options()             // ConnectOptions filled with all of the above + sftd_path()
//                               //   ($SFTCTL_TEST_SFTD, else SFTCTL_BIN_DIR/sftd)
//   sshd->host_key_fingerprint()  // "SHA256:<base64 without padding>", as OpenSSH prints it
//   sshd->RestartWithNewHostKey() // same port, new ed25519 host key (known_hosts left stale)
//   sshd->DropSessions()        // SIGKILLs every per-connection sshd (and what they run): live tunnels
//                               //   drop, the listener stays up
//   sshd->NewUserKey("rsa", /*authorize=*/true)  // another key pair; returns the private key path
//   sshd->Log(), sshd->LogSize()  // sshd's log (LogLevel from SshdOptions), e.g. "Accepted publickey"
//   sshd->Stop()                // stops the agent in agent_data_dir (if started), sessions, listener
//   SshAgentProcess agent; agent.Start(dir); agent.Add(key); agent.socket()  // an ssh-agent
//   Health(connection)          // the agent's Health() through an AgentConnection: its gRPC code
//   ScopedEnv home("HOME", dir.c_str());  // sets (nullptr: unsets) a variable until the scope ends
//
// Runs as the current user. As root, sshd needs its privilege-separation dir /run/sshd (created
// here, 0755, if missing) and the "sshd" account (present when openssh-server is installed); as a
// normal user neither is needed. sshd is started with -D as a child of the test process that dies
// with it (PR_SET_PDEATHSIG). Not thread-safe: use from the test's thread.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/remote/agent_connection.h"
#include "common/status.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/owned_processes.h"
#include "tests/util/proc_file.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"
#include "tests/util/wait_for.h"

namespace sftctl::sshtest {

// Commands (ssh-keygen, ssh-add, sftd): tests/util/command.h.
using ::sftctl::testing::CommandResult;
using ::sftctl::testing::RunCommand;

// Files and waits: tests/util/file_util.h, tests/util/wait_for.h.
using ::sftctl::testing::AppendToFile;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::WaitFor;
using ::sftctl::testing::WriteWholeFile;

// pid -> ppid of every live (non-zombie) process.
inline std::map<pid_t, pid_t> ProcessParents() {
  std::map<pid_t, pid_t> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string line = ::sftctl::testing::ReadProcFile("/proc/" + name + "/stat");
    size_t rp = line.rfind(')');
    if (rp == std::string::npos || rp + 2 >= line.size()) continue;
    std::istringstream ss(line.substr(rp + 2));
    char state = 0;
    long ppid = 0;
    ss >> state >> ppid;
    if (state != 'Z') out[static_cast<pid_t>(std::stol(name))] = static_cast<pid_t>(ppid);
  }
  return out;
}

// Every live descendant of `root` (not `root` itself).
inline std::vector<pid_t> Descendants(pid_t root) {
  std::map<pid_t, pid_t> parents = ProcessParents();
  std::set<pid_t> found = {root};
  bool grew = true;
  while (grew) {
    grew = false;
    for (auto [pid, ppid] : parents) {
      if (found.count(ppid) && !found.count(pid)) {
        found.insert(pid);
        grew = true;
      }
    }
  }
  found.erase(root);
  return {found.begin(), found.end()};
}

inline std::string CurrentUser() {
  passwd* pw = ::getpwuid(::getuid());
  return pw ? pw->pw_name : "root";
}

// A free TCP port on 127.0.0.1 (bound and released; sshd binds it right after).
inline int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

inline bool PortAccepts(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

enum class KnownHosts {
  kNone,    // known_hosts exists but is empty
  kPlain,   // "[127.0.0.1]:port ssh-ed25519 AAAA..."
  kHashed,  // the same, hashed with `ssh-keygen -H` ("|1|salt|hash ssh-ed25519 AAAA...")
};

struct SshdOptions {
  bool allow_tcp_forwarding = true;
  KnownHosts known_hosts = KnownHosts::kPlain;
  std::string log_level = "VERBOSE";  // DEBUG1..3 for more
};

class SshdFixture {
 public:
  static StatusOr<std::unique_ptr<SshdFixture>> Start(SshdOptions opts = {}) {
    std::unique_ptr<SshdFixture> f(new SshdFixture(std::move(opts)));
    SFT_RETURN_IF_ERROR(f->Init());
    return f;
  }
  ~SshdFixture() { (void)Stop(); }
  SshdFixture(const SshdFixture&) = delete;
  SshdFixture& operator=(const SshdFixture&) = delete;

  int port() const { return port_; }
  const std::string& user() const { return user_; }
  std::string host() const { return user_ + "@127.0.0.1:" + std::to_string(port_); }
  const std::string& dir() const { return dir_; }
  const std::string& home() const { return home_; }
  std::string known_hosts() const { return home_ + "/.ssh/known_hosts"; }
  std::string ssh_config() const { return home_ + "/.ssh/config"; }
  const std::string& user_key() const { return user_key_; }
  std::string agent_data_dir() const { return dir_ + "/agent"; }
  // $SFTCTL_TEST_SFTD, else the sftd of this build.
  std::string sftd_path() const {
    const char* env = std::getenv("SFTCTL_TEST_SFTD");
    return env != nullptr && *env ? env : ::sftctl::testing::Bin("sftd");
  }
  std::string host_key_path() const { return dir_ + "/host_ed25519"; }
  std::string log_path() const { return dir_ + "/sshd.log"; }
  pid_t listener_pid() const { return pid_; }

  // Everything a test needs to reach a real sftd through this sshd.
  client::ConnectOptions Options() const {
    client::ConnectOptions o;
    o.host = host();
    o.identity_file = user_key_;
    o.known_hosts_file = known_hosts();
    o.ssh_config_file = ssh_config();
    o.sftd = sftd_path();
    o.agent_data_dir = agent_data_dir();
    o.connect_timeout_s = 20;
    return o;
  }

  // "SHA256:..." of the current host key.
  std::string host_key_fingerprint() const {
    CommandResult r = RunCommand({"ssh-keygen", "-l", "-E", "sha256", "-f", host_key_path() + ".pub"});
    std::istringstream ss(r.output);
    std::string bits, fp;
    ss >> bits >> fp;
    return fp;
  }
  // The host key line as known_hosts holds it, unhashed.
  std::string KnownHostsLine() const {
    std::istringstream ss(ReadWholeFile(host_key_path() + ".pub"));
    std::string type, blob;
    ss >> type >> blob;
    return "[127.0.0.1]:" + std::to_string(port_) + " " + type + " " + blob + "\n";
  }
  // Rewrites known_hosts() in the given form for the current host key.
  Status WriteKnownHosts(KnownHosts mode) const {
    if (!WriteWholeFile(known_hosts(), mode == KnownHosts::kNone ? "" : KnownHostsLine())) {
      return InternalError("cannot write " + known_hosts());
    }
    if (mode == KnownHosts::kHashed) {
      CommandResult r = RunCommand({"ssh-keygen", "-H", "-f", known_hosts()});
      if (r.exit_code != 0) return InternalError("ssh-keygen -H: " + r.output);
      std::filesystem::remove(known_hosts() + ".old");
    }
    return OkStatus();
  }

  // Generates another key pair ("ed25519", "ecdsa", "rsa") under dir(); appends its public key to
  // authorized_keys when `authorize`. Returns the private key path.
  StatusOr<std::string> NewUserKey(const std::string& type, bool authorize) {
    std::string path = dir_ + "/user_" + type + "_" + std::to_string(++key_seq_);
    SFT_RETURN_IF_ERROR(Keygen(type, path));
    if (authorize && !AppendToFile(dir_ + "/authorized_keys", ReadWholeFile(path + ".pub"))) {
      return InternalError("cannot append to authorized_keys");
    }
    return path;
  }

  std::string Log() const { return ReadWholeFile(log_path()); }
  std::string ReadKnownHostsForTest() const { return ReadWholeFile(known_hosts()); }
  size_t LogSize() const {
    std::error_code ec;
    auto n = std::filesystem::file_size(log_path(), ec);
    return ec ? 0 : static_cast<size_t>(n);
  }

  // Stops the listener and its sessions, makes a new host key, starts again on the same port.
  Status RestartWithNewHostKey() {
    StopSshd();
    std::filesystem::remove(host_key_path());
    std::filesystem::remove(host_key_path() + ".pub");
    SFT_RETURN_IF_ERROR(Keygen("ed25519", host_key_path()));
    return StartSshd(/*pick_port=*/false);
  }

  // Kills every per-connection sshd process (and the commands they run, e.g. `sftd bridge`) so live
  // SSH connections drop; the listener keeps accepting. Returns once they are gone.
  Status DropSessions() {
    if (pid_ <= 0) return FailedPreconditionError("sshd is not running");
    for (pid_t p : Descendants(pid_)) ::kill(p, SIGKILL);
    if (!WaitFor([&] { return Descendants(pid_).empty(); }, std::chrono::seconds(10))) {
      return DeadlineExceededError("sshd sessions still alive after SIGKILL");
    }
    return OkStatus();
  }

  // Stops the sftd of agent_data_dir() (if one was started there), the sessions and the listener.
  // Idempotent.
  Status Stop() {
    if (std::filesystem::exists(agent_data_dir() + "/sftd.lock")) {
      (void)RunCommand({sftd_path(), "stop", "--data-dir", agent_data_dir(), "--timeout", "10s"});
    }
    StopSshd();
    if (!dir_.empty() && !keep_dir_) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
    dir_.clear();
    return OkStatus();
  }

  // Keep the temp dir after Stop() (debugging).
  void KeepDir() { keep_dir_ = true; }

 private:
  explicit SshdFixture(SshdOptions opts) : opts_(std::move(opts)) {}

  Status Init() {
    user_ = CurrentUser();
    dir_ = ::sftctl::testing::MakeTempDir("sshd");
    if (dir_.empty()) return ErrnoError("mkdtemp", std::filesystem::temp_directory_path().string(), errno);
    home_ = dir_ + "/home";
    std::filesystem::create_directories(home_ + "/.ssh");
    ::chmod((home_ + "/.ssh").c_str(), 0700);
    if (::geteuid() == 0 && !std::filesystem::exists("/run/sshd")) {
      if (::mkdir("/run/sshd", 0755) != 0 && errno != EEXIST) return ErrnoError("mkdir", "/run/sshd", errno);
    }
    SFT_RETURN_IF_ERROR(Keygen("ed25519", host_key_path()));
    user_key_ = dir_ + "/user_ed25519";
    SFT_RETURN_IF_ERROR(Keygen("ed25519", user_key_));
    if (!WriteWholeFile(dir_ + "/authorized_keys", ReadWholeFile(user_key_ + ".pub"))) {
      return InternalError("cannot write authorized_keys");
    }
    SFT_RETURN_IF_ERROR(StartSshd(/*pick_port=*/true));
    return WriteKnownHosts(opts_.known_hosts);
  }

  Status Keygen(const std::string& type, const std::string& path) const {
    std::vector<std::string> args = {"ssh-keygen", "-q", "-t",          type, "-N",
                                     "",           "-C", "sftctl-test", "-f", path};
    if (type == "rsa") args.insert(args.end(), {"-b", "2048"});
    CommandResult r = RunCommand(args);
    if (r.exit_code != 0) return InternalError("ssh-keygen -t " + type + " failed: " + r.output);
    return OkStatus();
  }

  void WriteConfig() const {
    std::string sftp = std::filesystem::exists("/usr/lib/openssh/sftp-server")
                           ? "/usr/lib/openssh/sftp-server"
                           : "internal-sftp";
    std::string c;
    c += "Port " + std::to_string(port_) + "\n";
    c += "ListenAddress 127.0.0.1\n";
    c += "HostKey " + host_key_path() + "\n";
    c += "PidFile " + dir_ + "/sshd.pid\n";
    c += "AuthorizedKeysFile " + dir_ + "/authorized_keys\n";
    c += "UsePAM no\nStrictModes no\n";
    c += "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n";
    c += "PermitRootLogin prohibit-password\n";
    c += std::string("AllowTcpForwarding ") + (opts_.allow_tcp_forwarding ? "yes" : "no") + "\n";
    c += "LogLevel " + opts_.log_level + "\n";
    c += "MaxStartups 64\nMaxSessions 64\n";
    c += "Subsystem sftp " + sftp + "\n";
    // What the sessions start (a detached sftd) is the test's: the guard finds it by this variable.
    if (const char* owner = std::getenv(::sftctl::testing::kTestOwnerVar)) {
      c += std::string("SetEnv ") + ::sftctl::testing::kTestOwnerVar + "=" + owner + "\n";
    }
    WriteWholeFile(dir_ + "/sshd_config", c);
  }

  Status StartSshd(bool pick_port) {
    std::string last_error;
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (pick_port || port_ <= 0) port_ = FreeLoopbackPort();
      if (port_ <= 0) return InternalError("no free port on 127.0.0.1");
      WriteConfig();
      size_t log_start = LogSize();
      std::string config = dir_ + "/sshd_config", log = log_path();
      pid_t parent = ::getpid();
      pid_t pid = ::fork();
      if (pid < 0) return ErrnoError("fork", "/usr/sbin/sshd", errno);
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) _exit(1);
        int devnull = ::open("/dev/null", O_RDWR);
        if (devnull >= 0) {
          ::dup2(devnull, 0);
          ::dup2(devnull, 1);
          ::dup2(devnull, 2);
        }
        const char* args[] = {"/usr/sbin/sshd", "-D", "-f", config.c_str(), "-E", log.c_str(), nullptr};
        ::execv(args[0], const_cast<char* const*>(args));
        _exit(127);
      }
      pid_ = pid;
      bool up = WaitFor(
          [&] {
            int st = 0;
            if (::waitpid(pid_, &st, WNOHANG) == pid_) {
              pid_ = -1;
              return true;
            }
            return PortAccepts(port_);
          },
          std::chrono::seconds(20));
      if (up && pid_ > 0) return OkStatus();
      last_error = Log().substr(log_start);
      if (pid_ > 0) StopSshd();
      if (!pick_port && last_error.find("Address already in use") == std::string::npos) break;
      if (!pick_port) {
        // The old port is still held (e.g. TIME_WAIT without SO_REUSEADDR): wait a little and retry.
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    return InternalError("sshd did not start: " + last_error);
  }

  void StopSshd() {
    if (pid_ <= 0) return;
    for (pid_t p : Descendants(pid_)) ::kill(p, SIGKILL);
    ::kill(pid_, SIGTERM);
    bool gone = WaitFor([&] { return ::waitpid(pid_, nullptr, WNOHANG) == pid_; }, std::chrono::seconds(10));
    if (!gone) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }

  SshdOptions opts_;
  std::string user_, dir_, home_, user_key_;
  int port_ = -1;
  pid_t pid_ = -1;
  int key_seq_ = 0;
  bool keep_dir_ = false;
};

// Sets (or unsets, with nullptr) an environment variable for the test's lifetime. Each ctest test
// runs in its own process, so HOME/SSH_AUTH_SOCK changes stay local.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

// Health() through the connection; returns the gRPC status code.
inline grpc::StatusCode Health(const client::AgentConnection& c,
                               std::chrono::seconds timeout = std::chrono::seconds(10)) {
  auto stub = c.NewStub();
  grpc::ClientContext ctx;
  c.Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  v1::HealthResponse h;
  return stub->Health(&ctx, v1::HealthRequest(), &h).error_code();
}

// An ssh-agent on a socket under `dir`, killed on destruction. A Unix socket's path holds at most 107
// bytes: when `dir` is deeper than that allows (a checkout in a deep folder), the socket goes to a
// short folder of /tmp instead, removed with the agent.
class SshAgentProcess {
 public:
  ~SshAgentProcess() { Stop(); }

  Status Start(const std::string& dir) {
    socket_ = dir + "/ssh-agent.sock";
    if (socket_.size() > 100) {
      char tmpl[] = "/tmp/sftctl-agent-XXXXXX";
      if (::mkdtemp(tmpl) == nullptr) return ErrnoError("mkdtemp", tmpl, errno);
      short_dir_ = tmpl;
      socket_ = short_dir_ + "/s";
    }
    pid_t pid = ::fork();
    if (pid < 0) return ErrnoError("fork", "ssh-agent", errno);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      int devnull = ::open("/dev/null", O_RDWR);
      if (devnull >= 0) {
        ::dup2(devnull, 0);
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
      }
      ::execlp("ssh-agent", "ssh-agent", "-D", "-a", socket_.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pid_ = pid;
    if (!WaitFor([&] { return std::filesystem::exists(socket_); }, std::chrono::seconds(10))) {
      return InternalError("ssh-agent did not create " + socket_);
    }
    return OkStatus();
  }
  Status Add(const std::string& key) const {
    CommandResult r = RunCommand({"ssh-add", key}, {"SSH_AUTH_SOCK=" + socket_});
    if (r.exit_code != 0) return InternalError("ssh-add " + key + ": " + r.output);
    return OkStatus();
  }
  const std::string& socket() const { return socket_; }
  void Stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (!short_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(short_dir_, ec);
      short_dir_.clear();
    }
  }

 private:
  std::string socket_;
  std::string short_dir_;  // the /tmp folder of a socket that did not fit under `dir`, or empty
  pid_t pid_ = -1;
};

}  // namespace sftctl::sshtest
