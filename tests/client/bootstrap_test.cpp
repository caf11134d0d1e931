// `sftctl bootstrap`'s policy (client/bootstrap/bootstrap.h) and the host script's probe and poll
// (deploy/host/sftctl-host.sh), without a remote host: the real script runs here under a temporary
// HOME, and a scripted HostShell plays the host for the decisions (up to date, upload only what the
// host lacks, follow the worker, report its failure with the log). The whole thing against a real
// fresh Debian 13 host is tests/remote/bootstrap_e2e.sh.
#include "client/bootstrap/bootstrap.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "client/bootstrap/host_probe.h"
#include "common/sha256.h"
#include "common/source_id.h"
#include "tests/ssh/sshd_fixture.h"
#include "tests/util/command.h"
#include "tests/util/offset_clock.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl::client {
namespace {

using sftctl::testing::OffsetClock;
using sftctl::testing::RunShell;
using sftctl::testing::StatusIs;
using sftctl::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kScript = std::string(SFTCTL_SOURCE_DIR) + "/deploy/host/sftctl-host.sh";

std::string HostScript(const std::string& home, const std::string& args) {
  return RunShell("HOME=" + home + " XDG_CONFIG_HOME= bash " + kScript + " " + args + " 2>&1").output;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(HostScript, ProbeDescribesThisMachine) {
  TempDir home("probe");
  auto p = ParseHostProbe(HostScript(home.path(), "probe"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->arch, RunShell("uname -m | tr -d '\\n'").output);
  EXPECT_EQ(p->os_id, RunShell(". /etc/os-release; printf %s \"$ID\"").output);
  EXPECT_EQ(p->home, home.path());
  EXPECT_GE(p->nproc, 1);
  EXPECT_GT(p->home_free_mib, 0);
  EXPECT_EQ(p->installed, "");
  EXPECT_EQ(p->worker, "");
  EXPECT_EQ(p->package_manager, "apt");  // Debian here
  // This machine builds sftctl: none of the host packages is missing, and there is a LibTorch.
  EXPECT_TRUE(p->missing_packages.empty()) << p->missing_packages.front();
  EXPECT_FALSE(p->TorchPrefix().empty());
  const std::string table = FormatHostProbe(*p);
  EXPECT_THAT(table, HasSubstr("  OS        " + p->os_name + ", " + p->arch));
  EXPECT_THAT(table, HasSubstr("  sftctl    not installed"));
}

// Debian 11 has no libcli11-dev: the worker unpacks a private copy without root, so the probe must not
// list it as a package to install (the client would tell the user to apt-get install what apt lacks).
// dpkg-query and apt-cache are replaced on PATH by ones that know no libcli11-dev.
TEST(HostScript, CliElevenWithoutAnAptCandidateIsNotAMissingPackage) {
  TempDir home("probe");
  TempDir bin("fake-apt");
  WriteFile(bin.path() + "/dpkg-query",
            "#!/bin/sh\nfor a; do last=$a; done\n"
            "[ \"$last\" = libcli11-dev ] && exit 1\nexec /usr/bin/dpkg-query \"$@\"\n");
  WriteFile(bin.path() + "/apt-cache",
            "#!/bin/sh\nfor a; do last=$a; done\n"
            "[ \"$last\" = libcli11-dev ] && { echo 'libcli11-dev:'; echo '  Candidate: (none)'; exit 0; }\n"
            "exec /usr/bin/apt-cache \"$@\"\n");
  RunShell("chmod +x " + bin.path() + "/dpkg-query " + bin.path() + "/apt-cache");
  const std::string env = "PATH=" + bin.path() + ":$PATH ";
  auto p = ParseHostProbe(
      RunShell(env + "HOME=" + home.path() + " XDG_CONFIG_HOME= bash " + kScript + " probe 2>&1").output);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  for (const auto& m : p->missing_packages) EXPECT_NE(m, "libcli11-dev");
  // With a candidate (Ubuntu 22.04, Debian 12+), it is a package like the others.
  WriteFile(bin.path() + "/apt-cache", "#!/bin/sh\necho '  Candidate: 2.1.2+ds-1'\n");
  auto q = ParseHostProbe(
      RunShell(env + "HOME=" + home.path() + " XDG_CONFIG_HOME= bash " + kScript + " probe 2>&1").output);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_THAT(q->missing_packages, ::testing::Contains("libcli11-dev"));
}

TEST(HostScript, ProbeReportsInstalledSourceAndSurvivingStorage) {
  TempDir home("probe");
  RunShell("mkdir -p " + home.path() + "/.local/share/sftctl/bootstrap");
  WriteFile(home.path() + "/.local/share/sftctl/installed", "abc123\n");
  WriteFile(home.path() + "/.local/share/sftctl/bootstrap/status", "done abc123\n");
  auto p = ParseHostProbe(HostScript(home.path(), "probe"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->installed, "abc123");
  EXPECT_EQ(p->status, "done abc123");
}

TEST(HostScript, PollReturnsStatusAndTheLogFromAnOffset) {
  TempDir home("poll");
  const std::string boot = home.path() + "/.local/share/sftctl/bootstrap";
  RunShell("mkdir -p " + boot);
  WriteFile(boot + "/status", "running build-agent\n");
  WriteFile(boot + "/log", "== unpack: x\n== build-agent: y\n");
  EXPECT_EQ(HostScript(home.path(), "poll 0"),
            "STATUS running build-agent\nALIVE 0\nSIZE 31\n== unpack: x\n== build-agent: y\n");
  EXPECT_EQ(HostScript(home.path(), "poll 13"),
            "STATUS running build-agent\nALIVE 0\nSIZE 31\n== build-agent: y\n");
  EXPECT_EQ(HostScript(home.path(), "poll 31"), "STATUS running build-agent\nALIVE 0\nSIZE 31\n");
  EXPECT_EQ(HostScript(home.path(), "poll '1;rm'"), HostScript(home.path(), "poll 0"));  // not a number: 0
}

TEST(HostProbe, OutputWithoutTheProbeLineIsAnError) {
  auto p = ParseHostProbe("Welcome to the host!\n\x1b]0;pwned\x07\n");
  // The host's text is escaped, not passed to the terminal.
  EXPECT_THAT(p,
              StatusIs(StatusCode::kInternal, AllOf(HasSubstr("no probe=1 line"), Not(HasSubstr("\x1b")))));
}

TEST(HostProbe, TableEscapesWhatTheHostSays) {
  auto p = ParseHostProbe(
      "probe=1\nos_name=Evil\x1b[2J OS\narch=x86_64\ngpu_count=2\ngpu=NVIDIA H100, 81559 MiB, 550\n");
  ASSERT_TRUE(p.ok());
  const std::string table = FormatHostProbe(*p);
  EXPECT_THAT(table, Not(HasSubstr("\x1b")));
  EXPECT_THAT(table, HasSubstr("Evil\\x1b[2J OS, x86_64"));
  EXPECT_THAT(table, HasSubstr("  GPUs      2 x NVIDIA H100, 81559 MiB, 550"));
}

TEST(HostProbe, BlockersNameWhatToDo) {
  HostProbe p;
  p.os_id = "ubuntu";
  p.package_manager = "apt";
  p.user = "ubuntu";
  p.sudo = "no";
  p.missing_packages = {"cmake", "libgrpc++-dev"};
  EXPECT_EQ(
      BootstrapBlocker(p, true),
      "packages are missing and ubuntu has neither root nor password-less sudo; ask an administrator to "
      "run: sudo apt-get install -y cmake libgrpc++-dev");
  EXPECT_EQ(
      BootstrapBlocker(p, false),
      "packages are missing (and --no-install-deps was given): sudo apt-get install -y cmake libgrpc++-dev");
  p.sudo = "yes";
  EXPECT_EQ(BootstrapBlocker(p, true), "");
  p.missing_packages.clear();
  p.home = "/home/ubuntu";
  p.home_free_mib = 1024;
  EXPECT_EQ(BootstrapBlocker(p, true), "only 1.0 GiB free in /home/ubuntu; the build needs about 3.0 GiB");
}

// Plays the host: answers each command by its kind and records them.
class ScriptedHost : public HostShell {
 public:
  std::function<std::string()> probe;
  std::vector<std::string> polls;  // answered in turn; the last one repeats
  std::vector<std::string> commands;
  std::vector<size_t> input_sizes;
  size_t max_polls = 10000;  // then polls fail: a client that polls without end is stopped there

  StatusOr<ssh::ExecResult> Run(const std::string& command, const std::string& input, int) override {
    commands.push_back(command);
    input_sizes.push_back(input.size());
    ssh::ExecResult r;
    r.exit_code = 0;
    if (command.find(" probe") != std::string::npos) r.out = probe();
    if (command.find(" start-worker ") != std::string::npos) r.out = "WORKER started 4242\n";
    if (command.find(" poll ") != std::string::npos) {
      if (next_poll_ >= max_polls) return UnavailableError("polled " + std::to_string(next_poll_) + " times");
      r.out = polls[std::min(next_poll_, polls.size() - 1)];
      ++next_poll_;
    }
    return r;
  }
  std::string Display() const override { return "root@gpu-box"; }
  bool Ran(const std::string& part) const { return !Find(part).empty(); }
  // The first command that contains `part`; "" when none does.
  std::string Find(const std::string& part) const {
    for (const auto& c : commands)
      if (c.find(part) != std::string::npos) return c;
    return "";
  }
  size_t poll_count() const { return next_poll_; }

 private:
  size_t next_poll_ = 0;
};

class BootstrapFlow : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteFile(share_.path() + "/sftctl-src.tar.gz", "not really a tarball");
    WriteFile(share_.path() + "/sftctl-host.sh", "#!/bin/bash\n");
    sha_ = *Sha256File(share_.path() + "/sftctl-src.tar.gz");
    bo_.share_dir = share_.path();
    bo_.poll_s = 0.01;
    bo_.clock = &clock_;
    bo_.out = &out_;
    opts_.host = "root@gpu-box";
  }
  StatusOr<BootstrapResult> Run(ScriptedHost* host) {
    return BootstrapWith(host, opts_, bo_, [this](const ConnectOptions&, int steps) -> StatusOr<std::string> {
      ++smoke_runs_;
      return "job-1: " + std::to_string(steps) + " steps, loss 5.5452 -> 3.1000";
    });
  }
  TempDir share_{"share"};
  std::string sha_;
  BootstrapOptions bo_;
  ConnectOptions opts_;
  std::ostringstream out_;
  int smoke_runs_ = 0;
  OffsetClock clock_;
  // The pauses between polls: each moved the clock by poll_s (10 ms), none slept.
  int64_t Pauses() const { return clock_.offset() / std::chrono::milliseconds(10); }
};

TEST_F(BootstrapFlow, UpToDateHostIsLeftAlone) {
  ScriptedHost host;
  const std::string id = SourceId();
  host.probe = [&] {
    return "probe=1\nos_name=Debian\ninstalled=" + id + "\nagent={\"running\":true,\"source_id\":\"" + id +
           "\"}\n";
  };
  auto r = Run(&host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->up_to_date);
  EXPECT_FALSE(host.Ran("start-worker"));
  EXPECT_FALSE(host.Ran("sftctl-src.tar.gz"));
  EXPECT_EQ(smoke_runs_, 0);
  EXPECT_THAT(out_.str(), HasSubstr("bootstrap: up to date: sftd 0.1.0 (source " + id.substr(0, 12) +
                                    ") on root@gpu-box\n"));
}

TEST_F(BootstrapFlow, AnAgentOfAnotherSourceIsRebuiltAndTheSmokeJobRuns) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  // Before the worker: another version installed and running; after it: this one.
  host.probe = [&] {
    const std::string installed = ++probes == 1 ? "0ld" : id;
    return "probe=1\ninstalled=" + installed + "\narchive_sha256=" + sha_ +
           "\nagent={\"running\":true,\"source_id\":\"" + installed + "\"}\n";
  };
  host.polls = {"STATUS running unpack\nALIVE 1\nSIZE 13\n== unpack: x\n",
                "STATUS done " + id + "\nALIVE 0\nSIZE 13\n"};
  auto r = Run(&host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->up_to_date);
  EXPECT_TRUE(host.Ran("start-worker --sha256 " + sha_ + " --source-id " + id));
  EXPECT_FALSE(host.Ran("sftctl-src.tar.gz.part"));  // the host already had this archive
  EXPECT_TRUE(host.Ran(" poll 13"));                 // the second poll read on from the first's end
  EXPECT_EQ(r->smoke_job, "job-1");
  EXPECT_EQ(smoke_runs_, 1);
  EXPECT_THAT(out_.str(), HasSubstr("bootstrap: ready: sftd 0.1.0 (source " + id.substr(0, 12) +
                                    ") on root@gpu-box; smoke job job-1: 20 steps, loss 5.5452 -> 3.1000\n"));
}

// --agent-only: the worker builds sftd alone, no smoke job runs, and the host's "<id> agent-only"
// counts as up to date for another --agent-only bootstrap but not for a full one.
TEST_F(BootstrapFlow, AgentOnlyInstallsNoTrainerAndRunsNoSmokeJob) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  host.probe = [&] {
    const std::string installed = ++probes == 1 ? "" : id + " agent-only";
    return "probe=1\ninstalled=" + installed + "\narchive_sha256=" + sha_ +
           "\nagent={\"running\":true,\"source_id\":\"" + id + "\"}\n";
  };
  host.polls = {"STATUS done " + id + "\nALIVE 0\nSIZE 0\n"};
  bo_.agent_only = true;
  auto r = Run(&host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->up_to_date);
  EXPECT_THAT(host.Find(" start-worker "), HasSubstr(" --agent-only"));
  EXPECT_EQ(smoke_runs_, 0);
  EXPECT_TRUE(r->smoke_job.empty());
  EXPECT_THAT(out_.str(),
              HasSubstr("bootstrap: ready: sftd 0.1.0 (source " + id.substr(0, 12) + ") on root@gpu-box\n"));

  ScriptedHost again;  // an agent-only host, bootstrapped again the same way: left alone
  again.probe = [&] {
    return "probe=1\ninstalled=" + id + " agent-only\nagent={\"running\":true,\"source_id\":\"" + id +
           "\"}\n";
  };
  auto r2 = Run(&again);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_TRUE(r2->up_to_date);
  EXPECT_FALSE(again.Ran("start-worker"));

  ScriptedHost full;  // ... but a full bootstrap builds the trainer there
  full.probe = again.probe;
  full.polls = {"STATUS done " + id + "\nALIVE 0\nSIZE 0\n"};
  bo_.agent_only = false;
  auto r3 = Run(&full);
  ASSERT_FALSE(r3.ok() && r3->up_to_date);
  EXPECT_TRUE(full.Ran("start-worker"));
  EXPECT_THAT(full.Find(" start-worker "), Not(HasSubstr("--agent-only")));
}

// The host script decided there is no usable LibTorch (deploy/host/sftctl-host.sh's torch_decide;
// its cases: tests/client/host_torch_test.cpp): the bootstrap stops after the probe with its message,
// a line each, having uploaded no source and started no worker.
TEST_F(BootstrapFlow, AHostWithoutAUsableTorchStopsAfterTheProbe) {
  ScriptedHost host;
  host.probe = [] {
    return "probe=1\nos_id=debian\npackage_manager=apt\nsudo=root\ntorch_plan=none\n"
           "torch_problem=no usable LibTorch for the trainer on this host; nothing was installed or built.\n"
           "torch_problem=found: the distribution's libtorch-dev 1.7.1 (apt): older than 1.13\n"
           "torch_problem=  or sftctl bootstrap --agent-only: sftd alone, no trainer on this host\n";
  };
  auto r = Run(&host);
  EXPECT_THAT(r,
              StatusIs(StatusCode::kFailedPrecondition,
                       "root@gpu-box: no usable LibTorch for the trainer on this host; nothing was installed "
                       "or built.\n  found: the distribution's libtorch-dev 1.7.1 (apt): older than 1.13\n"
                       "    or sftctl bootstrap --agent-only: sftd alone, no trainer on this host"));
  EXPECT_FALSE(host.Ran("sftctl-src.tar.gz"));
  EXPECT_FALSE(host.Ran("start-worker"));
  EXPECT_EQ(smoke_runs_, 0);
}

// --install-torch reaches the probe (whose decision then plans the install) and the worker.
TEST_F(BootstrapFlow, InstallTorchReachesTheProbeAndTheWorker) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  host.probe = [&] {
    return "probe=1\ntorch_plan=install\ninstalled=" + std::string(++probes > 1 ? id : "") +
           "\narchive_sha256=" + sha_ + "\n";
  };
  host.polls = {"STATUS done " + id + "\nALIVE 0\nSIZE 0\n"};
  bo_.smoke = false;
  bo_.install_torch = true;
  auto r = Run(&host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(host.Find(" probe"), HasSubstr(" probe --install-torch"));
  EXPECT_THAT(host.Find(" start-worker "), HasSubstr(" --install-torch"));

  ScriptedHost plain;  // without the flag, neither gets it
  plain.probe = host.probe;
  plain.polls = host.polls;
  probes = 0;
  bo_.install_torch = false;
  ASSERT_TRUE(Run(&plain).ok());
  EXPECT_THAT(plain.Find(" probe"), Not(HasSubstr("--install-torch")));
  EXPECT_THAT(plain.Find(" start-worker "), Not(HasSubstr("--install-torch")));
}

TEST_F(BootstrapFlow, TheArchiveIsUploadedWhenTheHostLacksIt) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  host.probe = [&] { return "probe=1\ninstalled=" + std::string(++probes > 1 ? id : "") + "\n"; };
  host.polls = {"STATUS done " + id + "\nALIVE 0\nSIZE 0\n"};
  bo_.smoke = false;
  auto r = Run(&host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(host.Ran("sftctl-src.tar.gz.part"));
  for (size_t i = 0; i < host.commands.size(); ++i) {
    if (host.commands[i].find("sftctl-src.tar.gz.part") != std::string::npos) {
      EXPECT_EQ(host.input_sizes[i], std::string("not really a tarball").size());
    }
  }
  EXPECT_EQ(smoke_runs_, 0);
}

TEST_F(BootstrapFlow, AWorkerFailureNamesThePhaseAndShowsTheLog) {
  ScriptedHost host;
  host.probe = [] { return "probe=1\ninstalled=\n"; };
  const std::string log = "== build-agent: building sftd (10:00:00)\nCMake Error: gRPC not found\x1b[31m\n";
  host.polls = {"STATUS failed build-agent: cmake --preset host-agent failed\nALIVE 0\nSIZE " +
                std::to_string(log.size()) + "\n" + log};
  auto r = Run(&host);
  EXPECT_THAT(
      r, StatusIs(StatusCode::kFailedPrecondition,
                  AllOf(StartsWith("root@gpu-box: build-agent: cmake --preset host-agent failed\nhost log: "
                                   "~/.local/share/sftctl/bootstrap/log\n"),
                        HasSubstr("  | CMake Error: gRPC not found\\x1b[31m"))));
  EXPECT_EQ(smoke_runs_, 0);
}

TEST_F(BootstrapFlow, AWorkerThatDiedIsReportedAsResumable) {
  ScriptedHost host;
  host.probe = [] { return "probe=1\n"; };
  host.polls = {"STATUS running build-trainer\nALIVE 0\nSIZE 0\n"};
  auto r = Run(&host);
  EXPECT_THAT(r, StatusIs(StatusCode::kUnavailable,
                          HasSubstr("the bootstrap worker stopped without finishing (status: running "
                                    "build-trainer); run `sftctl bootstrap` again to resume")));
}

TEST_F(BootstrapFlow, ARunningWorkerIsFollowedNotStartedTwice) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  host.probe = [&] { return ++probes == 1 ? "probe=1\nworker=777\n" : "probe=1\ninstalled=" + id + "\n"; };
  host.polls = {"STATUS done " + id + "\nALIVE 0\nSIZE 0\n"};
  bo_.smoke = false;
  auto r = Run(&host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(host.Ran("start-worker"));
  EXPECT_TRUE(host.Ran(" poll 0"));
}

TEST_F(BootstrapFlow, AgentFlagsReachTheWorkerAndNothingElseCrossesTheShell) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  host.probe = [&] { return "probe=1\ninstalled=" + std::string(++probes > 1 ? id : "") + "\n"; };
  host.polls = {"STATUS done " + id + "\nALIVE 0\nSIZE 0\n"};
  bo_.smoke = false;
  bo_.agent_args = {"--stop-when-idle", "2h", "--price-per-hour", "1.30"};
  ASSERT_TRUE(Run(&host).ok());
  EXPECT_TRUE(
      host.Ran(" --agent-arg --stop-when-idle --agent-arg 2h --agent-arg --price-per-hour --agent-arg 1.30"));

  ScriptedHost host2;
  bo_.agent_args = {"--stop-command", "rm -rf ~"};
  auto r = Run(&host2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "agent flag 'rm -rf ~': only letters, digits and ._:=/-@+, may be passed to sftd on the host");
  EXPECT_TRUE(host2.commands.empty());
}

// A host whose poll claims log bytes it never sends is not polled in a busy loop: each such answer
// is followed by a pause, and kMaxBadPolls of them in a row are a protocol error.
TEST_F(BootstrapFlow, APollThatClaimsBytesItNeverSendsPausesThenFails) {
  ScriptedHost host;
  host.probe = [] { return "probe=1\n"; };
  host.polls = {"STATUS running build-agent\nALIVE 1\nSIZE 100\n"};
  auto r = Run(&host);
  EXPECT_THAT(r,
              StatusIs(StatusCode::kInternal,
                       HasSubstr("root@gpu-box: the host's bootstrap poll breaks the protocol: it says the "
                                 "log has 100 bytes but sends none past 0 (10 answers in a row)")));
  EXPECT_EQ(host.poll_count(), static_cast<size_t>(kMaxBadPolls));
  EXPECT_EQ(Pauses(), kMaxBadPolls - 1);
}

TEST_F(BootstrapFlow, ALogThatShrinksIsAProtocolErrorAfterPauses) {
  ScriptedHost host;
  host.probe = [] { return "probe=1\n"; };
  host.polls = {"STATUS running unpack\nALIVE 1\nSIZE 13\n== unpack: x\n",
                "STATUS running unpack\nALIVE 1\nSIZE 5\n"};
  auto r = Run(&host);
  EXPECT_THAT(r,
              StatusIs(StatusCode::kInternal,
                       HasSubstr("the log went back to 5 bytes after 13 were read (10 answers in a row)")));
  EXPECT_EQ(host.poll_count(), static_cast<size_t>(kMaxBadPolls) + 1);
  EXPECT_EQ(Pauses(), 1 + kMaxBadPolls - 1);  // after the first (caught up, running), then the bad ones
}

// While the log arrives in pieces the next piece is asked for at once; a pause only when nothing new
// came, and a protocol hiccup short of the bound is forgiven.
TEST_F(BootstrapFlow, PollsPauseOnlyWhenNoNewBytesArrived) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  host.probe = [&] { return "probe=1\ninstalled=" + std::string(++probes > 1 ? id : "") + "\n"; };
  host.polls = {"STATUS running unpack\nALIVE 1\nSIZE 22\n== unpack: 1234\n",  // 16 of 22: ask again
                "STATUS running unpack\nALIVE 1\nSIZE 22\n",                   // none: pause
                "STATUS running unpack\nALIVE 1\nSIZE 22\n56789\n",            // the rest: caught up, pause
                "STATUS done " + id + "\nALIVE 0\nSIZE 22\n"};
  bo_.smoke = false;
  auto r = Run(&host);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(host.poll_count(), 4u);
  EXPECT_EQ(Pauses(), 2);
}

// --agent-data-dir ~/x names a folder in the host's home, as for every other remote command: the
// worker is given "$HOME"/'x', which the host's shell expands.
TEST_F(BootstrapFlow, AHomeRelativeDataDirIsExpandedOnTheHost) {
  ScriptedHost host;
  const std::string id = SourceId();
  int probes = 0;
  host.probe = [&] { return "probe=1\ninstalled=" + std::string(++probes > 1 ? id : "") + "\n"; };
  host.polls = {"STATUS done " + id + "\nALIVE 0\nSIZE 0\n"};
  bo_.smoke = false;
  opts_.agent_data_dir = "~/sftd data's";
  ASSERT_TRUE(Run(&host).ok());
  const std::string start = host.Find(" start-worker ");
  ASSERT_NE(start, "");
  EXPECT_THAT(start, HasSubstr(" --data-dir \"$HOME\"/'sftd data'\\''s'"));
  // Through a shell, as the host runs it: the worker's --data-dir is the folder in HOME.
  TempDir home("home");
  const std::string args = start.substr(start.find(" start-worker ") + 14);
  WriteFile(home.path() + "/args.sh", "printf '%s\\n' " + args + "\n");
  const std::string argv = RunShell("HOME='" + home.path() + "' bash " + home.path() + "/args.sh").output;
  EXPECT_THAT(argv, HasSubstr("\n--data-dir\n" + home.path() + "/sftd data's\n"));
}

// systemd's unquoting of one ExecStart= value (systemd.syntax(7)): specifiers (%%), words, double
// quotes with C escapes, then variables ($$). Anything the script must not produce fails the test.
std::vector<std::string> SystemdArgs(const std::string& line) {
  std::string text;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '%') {
      text += line[i];
    } else if (i + 1 < line.size() && line[i + 1] == '%') {
      text += '%';
      ++i;
    } else {
      ADD_FAILURE() << "a specifier systemd would expand in: " << line;
    }
  }
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == ' ') {
      ++i;
      continue;
    }
    if (text[i] != '"') {
      ADD_FAILURE() << "an unquoted word in: " << line;
      return words;
    }
    std::string w;
    for (++i; i < text.size() && text[i] != '"'; ++i) {
      if (text[i] == '\\' && i + 1 < text.size()) ++i;  // \\ and \" (the only escapes expected)
      w += text[i];
    }
    ++i;
    std::string expanded;
    for (size_t k = 0; k < w.size(); ++k) {
      if (w[k] == '$' && k + 1 < w.size() && w[k + 1] == '$') {
        ++k;
      } else if (w[k] == '$') {
        ADD_FAILURE() << "a variable systemd would expand in: " << line;
      }
      expanded += w[k];
    }
    words.push_back(expanded);
  }
  return words;
}

// The unit's ExecStart=: each argument quoted for systemd (a HOME with a space or a %, a data dir
// with quotes, $ and \\), and a data dir "~/x" from an older client taken under HOME, not as "~".
TEST(HostScript, ExecStartQuotesEveryArgumentForSystemd) {
  TempDir base("exec");
  const std::string home = base.path() + "/my h%me";
  RunShell("mkdir -p '" + home + "'");
  auto exec_start = [&](const std::string& args) {
    return RunShell("HOME='" + home + "' XDG_CONFIG_HOME= bash " + kScript + " exec-start " + args);
  };
  auto r = exec_start(R"(--data-dir '~/d "q" $X\y' --agent-arg --stop-command --agent-arg 'a%b$c')");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_FALSE(r.output.empty());
  EXPECT_EQ(r.output.back(), '\n');
  EXPECT_EQ(SystemdArgs(r.output.substr(0, r.output.size() - 1)),
            (std::vector<std::string>{home + "/.local/bin/sftd", "start", "--data-dir",
                                      home + "/d \"q\" $X\\y", "--stop-command", "a%b$c"}));
  for (const auto& [given, want] : std::vector<std::pair<std::string, std::string>>{
           {"'~'", home}, {"rel/dir", home + "/rel/dir"}, {"/abs/dir", "/abs/dir"}}) {
    r = exec_start("--data-dir " + given);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto words = SystemdArgs(r.output.substr(0, r.output.size() - 1));
    ASSERT_EQ(words.size(), 4u) << r.output;
    EXPECT_EQ(words[3], want) << given;
  }
  r = exec_start("--agent-arg $'line\\nbreak'");  // a unit file cannot carry it: no unit then
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output, "");
}

TEST_F(BootstrapFlow, AMissingArchiveSaysWhereItWasLookedFor) {
  bo_.share_dir = share_.path() + "/nowhere";
  ScriptedHost host;
  auto r = Run(&host);
  EXPECT_THAT(
      r, StatusIs(StatusCode::kNotFound, HasSubstr(share_.path() + "/nowhere/sftctl-src.tar.gz is missing")));
  EXPECT_TRUE(host.commands.empty());
}

// The SSH HostShell re-opens the session after the host dropped it (the laptop slept, sshd was
// restarted), so a bootstrap's polling goes on.
TEST(SshHostShell, ReconnectsAfterADroppedSession) {
  auto f = sshtest::SshdFixture::Start();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto shell = NewSshHostShell((*f)->Options(), /*attempts=*/3);
  auto one = shell->Run("echo one", "", 20);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->out, "one\n");
  ASSERT_TRUE((*f)->DropSessions().ok());
  auto two = shell->Run("echo two", "", 20);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->out, "two\n");
  const std::string log = (*f)->Log();
  size_t accepted = 0;
  for (size_t at = log.find("Accepted publickey"); at != std::string::npos;
       at = log.find("Accepted publickey", at + 1))
    ++accepted;
  EXPECT_EQ(accepted, 2u) << log;  // a second authenticated session: it reconnected
}

}  // namespace
}  // namespace sftctl::client
