// End-to-end tests of ProxyJump and ProxyCommand: two real sshd on 127.0.0.1 (sshd_fixture.h), a jump
// host and a target whose ssh config alias is reached through the jump host (ProxyJump) or through a
// ProxyCommand (OpenSSH's `ssh -W %h:%p` via the jump host), with a real sftd started on the target.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>

#include "client/remote/agent_session.h"
#include "client/remote/host_summary.h"
#include "client/remote/ssh/remote_agent.h"
#include "tests/ssh/sshd_fixture.h"

namespace sftctl::sshtest {
namespace {

using client::ConnectOptions;
using client::ConnectOverSsh;
using namespace std::chrono_literals;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// Direct children of this test process whose command name is `comm`.
std::vector<pid_t> ChildrenNamed(const std::string& comm) {
  std::vector<pid_t> out;
  for (auto [pid, ppid] : ProcessParents()) {
    std::string c = ::sftctl::testing::ReadProcFile("/proc/" + std::to_string(pid) + "/comm");
    if (ppid == ::getpid() && c == comm + "\n") out.push_back(pid);
  }
  return out;
}

// A jump host and a target. The jump host's HOME holds the ssh config and a known_hosts with both
// host keys; HOME points there and ssh-agent is off, so nothing of the machine leaks in.
class ProxyRoute : public ::testing::Test {
 protected:
  void SetUp() override { Start({}); }

  void Start(SshdOptions jump_opts) {
    agent_.reset();  // restore the environment before the next one saves it
    home_.reset();
    jump_opts.log_level = "DEBUG1";  // logs the direct-tcpip request
    auto j = SshdFixture::Start(jump_opts);
    ASSERT_TRUE(j.ok()) << j.status().ToString();
    jump_ = std::move(*j);
    auto t = SshdFixture::Start();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    target_ = std::move(*t);
    ASSERT_TRUE(AppendToFile(jump_->known_hosts(), target_->KnownHostsLine()));
    home_ = std::make_unique<ScopedEnv>("HOME", jump_->home().c_str());
    agent_ = std::make_unique<ScopedEnv>("SSH_AUTH_SOCK", nullptr);
    WriteConfig("");
  }

  // Aliases: bastion (the jump host), gpu (target via ProxyJump), gpu-cmd (target via ProxyCommand),
  // gpu-2hops (ProxyJump bastion,hop2: the target's sshd as a second jump host to itself), plus `extra`.
  void WriteConfig(const std::string& extra) const {
    const std::string u = target_->user(), p1 = std::to_string(jump_->port()),
                      p2 = std::to_string(target_->port());
    const std::string target_block = "  HostName 127.0.0.1\n  Port " + p2 + "\n  User " + u +
                                     "\n  IdentityFile " + target_->user_key() + "\n";
    std::string c = extra;
    c += "Host bastion\n  HostName 127.0.0.1\n  Port " + p1 + "\n  User " + u + "\n  IdentityFile " +
         jump_->user_key() + "\n";
    c += "Host gpu hop2\n" + target_block + "Match originalhost gpu\n  ProxyJump bastion\n";
    c += "Host gpu-2hops\n" + target_block + "  ProxyJump bastion,hop2\n";
    c += "Host gpu-cmd\n" + target_block + "  ProxyCommand ssh -F /dev/null -i " + jump_->user_key() +
         " -o UserKnownHostsFile=" + jump_->known_hosts() +
         " -o StrictHostKeyChecking=yes -o BatchMode=yes -p " + p1 + " -W %h:%p " + u + "@127.0.0.1\n";
    ASSERT_TRUE(WriteWholeFile(jump_->ssh_config(), c));
  }

  ConnectOptions Options(const std::string& alias) const {
    ConnectOptions o = target_->Options();  // the target's sftd and agent data dir
    o.host = alias;
    o.identity_file.clear();
    o.known_hosts_file = jump_->known_hosts();
    o.ssh_config_file = jump_->ssh_config();
    return o;
  }
  std::string JumpDisplay() const { return jump_->user() + "@127.0.0.1:" + std::to_string(jump_->port()); }
  std::string TargetDisplay() const {
    return target_->user() + "@127.0.0.1:" + std::to_string(target_->port());
  }

  std::unique_ptr<SshdFixture> jump_, target_;
  std::unique_ptr<ScopedEnv> home_, agent_;
};

TEST_F(ProxyRoute, ProxyJumpReachesTheAgentOnTheTarget) {
  auto c = ConnectOverSsh(Options("gpu"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
  const std::string d = (*c)->description();
  EXPECT_EQ(d.rfind(TargetDisplay() + " through jump host " + JumpDisplay() + " via direct-tcpip", 0), 0u)
      << d;
  // The target was reached through the jump host: sshd logged the forwarding request to its port.
  EXPECT_NE(jump_->Log().find("port " + std::to_string(target_->port())), std::string::npos) << jump_->Log();
  EXPECT_EQ(Count(jump_->Log(), "Accepted publickey"), 1u);
  EXPECT_GE(Count(target_->Log(), "Accepted publickey"), 1u);
}

TEST_F(ProxyRoute, TwoHopChainAndTheSftctlBinaryThroughIt) {
  auto c = ConnectOverSsh(Options("gpu-2hops"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
  const std::string d = (*c)->description();
  EXPECT_EQ(d.rfind(TargetDisplay() + " through jump host " + JumpDisplay() + ", then jump host " +
                        TargetDisplay() + " via direct-tcpip",
                    0),
            0u)
      << d;
  c->reset();
  // The real CLI with HOME's ssh config: `sftctl list --host gpu` through the jump host.
  CommandResult r =
      RunCommand({::sftctl::testing::Bin("sftctl"), "list", "--host", "gpu", "--sftd", target_->sftd_path(),
                  "--agent-data-dir", target_->agent_data_dir(), "--json"},
                 {"HOME=" + jump_->home()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Count(jump_->Log(), "Accepted publickey"), 2u) << r.output;
}

TEST_F(ProxyRoute, ProxyCommandReachesTheAgentAndItsChildIsReaped) {
  {
    auto c = ConnectOverSsh(Options("gpu-cmd"));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(Health(**c), grpc::StatusCode::OK);
    const std::string d = (*c)->description();
    EXPECT_EQ(d.rfind(TargetDisplay() + " through ProxyCommand `ssh -F /dev/null", 0), 0u) << d;
    EXPECT_NE(d.find(" -W 127.0.0.1:" + std::to_string(target_->port()) + " "), std::string::npos) << d;
    EXPECT_EQ(ChildrenNamed("ssh").size(), 1u);
  }
  EXPECT_TRUE(ChildrenNamed("ssh").empty());
  EXPECT_EQ(Count(jump_->Log(), "Accepted publickey"), 1u);  // OpenSSH's ssh logged in to the jump host
}

TEST_F(ProxyRoute, ProxyCommandThatExitsAtOnceReportsItsStderr) {
  WriteConfig(
      "Host broken\n  HostName 10.9.9.9\n  ProxyCommand sh -c 'echo \"proxy: no route to %h\" >&2; exit "
      "3'\n");
  const auto t0 = std::chrono::steady_clock::now();
  auto c = ConnectOverSsh(Options("broken"));
  ASSERT_FALSE(c.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
  const std::string m = c.status().message();
  EXPECT_NE(m.find("SSH handshake failed"), std::string::npos) << m;
  EXPECT_NE(
      m.find("ProxyCommand `sh -c 'echo \"proxy: no route to 10.9.9.9\" >&2; exit 3'` ended (exit code 3); "
             "its stderr: proxy: no route to 10.9.9.9)"),
      std::string::npos)
      << m;
  EXPECT_TRUE(ChildrenNamed("sh").empty());
}

TEST_F(ProxyRoute, ChangedTargetKeyBehindTheJumpIsRefusedUnderTheTargetsName) {
  ASSERT_TRUE(target_->RestartWithNewHostKey().ok());
  const size_t log_start = target_->LogSize();
  ConnectOptions o = Options("gpu");
  o.accept_new_host_key = true;  // never accepts a changed key
  auto c = ConnectOverSsh(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnauthenticated);
  const std::string m = c.status().message();
  EXPECT_EQ(m.rfind(TargetDisplay() + ": HOST KEY MISMATCH: the ssh-ed25519 key of [127.0.0.1]:" +
                        std::to_string(target_->port()) + " (" + target_->host_key_fingerprint() + ")",
                    0),
            0u)
      << m;
  EXPECT_EQ(m.find("[127.0.0.1]:" + std::to_string(jump_->port())), std::string::npos) << m;
  // The jump host authenticated us; the impostor target saw no authentication attempt.
  EXPECT_EQ(Count(jump_->Log(), "Accepted publickey"), 1u);
  EXPECT_EQ(target_->Log().substr(log_start).find("publickey"), std::string::npos);
}

TEST_F(ProxyRoute, AJumpHostThatRefusesForwardingIsNamed) {
  jump_.reset();
  target_.reset();
  Start({.allow_tcp_forwarding = false});
  auto c = ConnectOverSsh(Options("gpu"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status().ToString();
  EXPECT_EQ(c.status().message().rfind("cannot reach 127.0.0.1:" + std::to_string(target_->port()) +
                                           " through jump host " + JumpDisplay() + ": ",
                                       0),
            0u)
      << c.status().message();
}

TEST_F(ProxyRoute, ReconnectAfterTheJumpHostDropsRebuildsTheChain) {
  ConnectOptions o = Options("gpu");
  o.keepalive_s = 1;
  auto c = ConnectOverSsh(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  client::Reconnector rc(std::make_unique<client::AgentSession>(std::move(*c)),
                         client::MakeSessionFactory(o));
  v1::HealthResponse h;
  ASSERT_TRUE(client::GetHealth(&rc, &h).ok());
  ASSERT_EQ(rc.reconnects(), 0);
  ASSERT_TRUE(jump_->DropSessions().ok());  // the jump host's connection dies; the target's sshd lives on
  Status s = client::GetHealth(&rc, &h);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_GE(rc.reconnects(), 1);
  EXPECT_EQ(Count(jump_->Log(), "Accepted publickey"), 2u);  // a second session to the jump host
}

}  // namespace
}  // namespace sftctl::sshtest
