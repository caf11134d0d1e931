#include "common/os/process_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#if defined(__linux__)
#include <sys/syscall.h>  // SYS_pidfd_open
#endif

#include <cstring>

#include "common/os/fd_util.h"

extern char** environ;

namespace sftctl {

namespace {

struct NamedSignal {
  int number;
  const char* name;
};

// The POSIX signals and the common extensions; numbers differ between systems, names do not.
// (glibc's sigabbrev_np does this on Linux only.)
constexpr NamedSignal kSignals[] = {
    {SIGHUP, "SIGHUP"},       {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"},   {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"},     {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},     {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"},     {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"},   {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"},     {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"},   {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"},     {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"},   {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"},     {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"},   {SIGXFSZ, "SIGXFSZ"},
    {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGSYS, "SIGSYS"},
#if defined(SIGIO)
    {SIGIO, "SIGIO"},
#endif
#if defined(SIGSTKFLT)
    {SIGSTKFLT, "SIGSTKFLT"},
#endif
#if defined(SIGPWR)
    {SIGPWR, "SIGPWR"},
#endif
#if defined(SIGEMT)
    {SIGEMT, "SIGEMT"},
#endif
#if defined(SIGINFO)
    {SIGINFO, "SIGINFO"},
#endif
};

// The allowlist of ChildEnvAllowed: a name, or a prefix when it ends with '*'.
struct EnvRule {
  const char* pattern;
  bool rank;
  bool stop_command;
  bool slurm_command = false;
};

constexpr EnvRule kEnvRules[] = {
    // All three: the system basics.
    {"PATH", true, true, true},
    {"HOME", true, true, true},
    {"USER", true, true, true},
    {"LOGNAME", true, true, true},
    {"SHELL", true, true, true},
    {"LANG", true, true, true},
    {"LANGUAGE", true, true, true},
    {"LC_*", true, true, true},
    {"TZ", true, true, true},
    {"TMPDIR", true, true, true},
    {"TERM", true, true, true},
    // A rank: the loader, GPUs, collectives and their transports, thread pools, torch, the trainer's
    // own switches, sanitizer options of a test build.
    {"LD_LIBRARY_PATH", true, false},
    {"LD_PRELOAD", true, false},
    {"CUDA_*", true, false},
    {"CUDNN_*", true, false},
    {"CUBLAS_*", true, false},
    {"CUBLASLT_*", true, false},
    {"NVIDIA_*", true, false},
    {"NCCL_*", true, false},
    {"GLOO_*", true, false},
    {"UCX_*", true, false},
    {"FI_*", true, false},
    {"OMP_*", true, false},
    {"KMP_*", true, false},
    {"GOMP_*", true, false},
    {"MKL_*", true, false},
    {"OPENBLAS_*", true, false},
    {"TORCH_*", true, false},
    {"PYTORCH_*", true, false},
    {"SFTCTL_*", true, false},
    {"NO_COLOR", true, false},
    {"ASAN_OPTIONS", true, false},
    {"UBSAN_OPTIONS", true, false},
    {"TSAN_OPTIONS", true, false},
    {"LSAN_OPTIONS", true, false},
    // A stop command: the cloud APIs it may call, and how it reaches them.
    {"LAMBDA_*", false, true},
    {"RUNPOD_*", false, true},
    {"AWS_*", false, true},
    {"AZURE_*", false, true},
    {"GOOGLE_*", false, true},
    {"CLOUDSDK_*", false, true},
    {"http_proxy", false, true},
    {"https_proxy", false, true},
    {"no_proxy", false, true},
    {"all_proxy", false, true},
    {"HTTP_PROXY", false, true},
    {"HTTPS_PROXY", false, true},
    {"NO_PROXY", false, true},
    {"ALL_PROXY", false, true},
    {"SSL_CERT_FILE", false, true},
    {"SSL_CERT_DIR", false, true},
    {"CURL_CA_BUNDLE", false, true},
    {"REQUESTS_CA_BUNDLE", false, true},
};

}  // namespace

std::string SignalName(int sig) {
  for (const NamedSignal& s : kSignals) {
    if (s.number == sig) return s.name;
  }
  return "signal " + std::to_string(sig);
}

std::string DescribeExit(int exit_code, int sig) {
  if (sig != 0) return "killed by signal " + std::to_string(sig) + " (" + SignalName(sig) + ")";
  return "exit code " + std::to_string(exit_code);
}

int OpenPidFd(pid_t pid) {
#if defined(__linux__) && defined(SYS_pidfd_open)
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

int FreeTcpPort(bool any_interface) {
  StatusOr<int> sock = MakeSocket(AF_INET, SOCK_STREAM, 0);
  if (!sock.ok()) return 29500;
  const int fd = *sock;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(any_interface ? INADDR_ANY : INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

namespace {

// Whether rule `r` is part of `kind`'s allowlist.
bool Applies(const EnvRule& r, ChildKind kind) {
  switch (kind) {
    case ChildKind::kRank:
      return r.rank;
    case ChildKind::kStopCommand:
      return r.stop_command;
    case ChildKind::kSlurmCommand:
      return r.slurm_command;
  }
  return false;
}

}  // namespace

std::vector<std::string> ChildEnvPatterns(ChildKind kind) {
  std::vector<std::string> out;
  for (const EnvRule& r : kEnvRules) {
    if (Applies(r, kind)) out.emplace_back(r.pattern);
  }
  return out;
}

bool ChildEnvAllowed(std::string_view name, ChildKind kind) {
  if (name.empty()) return false;
  for (const EnvRule& r : kEnvRules) {
    if (!Applies(r, kind)) continue;
    const std::string_view p = r.pattern;
    const bool match =
        p.back() == '*' ? name.size() >= p.size() && name.substr(0, p.size() - 1) == p.substr(0, p.size() - 1)
                        : name == p;
    if (match) return true;
  }
  return false;
}

std::vector<std::string> ChildEnvironment(ChildKind kind, const char* const* inherited) {
  if (inherited == nullptr) inherited = environ;
  std::vector<std::string> out;
  for (const char* const* e = inherited; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string_view::npos && ChildEnvAllowed(entry.substr(0, eq), kind)) out.emplace_back(entry);
  }
  return out;
}

}  // namespace sftctl
