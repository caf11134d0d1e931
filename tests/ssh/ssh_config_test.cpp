// Unit tests of the ~/.ssh/config parser (client/remote/ssh/ssh_config.h) beyond Host blocks: Include
// (nesting, globs, relative paths, ~, depth limit, conditional under Host), Match (host, originalhost, user,
// localuser, all; unsupported criteria skipped with a warning), ProxyJump chains, ProxyCommand tokens,
// and errors that name file:line. Real files in a temporary HOME. Also the shell-injection guards:
// OpenSSH's host/user name rules and the quoting of ProxyCommand expansions, run through /bin/sh.
#include "client/remote/ssh/ssh_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/util/command.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client::ssh {
namespace {

using ::sftctl::testing::RunCommand;
using ::sftctl::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class SshConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    std::filesystem::create_directories(home() + "/.ssh/conf.d");
  }
  std::string home() const { return dir_.path(); }
  std::string ssh(const std::string& name) const { return home() + "/.ssh/" + name; }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream f(ssh(name), std::ios::binary);
    f << text;
  }
  StatusOr<ResolvedHost> Resolve(const std::string& spec) const {
    return ResolveHost(spec, ssh("config"), home(), "localme");
  }

 private:
  ::sftctl::testing::TempDir dir_{"sshcfg"};
};

TEST_F(SshConfigFiles, IncludeRelativeGlobTildeAndNesting) {
  // conf.d/* in lexical order: 10-a before 20-b, so 10-a's User wins; 20-b includes ~/.ssh/deep.
  Write("config", "Include conf.d/*.conf ~/.ssh/missing-*.conf\nHost *\n  User fallback\n  Port 2200\n");
  Write("conf.d/20-b.conf", "Host box\n  User from-b\n  Include ~/.ssh/deep\n");
  Write("conf.d/10-a.conf", "Host box\n  User from-a\n  HostName 10.0.0.1\n");
  Write("conf.d/ignored.txt", "Host box\n  Port 1\n");
  Write("deep", "IdentityFile ~/.ssh/id_deep\n");
  auto r = Resolve("box");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->user, "from-a");
  EXPECT_EQ(r->hostname, "10.0.0.1");
  EXPECT_EQ(r->port, 2200);  // the main file goes on after the Include
  EXPECT_THAT(r->identity_files, ElementsAre(home() + "/.ssh/id_deep"));
  // Another host: the included Host blocks do not match, the trailing Host * does.
  auto other = Resolve("elsewhere");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->user, "fallback");
  EXPECT_TRUE(other->identity_files.empty());
}

TEST_F(SshConfigFiles, IncludeInsideAHostBlockAppliesOnlyUnderItAndDoesNotLeak) {
  // The included file's own Host line ends inside it: after the Include the outer block (gpu) is
  // active again, so Port 2222 applies to gpu and not to others.
  Write("config", "Host gpu\n  Include gpu.conf\n  Port 2222\nHost *\n  User everyone\n");
  Write("gpu.conf", "User gpu-user\nHost never-matches\n  HostName nowhere\n");
  auto gpu = Resolve("gpu");
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ(gpu->user, "gpu-user");
  EXPECT_EQ(gpu->hostname, "gpu");
  EXPECT_EQ(gpu->port, 2222);
  auto cpu = Resolve("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->user, "everyone");
  EXPECT_EQ(cpu->port, 22);
}

TEST_F(SshConfigFiles, IncludeLoopStopsAtTheDepthLimitNamingFileAndLine) {
  Write("config", "# loop\nInclude self.conf\n");
  Write("self.conf", "\nUser x\nInclude self.conf\n");
  auto r = Resolve("box");
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument,
                          HasSubstr(ssh("self.conf") + ":3: Include nested more than 16 deep")));
  // A directory given as a config file is an error naming it.
  Write("config", "Include conf.d\n");
  EXPECT_THAT(Resolve("box"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr(ssh("config") + ":1: Include: " + ssh("conf.d") + ": not a regular file")));
}

TEST_F(SshConfigFiles, ErrorsInIncludedFilesNameThatFileAndLine) {
  Write("config", "Include bad.conf\n");
  Write("bad.conf", "Host box\n\n  Port 99999\n");
  EXPECT_THAT(Resolve("box"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr(ssh("bad.conf") + ":3: bad Port \"99999\"")));
  Write("bad.conf", "Host box\n  ProxyJump jump:0\n");
  EXPECT_THAT(Resolve("box"), StatusIs(StatusCode::kInvalidArgument,
                                       HasSubstr(ssh("bad.conf") + ":2: ProxyJump: host \"jump:0\"")));
  Write("bad.conf", "Match hots box\n");
  EXPECT_THAT(Resolve("box"), StatusIs(StatusCode::kInvalidArgument,
                                       HasSubstr(ssh("bad.conf") + ":1: unknown Match criterion 'hots'")));
  Write("bad.conf", "Match host\n");
  EXPECT_THAT(Resolve("box"), StatusIs(StatusCode::kInvalidArgument,
                                       HasSubstr(ssh("bad.conf") + ":1: Match host needs an argument")));
  Write("bad.conf", "Match all host x\n");
  EXPECT_THAT(Resolve("box"), StatusIs(StatusCode::kInvalidArgument,
                                       HasSubstr(ssh("bad.conf") + ":1: Match all cannot be combined")));
}

TEST(SshConfigMatch, HostSeesHostNameOriginalHostSeesTheAlias) {
  const char* cfg =
      "Host gpu\n  HostName 10.1.2.3\n"
      "Match host 10.1.*\n  User by-hostname\n"
      "Match originalhost gpu\n  Port 2201\n"
      "Match originalhost 10.1.*\n  IdentityFile /never\n";
  ConfigQuery q{"gpu", "", "me", "/h"};
  auto e = LookupSshConfig(cfg, q);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->hostname, "10.1.2.3");
  EXPECT_EQ(e->user, "by-hostname");
  EXPECT_EQ(e->port, 2201);
  EXPECT_TRUE(e->identity_files.empty());
  EXPECT_TRUE(e->warnings.empty());
}

TEST(SshConfigMatch, UserLocalUserAllAndPatternLists) {
  const char* cfg =
      "Match user root,!admin host *.lab\n  Port 2000\n"
      "Match localuser me\n  IdentityFile /k/me\n"
      "Match localuser *,!me\n  IdentityFile /k/other\n"  // a list of negations alone matches nothing
      "Match all\n  User default-user\n";
  // User from the command line: root matches the first block.
  auto root = LookupSshConfig(cfg, ConfigQuery{"a.lab", "root", "me", "/h"});
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_EQ(root->port, 2000);
  EXPECT_THAT(root->identity_files, ElementsAre("/k/me"));
  EXPECT_EQ(root->user, "default-user");  // Match all applies; the command line's user is not a config value
  // No user typed: Match user sees the local user (me), not root; negation in the list.
  auto none = LookupSshConfig(cfg, ConfigQuery{"a.lab", "", "me", "/h"});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->port.has_value());
  auto admin = LookupSshConfig(cfg, ConfigQuery{"a.lab", "admin", "other", "/h"});
  ASSERT_TRUE(admin.ok());
  EXPECT_FALSE(admin->port.has_value());
  EXPECT_THAT(admin->identity_files, ElementsAre("/k/other"));
  // Match user sees the User set earlier in the config.
  auto earlier =
      LookupSshConfig("Host x\n  User root\nMatch user root\n  Port 7\n", ConfigQuery{"x", "", "me", "/h"});
  ASSERT_TRUE(earlier.ok());
  EXPECT_EQ(earlier->port, 7);
}

TEST(SshConfigMatch, ExecIsSkippedWithAWarningAndNeverRun) {
  const std::string marker = ::testing::TempDir() + "/sshcfg-exec-ran-" + std::to_string(::getpid());
  const std::string cfg = "Host *\n  HostName h\nMatch host h exec \"touch " + marker +
                          "\"\n  User from-exec\nMatch host other exec \"touch " + marker +
                          "\"\n  User other\nMatch canonical\n  Port 9\nHost *\n  User plain\n";
  auto e = LookupSshConfig(cfg, ConfigQuery{"box", "", "me", "/h"}, "/cfg");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->user, "plain");
  EXPECT_FALSE(e->port.has_value());
  // Only blocks whose other criteria held are reported.
  EXPECT_THAT(
      e->warnings,
      ElementsAre("/cfg:3: unsupported Match criterion 'exec': this Match block is skipped (sftctl does "
                  "not run commands from an ssh config)",
                  "/cfg:7: unsupported Match criterion 'canonical': this Match block is skipped"));
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST(SshConfigProxy, ProxyJumpChainsUrisAndNone) {
  const char* cfg =
      "Host gpu\n  ProxyJump alice@bastion:2222,ssh://inner,[::1]:23\n  ProxyCommand never\n"
      "Host direct\n  ProxyJump none\n  ProxyCommand never\n"
      "Host *\n  ProxyJump default-bastion\n";
  auto gpu = LookupSshConfig(cfg, "gpu", "/h");
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  ASSERT_EQ(gpu->proxy_jump.size(), 3u);
  EXPECT_EQ(gpu->proxy_jump[0].user, "alice");
  EXPECT_EQ(gpu->proxy_jump[0].host, "bastion");
  EXPECT_EQ(gpu->proxy_jump[0].port, 2222);
  EXPECT_EQ(gpu->proxy_jump[1].host, "inner");
  EXPECT_FALSE(gpu->proxy_jump[1].port.has_value());
  EXPECT_EQ(gpu->proxy_jump[2].host, "::1");
  EXPECT_EQ(gpu->proxy_jump[2].port, 23);
  EXPECT_EQ(gpu->proxy_command, "");  // ProxyJump came first
  auto direct = LookupSshConfig(cfg, "direct", "/h");
  ASSERT_TRUE(direct.ok());
  EXPECT_TRUE(direct->proxy_jump.empty());
  EXPECT_EQ(direct->proxy_command, "");  // "none" came first and wins over both
  auto other = LookupSshConfig(cfg, "other", "/h");
  ASSERT_TRUE(other.ok());
  ASSERT_EQ(other->proxy_jump.size(), 1u);
  EXPECT_EQ(other->proxy_jump[0].host, "default-bastion");
  EXPECT_THAT(
      LookupSshConfig("ProxyJump a, b\n", "x", "/h", "/cfg"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("/cfg:1: ProxyJump takes one comma-separated list")));
}

TEST_F(SshConfigFiles, ProxyCommandTokensAreExpandedWithTheFinalValues) {
  Write("config",
        "Host colab\n  HostName %h.example\n  User root\n"
        "  ProxyCommand colab ssh --proxy-mode \"%h\" -p %p -l %r -n %n -d %d -u %u 100%%\n"
        "  ProxyJump never\n"
        "Host bad\n  ProxyCommand relay %x\n"
        "Host off\n  ProxyCommand none\n  ProxyJump never\n");
  // The spec's user and port win and are what %r and %p see.
  auto r = Resolve("bob@colab:2022");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->proxy_command, "colab ssh --proxy-mode \"colab.example\" -p 2022 -l bob -n colab -d " +
                                  home() + " -u localme 100%");
  EXPECT_TRUE(r->proxy_jump.empty());
  EXPECT_THAT(Resolve("bad"), StatusIs(StatusCode::kInvalidArgument,
                                       HasSubstr(ssh("config") + ":7: ProxyCommand: unknown token '%x'")));
  auto off = Resolve("off");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->proxy_command, "");
  EXPECT_TRUE(off->proxy_jump.empty());
}

// The files in `dir` (the shell ran there: any other file is an injected command's work).
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

// Runs an expanded ProxyCommand the way proxy_command.cpp does (`/bin/sh -c "exec CMD"`), in `dir`.
int RunProxyShell(const std::string& dir, const std::string& command) {
  return RunCommand({"/bin/sh", "-c", "cd '" + dir + "' && exec " + command}).exit_code;
}

std::string FirstLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

TEST(SshHostNames, OpenSshRulesRefuseShellMetacharactersAndControlCharacters) {
  for (const std::string ok : {"gpu-box", "me@gpu-box:2222", "root@[::1]:22", "a.b_c+d@10.0.0.1", "x/y",
                               "fe80::1%eth0", "first.last@host"}) {
    EXPECT_TRUE(ParseHostSpec(ok).ok()) << ok << ": " << ParseHostSpec(ok).status().ToString();
  }
  const std::vector<std::pair<std::string, std::string>> bad_hosts = {
      {"gpu-box/$(touch${IFS}X)", "it contains '$'"},
      {"a;b", "it contains ';'"},
      {"a&b", "it contains '&'"},
      {"a|b", "it contains '|'"},
      {"a<b", "it contains '<'"},
      {"a>b", "it contains '>'"},
      {"a(b", "it contains '('"},
      {"a)b", "it contains ')'"},
      {"a`id`", "it contains '`'"},
      {"a'b", "it contains '''"},
      {"a\"b", "it contains '\"'"},
      {"a\\b", "it contains '\\'"},
      {"a{b}", "it contains '{'"},
      {"a,b", "it contains ','"},
      {"a b", "it contains a space"},
      {"a\tb", "it contains whitespace (\\x09)"},
      {"a\nb", "it contains whitespace (\\x0a)"},
      {"a\x1b[2Jb", "it contains a control character (\\x1b)"},
      {"-oProxyCommand=touch", "it starts with '-'"},
  };
  for (const auto& [host, why] : bad_hosts) {
    const auto r = ParseHostSpec("me@" + host);
    // The host is shown escaped: no raw ESC reaches the terminal.
    EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument,
                            AllOf(::testing::StartsWith("host \""), HasSubstr("\" is refused: " + why),
                                  Not(HasSubstr("\x1b")))))
        << host;
  }
  EXPECT_THAT(
      ParseHostSpec("gpu-box/$(touch${IFS}X)"),
      StatusIs(StatusCode::kInvalidArgument,
               HasSubstr("host \"gpu-box/$(touch${IFS}X)\" is refused: it contains '$' (like OpenSSH")));
  // User names: the same characters (',' aside) and a leading '-'.
  for (const std::string user : {"$(touch${IFS}X)", "a;b", "a b", "-l", "a`b`", "u\x01", "a\\"}) {
    EXPECT_THAT(ParseHostSpec(user + "@gpu-box"),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("for host \"gpu-box\" is refused")))
        << user;
  }
  EXPECT_THAT(CheckUserName("-oX", "h"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("user name \"-oX\" for host \"h\" is refused: it starts with '-'")));
  EXPECT_TRUE(CheckUserName("first.last", "h").ok());
}

TEST_F(SshConfigFiles, EveryPathToTheShellChecksHostAndUserNamesFirst) {
  Write("config",
        "Host hop-bad\n  ProxyJump me@bastion,jump;touch${IFS}X\n"
        "Host user-bad\n  ProxyJump $(id)@bastion\n"
        "Host *\n  ProxyCommand touch %h.ran %p\n");  // would leave a file if it were ever run
  EXPECT_THAT(Resolve("gpu-box/$(touch${IFS}INJECTED)"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("host \"gpu-box/$(touch${IFS}INJECTED)\" is refused: it contains '$'")));
  EXPECT_THAT(Resolve("$(touch${IFS}INJECTED)@gpu-box"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("user name \"$(touch${IFS}INJECTED)\"")));
  // ResolveHostSpec checks a HostSpec that did not come through ParseHostSpec.
  EXPECT_THAT(ResolveHostSpec(HostSpec{"", "a;b", std::nullopt}, ssh("config"), home(), "me"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("host \"a;b\" is refused")));
  EXPECT_THAT(ResolveHostSpec(HostSpec{"a b", "box", std::nullopt}, ssh("config"), home(), "me"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("user name \"a b\" for host \"box\"")));
  // ProxyJump hops, with the file and line.
  EXPECT_THAT(Resolve("hop-bad"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr(ssh("config") + ":2: ProxyJump: host \"jump;touch${IFS}X\" is refused")));
  EXPECT_THAT(Resolve("user-bad"), StatusIs(StatusCode::kInvalidArgument,
                                            HasSubstr(ssh("config") + ":4: ProxyJump: user name \"$(id)\"")));
  // Good names still resolve, and their tokens are pasted as they are.
  auto r = Resolve("me@gpu-box");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->proxy_command, "touch gpu-box.ran 22");
  EXPECT_THAT(FilesIn(home()), ElementsAre(".ssh"));
}

TEST_F(SshConfigFiles, ConfigValuesWithShellCharactersAreQuotedAndNeverRun) {
  // HostName and User come from the config (OpenSSH does not check them): quoted, they stay data.
  Write("config",
        "Host evil\n  HostName $(touch${IFS}PWNED_H)\n  User u;touch${IFS}PWNED_U\n"
        "  ProxyCommand printf '%%s|%%s|%%s|%%s\\n' %h %r %n %p > out\n"
        "Host quote\n  HostName it's`touch${IFS}PWNED_Q`\n  ProxyCommand printf %%s %h > out\n");
  const std::string run = home() + "/run";
  std::filesystem::create_directories(run);
  auto evil = Resolve("evil");
  ASSERT_TRUE(evil.ok()) << evil.status().ToString();
  EXPECT_EQ(evil->proxy_command,
            "printf '%s|%s|%s|%s\\n' '$(touch${IFS}PWNED_H)' 'u;touch${IFS}PWNED_U' evil 22 > out");
  ASSERT_EQ(RunProxyShell(run, evil->proxy_command), 0);
  EXPECT_THAT(FilesIn(run), ElementsAre("out"));
  EXPECT_EQ(FirstLine(run + "/out"), "$(touch${IFS}PWNED_H)|u;touch${IFS}PWNED_U|evil|22");

  auto quote = Resolve("quote");
  ASSERT_TRUE(quote.ok()) << quote.status().ToString();
  EXPECT_EQ(quote->proxy_command, "printf %s 'it'\\''s`touch${IFS}PWNED_Q`' > out");
  ASSERT_EQ(RunProxyShell(run, quote->proxy_command), 0) << quote->proxy_command;
  EXPECT_THAT(FilesIn(run), ElementsAre("out"));
  EXPECT_EQ(FirstLine(run + "/out"), "it's`touch${IFS}PWNED_Q`");
}

TEST(SshConfigProxy, PlainValuesArePastedAsWrittenOthersOnlyWhereQuotingIsSafe) {
  ResolvedHost h;
  h.alias = "gpu";
  h.hostname = "10.0.0.5";
  h.user = "ubuntu";
  h.port = 2222;
  auto expand = [&](const std::string& cmd) {
    return ExpandProxyCommand(cmd, h, "/home/me", "me", "/cfg:3");
  };
  // Plain names: exactly OpenSSH's expansion, so every way users write these keeps working.
  EXPECT_EQ(*expand("ssh -W %h:%p bastion"), "ssh -W 10.0.0.5:2222 bastion");
  EXPECT_EQ(*expand("ssh -W '%h:%p' bastion"), "ssh -W '10.0.0.5:2222' bastion");
  EXPECT_EQ(*expand("cloudflared access ssh --hostname \"%n\" -u %r%%"),
            "cloudflared access ssh --hostname \"gpu\" -u ubuntu%");
  EXPECT_EQ(*expand("sh -c 'nc %h %p'"), "sh -c 'nc 10.0.0.5 2222'");
  // Anything else is one single-quoted word outside quotes...
  h.hostname = "$(touch X)";
  EXPECT_EQ(*expand("ssh -W %h:%p bastion"), "ssh -W '$(touch X)':2222 bastion");
  EXPECT_EQ(*expand("nc x\\\\ %h"), "nc x\\\\ '$(touch X)'");  // an escaped backslash escapes nothing after
  EXPECT_EQ(*expand("nc '%%' \"a\" %h"), "nc '%' \"a\" '$(touch X)'");
  EXPECT_EQ(*expand("nc %d %u %h"), "nc /home/me me '$(touch X)'");
  // ...and refused where the shell would read it inside something else.
  for (const std::string cmd : {"nc \"%h\"", "sh -c 'nc %h %p'", "nc $(echo %h)", "nc `echo %h`", "nc \\%h",
                                "nc $%h", "nc ${x:-%h}", "nc \"a\\\"%h\""}) {
    EXPECT_THAT(expand(cmd),
                StatusIs(StatusCode::kInvalidArgument,
                         HasSubstr("/cfg:3: ProxyCommand: %h (\"$(touch X)\") holds characters")))
        << cmd;
  }
  h.user = "a\x1b]0;x\x07";
  EXPECT_THAT(expand("nc %r"), StatusIs(StatusCode::kInvalidArgument,
                                        HasSubstr("%r (\"a\\x1b]0;x\\x07\") contains a control character")));
}

TEST(SshConfigProxy, QuotedHomeAndLocalUserReachTheCommandIntact) {
  ::sftctl::testing::TempDir dir("sshcfg-q");
  ResolvedHost h;
  h.alias = h.hostname = "box";
  h.user = "me";
  const std::string home = "/home/it's $(touch PWNED_D) me";
  const std::string user = "a b;touch PWNED_U";
  auto cmd = ExpandProxyCommand("printf '%%s|%%s\\n' %d %u > out", h, home, user, "/cfg:1");
  ASSERT_TRUE(cmd.ok()) << cmd.status().ToString();
  ASSERT_EQ(RunProxyShell(dir.path(), *cmd), 0) << *cmd;
  EXPECT_THAT(FilesIn(dir.path()), ElementsAre("out"));
  EXPECT_EQ(FirstLine(dir.path() + "/out"), home + "|" + user);
}

}  // namespace
}  // namespace sftctl::client::ssh
