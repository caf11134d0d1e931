// End-to-end tests of the SSH transport: ConnectOverSsh against a real sshd (sshd_fixture.h) and a real
// sftd (SFTCTL_BIN_DIR).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "client/remote/ssh/remote_agent.h"
#include "client/remote/ssh/ssh_session.h"
#include "common/mutex.h"
#include "tests/ssh/sshd_fixture.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/test_paths.h"

namespace sftctl::sshtest {
namespace {

using client::ConnectOptions;
using client::ConnectOverSsh;
using client::Transport;
using ::sftctl::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using namespace std::chrono_literals;

std::unique_ptr<SshdFixture> StartSshd(SshdOptions o = {}) {
  auto f = SshdFixture::Start(o);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  return f.ok() ? std::move(*f) : nullptr;
}

std::string Version(const client::AgentConnection& c) {
  auto stub = c.NewStub();
  grpc::ClientContext ctx;
  c.Authorize(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  v1::VersionResponse v;
  grpc::Status s = stub->Version(&ctx, v1::VersionRequest(), &v);
  return s.ok() ? v.version() : "error: " + s.error_message();
}

bool AgentRunning(const SshdFixture& f) {
  return RunCommand({f.sftd_path(), "status", "--data-dir", f.agent_data_dir()}).exit_code == 0;
}

// A HOME with an empty .ssh, so no default key or config of the machine leaks into a test.
std::string EmptyHome(const SshdFixture& f) {
  std::string h = f.dir() + "/empty-home";
  std::filesystem::create_directories(h);
  return h;
}

// A program that took the address an agent left (on a shared host, another user's): it records
// every call that reaches it. `answer_identify`: it answers Identify with a proof it made up;
// otherwise it is a server that knows no Identify (UNIMPLEMENTED), as an older agent would be.
class PortSquatter final : public v1::Agent::Service {
 public:
  explicit PortSquatter(bool answer_identify) : answer_identify_(answer_identify) {}
  grpc::Status Identify(grpc::ServerContext* ctx, const v1::IdentifyRequest*,
                        v1::IdentifyResponse* resp) override {
    Record(*ctx, "Identify");
    if (!answer_identify_) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
    resp->set_addr(addr_);
    resp->set_proof(std::string(32, 'x'));
    return grpc::Status::OK;
  }
  grpc::Status Version(grpc::ServerContext* ctx, const v1::VersionRequest*,
                       v1::VersionResponse* resp) override {
    Record(*ctx, "Version");
    resp->set_protocol(1);
    return grpc::Status::OK;
  }
  grpc::Status Health(grpc::ServerContext* ctx, const v1::HealthRequest*, v1::HealthResponse*) override {
    Record(*ctx, "Health");
    return grpc::Status::OK;
  }
  // Listens on 127.0.0.1:port (no SO_REUSEPORT: it gets the port only once the agent has left it).
  bool Listen(int port) {
    addr_ = "127.0.0.1:" + std::to_string(port);
    grpc::ServerBuilder b;
    int bound = 0;
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    b.AddListeningPort(addr_, grpc::InsecureServerCredentials(), &bound);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    return server_ != nullptr && bound == port;
  }
  ~PortSquatter() override {
    if (server_) server_->Shutdown();
  }
  std::vector<std::string> calls() {
    MutexLock l(&mu_);
    return calls_;
  }
  std::string authorizations() {
    MutexLock l(&mu_);
    return authorizations_;
  }

 private:
  void Record(const grpc::ServerContext& ctx, const std::string& method) {
    MutexLock l(&mu_);
    calls_.push_back(method);
    for (const auto& [k, v] : ctx.client_metadata()) {
      if (k == "authorization") authorizations_ += method + ": " + std::string(v.data(), v.size()) + "\n";
    }
  }
  const bool answer_identify_;
  std::string addr_;
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  std::vector<std::string> calls_ GUARDED_BY(mu_);
  std::string authorizations_ GUARDED_BY(mu_);
};

// A client remembers the agent's address for its later connections. When the agent has moved and
// another program listens where it was, that program gets no token: it cannot prove it is the agent,
// so the client asks the host again and connects to the agent where it now is.
TEST(SshConnect, AProgramOnTheAgentsOldPortGetsNoToken) {
  for (bool answer_identify : {true, false}) {
    SCOPED_TRACE(answer_identify ? "squatter answers Identify" : "squatter knows no Identify");
    auto f = StartSshd();
    ASSERT_TRUE(f);
    ConnectOptions o = f->Options();
    o.known_agents = client::NewKnownAgents();  // shared by both connections below
    auto c = ConnectOverSsh(o);                 // remembers the agent's address
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    const std::string token = (*c)->token();
    c->reset();
    const int old_port = std::stoi(::sftctl::testing::ReadWholeFile(f->agent_data_dir() + "/sftd.port"));
    ASSERT_EQ(RunCommand({f->sftd_path(), "stop", "--data-dir", f->agent_data_dir()}).exit_code, 0);
    PortSquatter squatter(answer_identify);
    ASSERT_TRUE(squatter.Listen(old_port)) << "port " << old_port;

    auto again = ConnectOverSsh(o);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(Health(**again), grpc::StatusCode::OK);
    EXPECT_NE(std::stoi(::sftctl::testing::ReadWholeFile(f->agent_data_dir() + "/sftd.port")), old_port);
    // The remembered address was tried, and the program there got no token in any call.
    EXPECT_EQ(squatter.calls(), std::vector<std::string>{"Identify"});
    EXPECT_EQ(squatter.authorizations(), "");
    EXPECT_THAT(squatter.authorizations(), Not(HasSubstr(token)));
  }
}

// An error that quotes what `sftd status --json --with-token` printed never quotes the token.
TEST(SshConnect, AnErrorQuotingTheStatusLeavesTheTokenOut) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  const std::string secret = "5ec7e7t0ken5ec7e7t0ken5ec7e7t0ken";
  const std::string fake = f->dir() + "/sftd-bad-status";
  ::sftctl::testing::WriteWholeFile(fake,
                                    "#!/bin/sh\necho '{\"running\": true, \"addr\": \"not-an-address\", "
                                    "\"token_file\": \"/x\", \"token\": \"" +
                                        secret + "\"}'\n");
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  ConnectOptions o = f->Options();
  o.sftd = fake;
  auto c = ConnectOverSsh(o);
  EXPECT_THAT(c, StatusIs(StatusCode::kInternal, AllOf(HasSubstr("gave no usable agent address"),
                                                       HasSubstr("(redacted)"), Not(HasSubstr(secret)))));
}

TEST(SshConnect, UnknownHostIsRefusedWithFingerprintAndFlag) {
  auto f = StartSshd({.known_hosts = KnownHosts::kNone});
  ASSERT_TRUE(f);
  auto c = ConnectOverSsh(f->Options());
  EXPECT_THAT(c, StatusIs(StatusCode::kUnauthenticated,
                          AllOf(HasSubstr(f->host_key_fingerprint()), HasSubstr("--accept-new-host-key"),
                                HasSubstr("unknown host"))));
  EXPECT_EQ(f->ReadKnownHostsForTest(), "");  // nothing recorded
  EXPECT_THAT(f->Log(), Not(HasSubstr("Accepted publickey")));
}

TEST(SshConnect, AcceptNewHostKeyRecordsItAndCreatesDotSsh) {
  auto f = StartSshd({.known_hosts = KnownHosts::kNone});
  ASSERT_TRUE(f);
  std::string home = f->dir() + "/fresh-home";  // no .ssh yet: the default known_hosts lives there
  std::filesystem::create_directories(home);
  ScopedEnv env_home("HOME", home.c_str());
  ScopedEnv env_agent("SSH_AUTH_SOCK", nullptr);
  ConnectOptions o = f->Options();
  o.known_hosts_file.clear();
  o.accept_new_host_key = true;
  {
    auto c = ConnectOverSsh(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
  }
  struct stat st {};
  ASSERT_EQ(::stat((home + "/.ssh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::string kh = ReadWholeFile(home + "/.ssh/known_hosts");
  EXPECT_THAT(kh, HasSubstr(f->KnownHostsLine()));
  // OpenSSH agrees with what was recorded.
  EXPECT_EQ(RunCommand({"ssh-keygen", "-F", "[127.0.0.1]:" + std::to_string(f->port()), "-f",
                        home + "/.ssh/known_hosts"})
                .exit_code,
            0);
  o.accept_new_host_key = false;
  auto again = ConnectOverSsh(o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(Health(**again), grpc::StatusCode::OK);
}

TEST(SshConnect, HashedKnownHostsEntryMatches) {
  auto f = StartSshd({.known_hosts = KnownHosts::kHashed});
  ASSERT_TRUE(f);
  ASSERT_THAT(f->ReadKnownHostsForTest(), StartsWith("|1|"));
  auto c = ConnectOverSsh(f->Options());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
}

TEST(SshConnect, ChangedHostKeyIsRefusedBeforeAuthentication) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ASSERT_TRUE(f->RestartWithNewHostKey().ok());
  size_t log_start = f->LogSize();
  ConnectOptions o = f->Options();
  o.accept_new_host_key = true;  // accepts new hosts, never changed keys
  auto c = ConnectOverSsh(o);
  EXPECT_THAT(c, StatusIs(StatusCode::kUnauthenticated,
                          AllOf(HasSubstr("HOST KEY MISMATCH"), HasSubstr(f->host_key_fingerprint()),
                                HasSubstr("ssh-keygen -R"))));
  // sshd saw the connection but no authentication attempt at all.
  ASSERT_TRUE(
      WaitFor([&] { return f->Log().substr(log_start).find("127.0.0.1") != std::string::npos; }, 10s));
  EXPECT_THAT(f->Log().substr(log_start), AllOf(Not(HasSubstr("publickey")), Not(HasSubstr("Accepted"))));
  EXPECT_THAT(f->ReadKnownHostsForTest(), Not(HasSubstr(f->host_key_fingerprint())));
}

TEST(SshConnect, WrongUserKeyIsRefusedNamingUserHostAndKeys) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ScopedEnv env_home("HOME", EmptyHome(*f).c_str());
  ScopedEnv env_agent("SSH_AUTH_SOCK", nullptr);
  auto wrong = f->NewUserKey("ed25519", /*authorize=*/false);
  ASSERT_TRUE(wrong.ok());
  ConnectOptions o = f->Options();
  o.identity_file = *wrong;
  auto c = ConnectOverSsh(o);
  EXPECT_THAT(
      c, StatusIs(StatusCode::kUnauthenticated,
                  AllOf(HasSubstr("authentication failed for " + f->user() + "@127.0.0.1"),
                        HasSubstr(*wrong + " (ssh-ed25519, refused by the server)"), Not(HasSubstr("RSA")))));
}

TEST(SshConnect, RsaUserKeyGetsTheLibssh2Explanation) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ScopedEnv env_home("HOME", EmptyHome(*f).c_str());
  ScopedEnv env_agent("SSH_AUTH_SOCK", nullptr);
  auto rsa = f->NewUserKey("rsa", /*authorize=*/true);
  ASSERT_TRUE(rsa.ok());
  ConnectOptions o = f->Options();
  o.identity_file = *rsa;
  auto c = ConnectOverSsh(o);
  EXPECT_THAT(
      c, StatusIs(StatusCode::kUnauthenticated,
                  AllOf(HasSubstr("RSA key " + *rsa), HasSubstr("libssh2 1.10"), HasSubstr("OpenSSH >= 8.8"),
                        HasSubstr("ssh-keygen -t ed25519"), HasSubstr("authorized_keys"))));
}

TEST(SshConnect, SshConfigAliasResolvesHostUserPortAndIdentity) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ScopedEnv env_home("HOME", f->home().c_str());
  ScopedEnv env_agent("SSH_AUTH_SOCK", nullptr);
  std::filesystem::copy_file(f->user_key(), f->home() + "/.ssh/id_box");
  WriteWholeFile(f->ssh_config(), "Host gpu-?\n  HostName 127.0.0.1\n  Port " + std::to_string(f->port()) +
                                      "\n  User " + f->user() +
                                      "\n  IdentityFile ~/.ssh/id_box\nHost *\n  Port 1\n");
  ConnectOptions o = f->Options();
  o.host = "gpu-7";
  o.identity_file.clear();
  auto c = ConnectOverSsh(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->host(), "gpu-7");
  EXPECT_THAT((*c)->description(), HasSubstr(f->user() + "@127.0.0.1:" + std::to_string(f->port())));
  EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
}

TEST(SshConnect, ForwardingStartsTheAgentOnDemandAndReachesIt) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ASSERT_FALSE(AgentRunning(*f));
  ConnectOptions o = f->Options();
  o.start_agent = false;
  auto refused = ConnectOverSsh(o);
  EXPECT_THAT(refused, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("sftd is not running")));

  o.start_agent = true;
  auto c = ConnectOverSsh(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(AgentRunning(*f));
  EXPECT_THAT((*c)->description(), HasSubstr("via direct-tcpip"));
  EXPECT_EQ((*c)->token().size(), 64u);
  EXPECT_FALSE(Version(**c).empty());
  EXPECT_THAT(Version(**c), Not(StartsWith("error")));
  EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
  // A second connection finds the running agent.
  auto c2 = ConnectOverSsh(o);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_EQ((*c2)->token(), (*c)->token());
  EXPECT_EQ(Health(**c2), grpc::StatusCode::OK);
}

TEST(SshConnect, BridgeWhenTheServerRefusesForwarding) {
  auto f = StartSshd({.allow_tcp_forwarding = false});
  ASSERT_TRUE(f);
  ConnectOptions o = f->Options();
  o.transport = Transport::kForward;
  auto forced = ConnectOverSsh(o);
  EXPECT_THAT(forced, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("refused port forwarding")));

  o.transport = Transport::kAuto;
  auto c = ConnectOverSsh(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_THAT((*c)->description(), HasSubstr("via sftd bridge"));
  EXPECT_THAT(Version(**c), Not(StartsWith("error")));
  for (int i = 0; i < 20; ++i) ASSERT_EQ(Health(**c), grpc::StatusCode::OK);
}

TEST(SshConnect, ForcedBridgeWorksWithForwardingAllowed) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ConnectOptions o = f->Options();
  o.transport = Transport::kBridge;
  auto c = ConnectOverSsh(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_THAT((*c)->description(), HasSubstr("via sftd bridge"));
  EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
}

TEST(SshConnect, MissingSftdSaysHowToPassIt) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ConnectOptions o = f->Options();
  o.sftd = f->dir() + "/no/such/sftd";
  auto c = ConnectOverSsh(o);
  EXPECT_THAT(c, StatusIs(StatusCode::kNotFound,
                          AllOf(HasSubstr("sftd is not installed on the host"), HasSubstr("--sftd"))));
  // Without --sftd: `sftd` on PATH, then ~/.local/bin/sftd (of the remote user).
  std::string remote_home = ::getpwuid(::getuid())->pw_dir;
  if (RunCommand({"sh", "-c", "command -v sftd"}).exit_code == 0 ||
      std::filesystem::exists(remote_home + "/.local/bin/sftd")) {
    GTEST_SKIP() << "sftd is installed on this machine";
  }
  o.sftd.clear();
  c = ConnectOverSsh(o);
  EXPECT_THAT(c, StatusIs(StatusCode::kNotFound, HasSubstr("--sftd")));
}

TEST(SshConnect, DroppedSessionMakesRpcsUnavailableAndDestructionPrompt) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  ConnectOptions o = f->Options();
  o.keepalive_s = 1;
  auto c = ConnectOverSsh(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(Health(**c), grpc::StatusCode::OK);
  ASSERT_TRUE(f->DropSessions().ok());
  auto t0 = std::chrono::steady_clock::now();
  grpc::StatusCode code = grpc::StatusCode::OK;
  EXPECT_TRUE(WaitFor(
      [&] {
        code = Health(**c, 2s);
        return code == grpc::StatusCode::UNAVAILABLE;
      },
      15s))
      << "last code " << code;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  auto d0 = std::chrono::steady_clock::now();
  c->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - d0, 3s);
  // The listener is still up: a new connection works.
  auto again = ConnectOverSsh(o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(Health(**again), grpc::StatusCode::OK);
}

// A setup command that prints nothing for longer than the keepalive interval still finishes (libssh2's
// blocking waits used to stop at the keepalive interval with LIBSSH2_ERROR_TIMEOUT), and a host that
// floods a setup command's output gets a clear error instead of unbounded memory.
TEST(SshSession, ExecOutlivesTheKeepaliveIntervalAndRefusesAFlood) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  client::ssh::SessionOptions so;
  auto host = client::ssh::ResolveHost(f->host(), f->ssh_config(), EmptyHome(*f), "");
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  so.host = *host;
  so.identity_file = f->user_key();
  so.home = EmptyHome(*f);
  so.known_hosts_file = f->known_hosts();
  so.keepalive_s = 1;
  auto s = client::ssh::SshSession::Connect(so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto quiet = (*s)->Exec("sleep 3; echo done", 20);
  ASSERT_TRUE(quiet.ok()) << quiet.status().ToString();
  EXPECT_EQ(quiet->out, "done\n");
  EXPECT_EQ(quiet->exit_code, 0);
  auto flood = (*s)->Exec("head -c 6000000 /dev/zero", 20);
  EXPECT_THAT(flood, StatusIs(StatusCode::kResourceExhausted, HasSubstr("printed more than 4 MiB")));
}

// Exec with input (how `sftctl bootstrap` uploads its script and the source archive): every byte of
// a few MiB reaches the command's stdin, then EOF, and the command's output comes back.
TEST(SshSession, ExecWritesItsInputThenReadsTheOutput) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  auto s = client::OpenSshSession(f->Options());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::string input(3 << 20, '\0');
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<char>((i * 131) ^ (i >> 11));
  const std::string file = f->dir() + "/uploaded";
  auto r = (*s)->Exec("cat > " + file + " && wc -c < " + file, input, 60);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code, 0) << r->err;
  EXPECT_EQ(r->out, std::to_string(input.size()) + "\n");
  EXPECT_EQ(ReadWholeFile(file), input);
  auto empty = (*s)->Exec("wc -c", "", 20);  // no input: stdin is at EOF at once
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(empty->out, "0\n");
}

// The host is not trusted: an `sftd` there that answers with the wrong JSON types, an address that
// is not an address, or a token with control characters gets a clear error, never a crash (an
// uncaught nlohmann type_error used to abort sftctl).
TEST(SshConnect, AHostileSftdGetsAClearErrorNotACrash) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  struct Case {
    const char* status_json;
    const char* token;
    const char* expect;
  } cases[] = {
      {R"({"running":"yes","addr":1})", "t", "unexpected output from"},
      {R"({"running":true,"addr":"\u001b]0;owned\u0007:99999","token_file":"TOKEN"})", "t",
       "gave no usable agent address"},
      {R"({"running":true,"addr":"evil.example:80","token_file":"TOKEN"})", "t",
       "gave no usable agent address"},
      {R"({"running":true,"addr":"127.0.0.1:9","token_file":"TOKEN"})", "tok\033[2Jen", "is not a token"},
  };
  for (const Case& c : cases) {
    const std::string token_file = f->dir() + "/evil-token";
    {
      std::ofstream t(token_file);
      t << c.token << "\n";
    }
    std::string json = c.status_json;
    for (size_t p; (p = json.find("TOKEN")) != std::string::npos;) json.replace(p, 5, token_file);
    const std::string script = f->dir() + "/evil-sftd";
    {
      std::ofstream sh(script);
      sh << "#!/bin/sh\nprintf '%s\\n' '" << json << "'\n";
    }
    ::chmod(script.c_str(), 0755);
    ConnectOptions o = f->Options();
    o.sftd = script;
    auto conn = ConnectOverSsh(o);
    ASSERT_FALSE(conn.ok()) << c.status_json;
    EXPECT_THAT(conn, StatusIs(StatusCode::kInternal, HasSubstr(c.expect)));
  }
}

TEST(SshConnect, SshAgentAuthentication) {
  auto f = StartSshd();
  ASSERT_TRUE(f);
  SshAgentProcess agent;
  ASSERT_THAT(agent.Start(f->dir()), StatusIs(StatusCode::kOk, ""));
  ASSERT_THAT(agent.Add(f->user_key()), StatusIs(StatusCode::kOk, ""));
  ScopedEnv env_home("HOME", EmptyHome(*f).c_str());
  ScopedEnv env_agent("SSH_AUTH_SOCK", agent.socket().c_str());
  ConnectOptions o = f->Options();
  o.identity_file.clear();
  auto c = ConnectOverSsh(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
  EXPECT_THAT(f->Log(), HasSubstr("Accepted publickey"));
}

// The fixture itself, with OpenSSH's own client: the e2e tests of other commands rely on it.
TEST(SshdFixture, OpenSshClientConnectsDropsAndSeesChangedKey) {
  auto sshd = SshdFixture::Start();
  ASSERT_TRUE(sshd.ok()) << sshd.status().ToString();
  auto& f = **sshd;
  std::vector<std::string> ssh = {"ssh",
                                  "-F",
                                  "/dev/null",
                                  "-i",
                                  f.user_key(),
                                  "-p",
                                  std::to_string(f.port()),
                                  "-o",
                                  "UserKnownHostsFile=" + f.known_hosts(),
                                  "-o",
                                  "StrictHostKeyChecking=yes",
                                  "-o",
                                  "BatchMode=yes",
                                  f.user() + "@127.0.0.1",
                                  "echo",
                                  "hello"};
  CommandResult r = RunCommand(ssh);
  ASSERT_EQ(r.exit_code, 0) << r.output << "\n" << f.Log();
  EXPECT_THAT(r.output, HasSubstr("hello"));
  EXPECT_THAT(f.Log(), HasSubstr("Accepted publickey"));
  EXPECT_THAT(f.host_key_fingerprint(), StartsWith("SHA256:"));
  // Hashed known_hosts still matches.
  ASSERT_TRUE(f.WriteKnownHosts(KnownHosts::kHashed).ok());
  EXPECT_THAT(f.ReadKnownHostsForTest(), StartsWith("|1|"));
  EXPECT_EQ(RunCommand(ssh).exit_code, 0);
  ASSERT_TRUE(f.DropSessions().ok());
  std::string old_fp = f.host_key_fingerprint();
  ASSERT_TRUE(f.RestartWithNewHostKey().ok());
  EXPECT_NE(f.host_key_fingerprint(), old_fp);
  r = RunCommand(ssh);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("HOST IDENTIFICATION HAS CHANGED"));
  EXPECT_TRUE(f.Stop().ok());
}

}  // namespace
}  // namespace sftctl::sshtest
