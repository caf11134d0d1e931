#include "agent/serving/daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>  // __NR_close_range
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "agent/jobs/gpu_discovery.h"
#include "agent/jobs/supervisor.h"
#include "agent/serving/activity_interceptor.h"
#include "agent/serving/auth.h"
#include "agent/serving/service.h"
#include "agent/slurm/slurm_runner.h"
#include "agent/state/artifacts.h"
#include "agent/state/blob_store.h"
#include "agent/state/state_store.h"
#include "agent/stopping/auto_stop.h"
#include "agent/stopping/client_activity.h"
#include "common/os/fd_util.h"
#include "common/os/file_system.h"
#include "common/os/net_addr.h"
#include "common/rpc_limits.h"
#include "common/source_id.h"
#include "proto/grpc_compat.h"
#include "sftctl/v1/agent.grpc.pb.h"

#ifndef SFTCTL_VERSION
#define SFTCTL_VERSION "0.0.0-dev"
#endif

namespace sftctl::agent {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string Path(const std::string& dir, const char* name) { return dir + "/" + name; }

std::string ReadSmallFile(const std::string& path) {
  auto s = FileSystem::Default()->ReadFile(path);
  if (!s.ok()) return "";
  std::string v = *s;
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
  return v;
}

// True when some process holds the data dir's lock (an agent is running there).
// A call to the agent running at `r`: its stub and a context carrying the data dir's bearer token,
// due within `timeout`. Errors: the token file cannot be read.
struct AgentCall {
  std::unique_ptr<::sftctl::v1::Agent::Stub> stub;
  grpc::ClientContext ctx;
};
StatusOr<std::unique_ptr<AgentCall>> CallAgent(const std::string& dir, const std::string& addr,
                                               std::chrono::seconds timeout) {
  SFT_ASSIGN_OR_RETURN(std::string token, FileSystem::Default()->ReadFile(Path(dir, "token")));
  while (!token.empty() && token.back() == '\n') token.pop_back();
  auto call = std::make_unique<AgentCall>();
  call->stub = ::sftctl::v1::Agent::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  call->ctx.AddMetadata("authorization", "Bearer " + token);
  call->ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  return call;
}

bool LockHeld(const std::string& dir) {
  int fd = ::open(Path(dir, "sftd.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // releases our lock if we got it
  return held;
}

// True when `pid` is an sftd run by this user: its executable has our binary's name and the
// process is ours. A pid read from a data dir's sftd.pid may be stale and reused by an unrelated
// process; nothing is signalled unless this holds.
bool IsOurAgent(long pid) {
  if (pid <= 0) return false;
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (::stat(proc.c_str(), &st) != 0 || st.st_uid != ::geteuid()) return false;
  auto exe_name = [](const std::string& link) {
    char buf[PATH_MAX];
    ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
    if (n <= 0) return std::string();
    std::string path(buf, static_cast<size_t>(n));
    const std::string deleted = " (deleted)";  // a binary replaced by a rebuild or reinstall
    if (path.size() > deleted.size() &&
        path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
      path.resize(path.size() - deleted.size());
    return path.substr(path.rfind('/') + 1);
  };
  const std::string theirs = exe_name(proc + "/exe");
  return !theirs.empty() && theirs == exe_name("/proc/self/exe");
}

struct Running {
  bool running = false;
  long pid = 0;
  std::string host;  // what to dial: "127.0.0.1", "[::1]", ... (sftd.host; older agents: 127.0.0.1)
  int port = 0;
  std::string version;
  std::string source_id;  // sftd.source_id (common/source_id.h); empty from older agents
  std::string addr() const { return host + ":" + std::to_string(port); }
};

// Reads the files of a running agent; waits up to `wait` for a starting agent to write them.
Running FindRunning(const std::string& dir, std::chrono::milliseconds wait) {
  auto deadline = SteadyClock::now() + wait;
  for (;;) {
    Running r;
    if (!LockHeld(dir)) return r;
    r.pid = std::atol(ReadSmallFile(Path(dir, "sftd.pid")).c_str());
    r.host = ReadSmallFile(Path(dir, "sftd.host"));
    if (r.host.empty()) r.host = "127.0.0.1";
    r.port = std::atoi(ReadSmallFile(Path(dir, "sftd.port")).c_str());
    r.version = ReadSmallFile(Path(dir, "sftd.version"));
    r.source_id = ReadSmallFile(Path(dir, "sftd.source_id"));
    r.running = r.port > 0 && !r.version.empty() && IsOurAgent(r.pid);
    if (r.running || SteadyClock::now() >= deadline) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string ReadyLine(const std::string& addr, const std::string& dir, const std::string& version,
                      const std::string& source_id, long pid) {
  nlohmann::json j = {{"addr", addr},       {"token_file", Path(dir, "token")},
                      {"version", version}, {"source_id", source_id},
                      {"pid", pid},         {"data_dir", dir}};
  return "SFTD_READY " + j.dump() + "\n";
}

// A TCP connection to `host` (an address literal, IPv6 in brackets) and `port`; -1 with errno set.
int ConnectTcp(std::string host, int port) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) {
    errno = EINVAL;
    return -1;
  }
  int sock = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock >= 0 && ::connect(sock, res->ai_addr, res->ai_addrlen) != 0) {
    int e = errno;
    ::close(sock);
    sock = -1;
    errno = e;
  }
  ::freeaddrinfo(res);
  return sock;
}

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// Raises the soft limit on open files to the hard one (at most 65536): every rank holds three
// output files, every client a socket, and the default soft limit of 1024 runs out first.
void RaiseOpenFileLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  const rlim_t want = r.rlim_max == RLIM_INFINITY ? 65536 : std::min<rlim_t>(r.rlim_max, 65536);
  if (r.rlim_cur >= want) return;
  r.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &r) != 0)
    spdlog::warn("cannot raise the open-file limit: {}", std::strerror(errno));
}

// Closes the descriptors first..last: close_range(2) as a system call (glibc has its wrapper only from
// 2.34; Debian 11 has 2.31), one by one below the open-file limit where the kernel lacks it (before 5.9).
void CloseFdRange(unsigned first, unsigned last) {
#ifdef __NR_close_range  // (glibc 2.31 names no SYS_close_range; the kernel headers do)
  if (::syscall(__NR_close_range, first, last, 0) == 0) return;
#endif
  rlimit r{};
  rlim_t limit = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    limit = std::min<rlim_t>(r.rlim_cur, 1 << 20);
  for (unsigned fd = first; fd <= last && fd < limit; ++fd) ::close(static_cast<int>(fd));
}

// The supervisor's settings from the command line (GPUs named or discovered, CPU slots, timings, the
// trainer beside sftd, the Hub from the environment). INVALID_ARGUMENT for a bad --gpus list.
StatusOr<SupervisorConfig> MakeSupervisorConfig(const DaemonOptions& opts, const std::string& dir) {
  SupervisorConfig cfg;
  cfg.data_dir = dir;
  cfg.trainer_path = opts.trainer.empty() ? SelfDir() + "/sftctl-trainer" : opts.trainer;
  if (opts.gpus) {
    SFT_ASSIGN_OR_RETURN(auto g, ParseGpuList(*opts.gpus));
    for (const GpuInfo& i : g) cfg.gpus.push_back(i.index);
  } else {
    for (const GpuInfo& i : DiscoverGpus()) cfg.gpus.push_back(i.index);
  }
  unsigned ncpu = std::thread::hardware_concurrency();
  cfg.cpu_slots = opts.cpu_slots > 0 ? static_cast<uint32_t>(opts.cpu_slots) : std::max(1u, ncpu);
  cfg.kill_grace = std::chrono::milliseconds(opts.kill_grace_ms);
  cfg.poll = std::chrono::milliseconds(std::max(10, opts.poll_ms));
  cfg.default_heartbeat_s = static_cast<uint32_t>(std::max(1, opts.heartbeat_s));
  cfg.rendezvous_addr = RendezvousAddr(opts);
  cfg.hub = HubOptionsFromEnvironment();  // HF_ENDPOINT, HF_HOME / HF_HUB_CACHE, the host's token
  if (!opts.shared_dir.empty()) {
    SFT_ASSIGN_OR_RETURN(cfg.shared_dir, slurm::PrepareSharedDir(opts.shared_dir));
  }
  cfg.slurm_poll = std::chrono::milliseconds(std::max(10, opts.slurm_poll_ms));
  return cfg;
}

// Plain credentials on loopback, TLS with --tls-cert and --tls-key (their read errors returned).
StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const DaemonOptions& opts) {
  if (opts.tls_cert.empty() || opts.tls_key.empty()) return grpc::InsecureServerCredentials();
  SFT_ASSIGN_OR_RETURN(std::string cert, FileSystem::Default()->ReadFile(opts.tls_cert));
  SFT_ASSIGN_OR_RETURN(std::string key, FileSystem::Default()->ReadFile(opts.tls_key));
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(ssl);
}

// The gRPC server of `service` on `address` (its port in *port; null when it cannot listen), with the
// client-activity interceptors, the message and stream limits both ends accept, and one memory quota
// for all connections together (a flood of clients slows down, never grows sftd).
std::unique_ptr<grpc::Server> BuildServer(
    const std::string& address, const std::shared_ptr<grpc::ServerCredentials>& creds, AgentService* service,
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> interceptors,
    rpc::CallbackServerPoller* poller, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, creds, port);
  builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::move(interceptors));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  builder.SetMaxReceiveMessageSize(kMaxRpcMessageBytes);
  builder.SetMaxSendMessageSize(kMaxRpcMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreamsPerConnection);
  grpc::ResourceQuota quota("sftd");
  quota.Resize(size_t{1} << 30);
  builder.SetResourceQuota(quota);
  poller->AddTo(&builder);
  return builder.BuildAndStart();
}

// What `sftd status` and clients on this host read to find the running agent.
Status WriteAddressFiles(const std::string& dir, const std::string& dial_host, int port,
                         const std::string& version) {
  const std::pair<const char*, std::string> files[] = {{"sftd.host", dial_host},
                                                       {"sftd.port", std::to_string(port)},
                                                       {"sftd.version", version},
                                                       {"sftd.source_id", SourceId()},
                                                       {"sftd.pid", std::to_string(::getpid())}};
  for (const auto& [name, value] : files) {
    SFT_RETURN_IF_ERROR(WriteFileAtomic(FileSystem::Default(), Path(dir, name), value + "\n"));
  }
  return OkStatus();
}

// Blocks the shutdown signals (TERM, INT, HUP) in this thread and so in every thread started after
// it; the main thread takes them with sigwait on the returned set. SIGPIPE is ignored.
sigset_t BlockShutdownSignals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return sigs;
}

// What the auto-stop thread reads: jobs from the supervisor, client contact, the stop flags.
AutoStopDeps MakeAutoStopDeps(const DaemonOptions& opts, const std::string& dir, StateStore* store,
                              ClientActivity* activity, Supervisor* supervisor, CommandRunner* runner,
                              const StopEnv& env) {
  AutoStopDeps deps;
  deps.store = store;
  deps.activity = activity;
  deps.active_jobs = [supervisor] {
    SupervisorStats st = supervisor->Stats();
    return st.running + st.queued;
  };
  deps.runner = runner;
  deps.data_dir = dir;
  deps.env = env;
  deps.check = std::chrono::milliseconds(std::max(10, opts.stop_check_ms));
  // The cost cap cancels through the supervisor; the cancels have begun when it answers.
  deps.cancel_jobs = [supervisor](const std::string& reason) -> size_t {
    auto done = std::make_shared<std::promise<size_t>>();
    std::future<size_t> cancelled = done->get_future();
    supervisor->CancelAll(reason, [done](size_t n) { done->set_value(n); });
    return cancelled.wait_for(std::chrono::seconds(60)) == std::future_status::ready ? cancelled.get() : 0;
  };
  deps.job_stop_time =
      std::chrono::seconds((std::max(0, opts.kill_grace_ms) + 999) / 1000) + std::chrono::seconds(1);
  return deps;
}

// The files a running agent is found by; removed when it stops.
void RemoveAddressFiles(const std::string& dir) {
  for (const char* name : {"sftd.pid", "sftd.port", "sftd.host"}) ::unlink(Path(dir, name).c_str());
}

// Reports `msg` as the agent's start failure on `ready_fd` and in the log; returns the exit code 1.
int FailStart(int ready_fd, const std::string& msg) {
  (void)WriteFully(ready_fd, "SFTD_ERROR " + msg + "\n", "ready pipe");
  spdlog::error("{}", msg);
  return 1;
}

int ServeLocked(const DaemonOptions& opts, const std::string& dir, int ready_fd, const sigset_t& sigs);

// Runs the agent in this process until SIGTERM/SIGINT/SIGHUP. Reports readiness (or "SFTD_ERROR <msg>")
// on `ready_fd`. Returns the exit code.
// The data dir's lock (sftd.lock) is the agent's: `sftd stop` and a starting agent wait for it. It is
// released only after ServeLocked has closed everything in the data dir (agent.db, the journals), so
// nothing of this agent touches the folder once the lock is free.
int Serve(const DaemonOptions& opts, const std::string& dir, int ready_fd) {
  const sigset_t sigs = BlockShutdownSignals();
  RaiseOpenFileLimit();
  UniqueFd lock(::open(Path(dir, "sftd.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid())
    return FailStart(ready_fd, "cannot open " + Path(dir, "sftd.lock") + ": " + std::strerror(errno));
  for (int attempt = 1; ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0; ++attempt) {
    // Another agent started meanwhile: report it instead. One that was stopping (its address files
    // gone, the lock not yet free) lets go within FindRunning's wait: then the lock is taken again.
    Running r = FindRunning(dir, std::chrono::seconds(10));
    if (r.running) {
      (void)WriteFully(ready_fd, ReadyLine(r.addr(), dir, r.version, r.source_id, r.pid), "ready pipe");
      return 0;
    }
    if (attempt == 3 || LockHeld(dir))
      return FailStart(ready_fd, "another sftd holds " + Path(dir, "sftd.lock"));
  }
  return ServeLocked(opts, dir, ready_fd, sigs);
}

// Runs the agent until SIGTERM/SIGINT/SIGHUP (taken from `sigs` with sigwait), holding the data dir's
// lock; everything it opened is closed when it returns.
int ServeLocked(const DaemonOptions& opts, const std::string& dir, int ready_fd, const sigset_t& sigs) {
  auto fail = [&](const std::string& msg) { return FailStart(ready_fd, msg); };
  bool tls = !opts.tls_cert.empty() && !opts.tls_key.empty();
  if (!IsLoopbackHost(opts.listen) && !tls) {
    return fail("refusing to listen on non-loopback address " + opts.listen +
                " without TLS (--tls-cert/--tls-key); use an SSH tunnel or `sftd bridge`");
  }
  auto token = LoadOrCreateToken(Path(dir, "token"));
  if (!token.ok()) return fail(token.status().ToString());
  auto store = StateStore::Open(Path(dir, "agent.db"));
  if (!store.ok()) return fail(store.status().ToString());
  const StopEnv stop_env = StopEnv::FromProcess();
  auto stop_policy = LoadStopPolicy(store->get(), opts.stop, stop_env);
  if (!stop_policy.ok()) return fail(stop_policy.status().ToString());
  BlobStore blobs(Path(dir, "blobs"), store->get());
  if (Status s = blobs.Init(); !s.ok()) return fail(s.ToString());

  auto cfg = MakeSupervisorConfig(opts, dir);
  if (!cfg.ok()) return fail(cfg.status().ToString());
  CheckpointUploads uploads;  // the host's environment; outlives the supervisor, which stops it
  Supervisor supervisor(*cfg, store->get(), &blobs, &uploads);
  if (Status s = supervisor.Start(); !s.ok()) return fail(s.ToString());
  // The collector reads the specs the supervisor parsed; it goes before the supervisor does.
  GarbageCollector gc(dir, store->get(), &blobs,
                      [&supervisor](const std::string& job_id) { return supervisor.SpecOf(job_id); });
  AutoGc auto_gc(&gc, dir, opts.gc, std::chrono::seconds(std::max(1, opts.gc_check_s)), opts.gc_min_free_pct);

  Artifacts artifacts(store->get());
  Authenticator auth(*token);
  ClientActivity activity(::sftctl::Clock::Real());
  // The stop command runs with the agent's cloud environment (ChildKind::kStopCommand).
  std::unique_ptr<CommandRunner> stop_runner = CommandRunner::NewPosix(ChildKind::kStopCommand);
  AutoStop auto_stop(
      MakeAutoStopDeps(opts, dir, store->get(), &activity, &supervisor, stop_runner.get(), stop_env),
      *stop_policy);
  std::string version = opts.version_override.empty() ? AgentVersion() : opts.version_override;
  int port = 0;
  rpc::CallbackServerPoller poller;  // (gRPC before 1.37; outlives the server)
  std::unique_ptr<grpc::Server> server;
  {
    ServiceDeps deps;
    deps.supervisor = &supervisor;
    deps.store = store->get();
    deps.blobs = &blobs;
    deps.artifacts = &artifacts;
    deps.gc = &gc;
    deps.gc_policy = opts.gc;
    deps.auth = &auth;
    deps.auto_stop = &auto_stop;
    deps.version = version;
    auto service = std::make_unique<AgentService>(deps);
    auto creds = ServerCredentials(opts);
    if (!creds.ok()) return fail(creds.status().ToString());
    const std::string host = opts.listen.find(':') != std::string::npos && opts.listen.front() != '['
                                 ? "[" + opts.listen + "]"
                                 : opts.listen;
    server = BuildServer(host + ":" + std::to_string(opts.port), *creds, service.get(),
                         MakeClientActivityInterceptors(&activity, &auth), &poller, &port);
    if (!server || port == 0) {
      supervisor.Stop();
      return fail("cannot listen on " + host + ":" + std::to_string(opts.port) + " (port in use?)");
    }
    poller.Start();
    const std::string dial_host = DialHost(opts.listen);
    service->SetListenAddr(dial_host + ":" + std::to_string(port));
    if (Status s = WriteAddressFiles(dir, dial_host, port, version); !s.ok()) {
      server->Shutdown();
      supervisor.Stop();
      return fail(s.ToString());
    }
    spdlog::info("sftd {} listening on {}:{} (data dir {}, {} GPU(s), trainer {})", version, opts.listen,
                 port, dir, cfg->gpus.size(), cfg->trainer_path);
    if (const AutoStopView v = auto_stop.View(); !v.policy.empty()) spdlog::info("auto-stop: {}", v.policy);
    (void)WriteFully(ready_fd,
                     ReadyLine(dial_host + ":" + std::to_string(port), dir, version, SourceId(), ::getpid()),
                     "ready pipe");
    if (ready_fd != STDOUT_FILENO) ::close(ready_fd);
    auto_gc.Start();
    auto_stop.Start();

    int sig = 0;
    sigwait(&sigs, &sig);
    spdlog::info("signal {}: shutting down (running jobs keep running)", sig);
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server->Wait();
    server.reset();
    service.reset();  // joins the worker pool
  }
  auto_stop.Stop();
  auto_gc.Stop();
  supervisor.Stop();
  RemoveAddressFiles(dir);
  return 0;
}

}  // namespace

std::string AgentVersion() { return SFTCTL_VERSION; }

std::string DialHost(const std::string& listen) {
  std::string h = listen;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty() || h == "0.0.0.0" || h == "localhost") return "127.0.0.1";
  if (h == "::") return "[::1]";
  in6_addr a6{};
  if (::inet_pton(AF_INET6, h.c_str(), &a6) == 1) return "[" + h + "]";
  return h;
}

std::string RendezvousAddr(const DaemonOptions& opts) {
  if (!opts.rendezvous_addr.empty()) return opts.rendezvous_addr;
  if (IsLoopbackHost(opts.listen)) return "127.0.0.1";
  if (opts.listen == "0.0.0.0" || opts.listen == "::" || opts.listen == "[::]" || opts.listen.empty()) {
    char name[256] = {};
    if (::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') return name;
    return "127.0.0.1";
  }
  return opts.listen;
}

namespace {

std::string HomeDir() {
  if (const char* h = std::getenv("HOME"); h && *h) return h;
  if (const passwd* pw = ::getpwuid(::geteuid()); pw && pw->pw_dir && *pw->pw_dir) return pw->pw_dir;
  return "";  // never a shared folder such as /tmp
}

// The first line of ~/.config/sftd/data_dir ($XDG_CONFIG_HOME honoured): where `sftctl bootstrap`
// records storage that survives the instance. "" when there is none or it is unusable (said on stderr).
std::string ConfiguredDataDir(const std::string& home) {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  const std::string conf = (xdg && *xdg ? std::string(xdg) : home + "/.config") + "/sftd/data_dir";
  std::ifstream in(conf);
  if (!in) return "";
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  if (line.empty() || line[0] != '/') {
    std::cerr << "sftd: ignoring " << conf << ": its first line must be an absolute folder, not '" << line
              << "'\n";
    return "";
  }
  return line;
}

}  // namespace

std::string DefaultDataDir() {
  if (const char* d = std::getenv("SFTD_DATA_DIR"); d && *d) return d;
  const std::string home = HomeDir();
  if (std::string configured = home.empty() ? "" : ConfiguredDataDir(home); !configured.empty())
    return configured;
  if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return std::string(x) + "/sftd";
  return home.empty() ? "" : home + "/.local/share/sftd";
}

std::string EnvFilePath() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && *xdg) return std::string(xdg) + "/sftd/env";
  const std::string home = HomeDir();
  return home.empty() ? "" : home + "/.config/sftd/env";
}

Status CheckEnvFileTrust(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) {  // the file itself, as a shell or systemd reads it
    if (path.empty() || errno == ENOENT || errno == ENOTDIR) return OkStatus();
    return ErrnoError("cannot inspect the environment file", path, errno);
  }
  const std::string fix = "; it holds secrets for sftd (API keys): run `chmod 600 " + path + "`";
  if (!S_ISREG(st.st_mode)) {
    return FailedPreconditionError("the environment file " + path + " is not a regular file");
  }
  if (st.st_uid != ::geteuid()) {
    return PermissionDeniedError("the environment file " + path + " belongs to uid " +
                                 std::to_string(st.st_uid) + ", not to this user (uid " +
                                 std::to_string(::geteuid()) + "): make it your own (chown)" + fix);
  }
  if (st.st_mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return PermissionDeniedError("the environment file " + path +
                                 " is readable or writable by group or others (mode " + mode + ")" + fix);
  }
  return OkStatus();
}

Status CheckDataDirTrust(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoError("cannot inspect the data dir", dir, errno);
  if (!S_ISDIR(st.st_mode)) return FailedPreconditionError("the data dir " + dir + " is not a folder");
  if (st.st_uid != ::geteuid()) {
    return PermissionDeniedError(
        "the data dir " + dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
        std::to_string(::geteuid()) +
        "): another user could read its token or plant jobs; use a folder of your own");
  }
  if (st.st_mode & S_IWOTH) {
    return PermissionDeniedError("the data dir " + dir +
                                 " is writable by every user: its jobs and blobs cannot be trusted; "
                                 "use a folder of your own");
  }
  if (::chmod(dir.c_str(), 0700) != 0) return ErrnoError("cannot make the data dir private", dir, errno);
  return OkStatus();
}

namespace {

// The data dir to serve, made and checked: created when missing, resolved (realpath), private to this
// user; the agent's environment file trusted too. Errors read as "SFTD_ERROR" lines print them.
StatusOr<std::string> PrepareDataDir(const DaemonOptions& opts) {
  std::string dir = opts.data_dir.empty() ? DefaultDataDir() : opts.data_dir;
  if (dir.empty()) {
    return FailedPreconditionError(
        "no data dir: HOME is unset and this user has no home folder; pass --data-dir or set SFTD_DATA_DIR");
  }
  SFT_RETURN_IF_ERROR(FileSystem::Default()->CreateDirs(dir));
  char real[PATH_MAX];
  if (::realpath(dir.c_str(), real) != nullptr) dir = real;
  SFT_RETURN_IF_ERROR(CheckDataDirTrust(dir));
  SFT_RETURN_IF_ERROR(CheckEnvFileTrust(EnvFilePath()));
  return dir;
}

// Runs the agent in a grandchild: a session of its own, output in sftd.log, every inherited descriptor
// closed (an SSH channel's too, so the caller sees EOF), readiness reported through a pipe. This
// process prints that one line and returns once the agent is ready (0) or has failed (1).
int StartDetached(const DaemonOptions& opts, const std::string& dir) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    std::cerr << "SFTD_ERROR pipe: " << std::strerror(errno) << "\n";
    return 1;
  }
  std::cout.flush();
  pid_t pid = ::fork();
  if (pid < 0) {
    std::cerr << "SFTD_ERROR fork: " << std::strerror(errno) << "\n";
    return 1;
  }
  if (pid == 0) {
    ::close(p[0]);
    ::setsid();
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    int log = ::open(Path(dir, "sftd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    if (log >= 0) {
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
    }
    CloseFdRange(3, static_cast<unsigned>(p[1]) - 1);
    CloseFdRange(static_cast<unsigned>(p[1]) + 1, ~0U);
    // A second fork: the agent is not a session leader, so it can never reacquire a terminal.
    pid_t agent = ::fork();
    if (agent < 0) _exit(1);
    if (agent > 0) _exit(0);
    _exit(Serve(opts, dir, p[1]));
  }
  ::close(p[1]);
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(p[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.find('\n') != std::string::npos) break;
  }
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (out.rfind("SFTD_READY ", 0) == 0) {
    std::cout << out.substr(0, out.find('\n') + 1) << std::flush;
    return 0;
  }
  std::cerr << (out.empty()
                    ? "SFTD_ERROR agent exited before it was ready; see " + Path(dir, "sftd.log") + "\n"
                    : out);
  return 1;
}

}  // namespace

int RunStart(DaemonOptions opts) {
  rpc::UseServerPollingEngine();  // (gRPC before 1.37) before anything of gRPC
  StatusOr<std::string> prepared = PrepareDataDir(opts);
  if (!prepared.ok()) {
    std::cerr << "SFTD_ERROR " << prepared.status().ToString() << "\n";
    return 1;
  }
  const std::string dir = *prepared;
  std::string want_version = opts.version_override.empty() ? AgentVersion() : opts.version_override;

  Running r = FindRunning(dir, std::chrono::seconds(5));
  if (r.running) {
    // Another build (same version number, other source id: `sftctl bootstrap` installed a new one)
    // replaces the running agent too; --version-override (tests) compares the version only.
    const bool same =
        r.version == want_version && (!opts.version_override.empty() || r.source_id == SourceId());
    if (same && !opts.stop.any()) {
      std::cout << ReadyLine(r.addr(), dir, r.version, r.source_id, r.pid) << std::flush;
      return 0;
    }
    // The stop policy is read at start: new --stop-* flags restart the agent (jobs keep running).
    if (same) {
      std::cerr << "sftd: restarting the running agent to apply the --stop-* flags (jobs keep running)\n";
    } else {
      std::cerr << "sftd: running agent is version " << r.version << " (source " << ShortSourceId(r.source_id)
                << "), restarting it as " << want_version << " (source " << ShortSourceId(SourceId())
                << ")\n";
    }
    if (int rc = RunStop(dir, 15, /*quiet=*/true); rc != 0) return rc;
  }
  return opts.detach ? StartDetached(opts, dir) : Serve(opts, dir, STDOUT_FILENO);
}

int RunStatus(const std::string& data_dir, bool json, bool with_token) {
  std::string dir = data_dir.empty() ? DefaultDataDir() : data_dir;
  Running r = FindRunning(dir, std::chrono::milliseconds(0));
  nlohmann::json j = {{"running", r.running}, {"data_dir", dir}};
  if (r.running) {
    j["pid"] = r.pid;
    j["addr"] = r.addr();
    j["version"] = r.version;
    j["source_id"] = r.source_id;
    j["token_file"] = Path(dir, "token");
    if (with_token && json) {
      const std::string token = ReadSmallFile(Path(dir, "token"));
      if (!token.empty()) j["token"] = token;
    }
    auto call = CallAgent(dir, r.addr(), std::chrono::seconds(5));
    if (call.ok()) {
      ::sftctl::v1::HealthResponse h;
      grpc::Status s = (*call)->stub->Health(&(*call)->ctx, ::sftctl::v1::HealthRequest(), &h);
      j["healthy"] = s.ok();
      if (s.ok()) {
        j["uptime_s"] = h.uptime_s();
        j["jobs_running"] = h.jobs_running();
        j["jobs_queued"] = h.jobs_queued();
        j["gpus_total"] = h.gpus_total();
        j["gpus_free"] = h.gpus_free();
        const auto& as = h.auto_stop();
        j["auto_stop"] = {{"policy", as.policy()},
                          {"state", as.state()},
                          {"remaining_s", as.remaining_s()},
                          {"detail", as.detail()},
                          {"action", as.action()},
                          {"cost_estimate", as.cost_estimate()},
                          {"last_action", as.last_action()},
                          {"max_cost", as.max_cost()},
                          {"spent", as.spent()},
                          {"billing_since_unix_s", as.billing_since_unix_s()},
                          {"cost_cap_remaining_s", as.cost_cap_remaining_s()},
                          {"cost_cap_reached", as.cost_cap_reached()},
                          {"cost_cap_reason", as.cost_cap_reason()}};
      } else {
        j["error"] = s.error_message();
      }
    }
  }
  if (json) {
    std::cout << j.dump() << "\n";
  } else if (r.running) {
    std::cout << "sftd " << r.version << " running, pid " << r.pid << ", " << r.addr() << ", data dir " << dir
              << "\n";
  } else {
    std::cout << "sftd is not running (data dir " << dir << ")\n";
  }
  return r.running ? 0 : 3;
}

int RunStop(const std::string& data_dir, int timeout_s, bool quiet) {
  std::string dir = data_dir.empty() ? DefaultDataDir() : data_dir;
  Running r = FindRunning(dir, std::chrono::milliseconds(0));
  if (!LockHeld(dir)) {
    (quiet ? std::cerr : std::cout) << "sftd is not running\n";
    return 0;
  }
  if (r.pid <= 0) {
    std::cerr << "sftd: the lock is held but " << Path(dir, "sftd.pid") << " is missing\n";
    return 1;
  }
  if (!IsOurAgent(r.pid)) {
    std::cerr << "sftd: the lock of " << dir << " is held, but pid " << r.pid << " in "
              << Path(dir, "sftd.pid")
              << " is not an sftd of this user (a stale pid file?); not signalling it\n";
    return 1;
  }
  ::kill(static_cast<pid_t>(r.pid), SIGTERM);
  auto deadline = SteadyClock::now() + std::chrono::seconds(timeout_s);
  while (LockHeld(dir) && SteadyClock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (LockHeld(dir)) {
    ::kill(static_cast<pid_t>(r.pid), SIGKILL);
    while (LockHeld(dir) && SteadyClock::now() < deadline + std::chrono::seconds(5)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  (quiet ? std::cerr : std::cout) << "sftd stopped (pid " << r.pid << ")\n";
  return 0;
}

int RunBridge(const std::string& data_dir) {
  std::string dir = data_dir.empty() ? DefaultDataDir() : data_dir;
  Running r = FindRunning(dir, std::chrono::seconds(2));
  if (!r.running) {
    std::cerr << "sftd bridge: no agent running for data dir " << dir << "\n";
    return 1;
  }
  ::signal(SIGPIPE, SIG_IGN);
  int sock = ConnectTcp(r.host, r.port);
  if (sock < 0) {
    std::cerr << "sftd bridge: cannot connect to " << r.addr() << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  // Copy stdin -> socket and socket -> stdout until the agent side closes.
  bool in_open = true;
  std::vector<char> buf(1 << 16);
  for (;;) {
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {sock, POLLIN, 0}};
    int n = ::poll(in_open ? fds : fds + 1, in_open ? 2 : 1, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (in_open && fds[0].revents) {
      ssize_t k = ::read(STDIN_FILENO, buf.data(), buf.size());
      if (k <= 0) {
        in_open = false;
        ::shutdown(sock, SHUT_WR);
      } else {
        (void)WriteFully(sock, std::string_view(buf.data(), static_cast<size_t>(k)), "agent socket");
      }
    }
    if (fds[1].revents) {
      ssize_t k = ::read(sock, buf.data(), buf.size());
      if (k <= 0) break;
      (void)WriteFully(STDOUT_FILENO, std::string_view(buf.data(), static_cast<size_t>(k)), "stdout");
    }
  }
  ::close(sock);
  return 0;
}

namespace {

Status GcThroughAgent(const std::string& dir, const ::sftctl::v1::CollectGarbageRequest& req,
                      ::sftctl::v1::CollectGarbageResponse* resp) {
  Running r = FindRunning(dir, std::chrono::seconds(2));
  if (!r.running) return UnavailableError("the agent of " + dir + " is starting or stopping; try again");
  SFT_ASSIGN_OR_RETURN(auto call, CallAgent(dir, r.addr(), std::chrono::minutes(30)));
  grpc::Status s = call->stub->CollectGarbage(&call->ctx, req, resp);
  if (!s.ok()) {
    return Status(static_cast<StatusCode>(s.error_code()), "agent " + r.addr() + ": " + s.error_message());
  }
  return OkStatus();
}

// No agent runs: hold its lock (so none starts meanwhile) and collect in this process.
Status GcOffline(const std::string& dir, const ::sftctl::v1::CollectGarbageRequest& req,
                 ::sftctl::v1::CollectGarbageResponse* resp) {
  if (!FileSystem::Default()->IsDirectory(dir)) return NotFoundError("no agent data dir at " + dir);
  SFT_RETURN_IF_ERROR(CheckDataDirTrust(dir));
  int lock_fd = ::open(Path(dir, "sftd.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) return ErrnoError("cannot open", Path(dir, "sftd.lock"), errno);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd);
    return UnavailableError("an agent started on " + dir + " meanwhile; run `sftd gc` again");
  }
  auto run = [&]() -> Status {
    SFT_ASSIGN_OR_RETURN(GcPolicy policy, GcPolicyFromRequest(req, GcPolicy{}));
    SFT_ASSIGN_OR_RETURN(auto store, StateStore::Open(Path(dir, "agent.db")));
    BlobStore blobs(Path(dir, "blobs"), store.get());
    SFT_RETURN_IF_ERROR(blobs.Init());
    GarbageCollector gc(dir, store.get(), &blobs);
    SFT_ASSIGN_OR_RETURN(GcResult result, gc.Run(policy, req.dry_run()));
    ToProto(result, resp);
    return OkStatus();
  };
  Status s = run();
  ::close(lock_fd);
  return s;
}

}  // namespace

int RunGc(const std::string& data_dir, const ::sftctl::v1::CollectGarbageRequest& req, bool json) {
  std::string dir = data_dir.empty() ? DefaultDataDir() : data_dir;
  ::sftctl::v1::CollectGarbageResponse resp;
  Status s = dir.empty()     ? FailedPreconditionError("no data dir: pass --data-dir or set SFTD_DATA_DIR")
             : LockHeld(dir) ? GcThroughAgent(dir, req, &resp)
                             : GcOffline(dir, req, &resp);
  if (!s.ok()) {
    std::cerr << "sftd gc: " << s.ToString() << "\n";
    return 1;
  }
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(resp, &out, options);
    std::cout << out << "\n";
  } else {
    std::cout << FormatGcReport(resp, req.dry_run());
  }
  return 0;
}

}  // namespace sftctl::agent
