// Job references and ids (client/remote/job_registry.h, client/remote/job_target.h): only "job-N" ids are
// stored, used or printed, and the HOST of "HOST/job-N" passes OpenSSH's host name rules before anything uses
// it. Ends with the real `sftctl logs` given a reference whose host would run a command through a
// ProxyCommand's shell (issue 26).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/remote/job_registry.h"
#include "client/remote/job_target.h"
#include "tests/util/command.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::client {
namespace {

using ::sftctl::testing::Bin;
using ::sftctl::testing::RunShell;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kInjected = "gpu-box/$(touch${IFS}INJECTED)/job-7";

JobRecord Record(const std::string& host, const std::string& id) {
  JobRecord r;
  r.host = host;
  r.id = id;
  NodeRecord n;
  n.host = host;
  n.id = id;
  r.nodes.push_back(n);
  return r;
}

TEST(JobIds, OnlyJobDashDigits) {
  for (const std::string ok : {"job-0", "job-7", "job-12345678901234567890"}) EXPECT_TRUE(IsJobId(ok)) << ok;
  for (const std::string bad : {"", "job-", "job-7a", "job_7", "Job-7", "job--7", "job-7\n", "job-1.retry",
                                "../job-7", "job-123456789012345678901", "$(touch X)", " job-7"}) {
    EXPECT_FALSE(IsJobId(bad)) << bad;
    EXPECT_THAT(CheckJobId(bad), StatusIs(StatusCode::kInvalidArgument, HasSubstr("unusable job id")));
  }
  const Status s = CheckJobId("job-1\x1b[2J");
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument,
                          HasSubstr("unusable job id 'job-1\\x1b[2J' (expected job-N, e.g. job-7)")));
}

TEST(JobHosts, LocalAgentsAndSshHostsThatPassOpenSshRules) {
  for (const std::string ok :
       {"gpu-box", "me@gpu-box:2222", "[::1]:22", "local", "localhost", "local:/tmp/a b"})
    EXPECT_TRUE(CheckJobHost(ok).ok()) << ok << ": " << CheckJobHost(ok).ToString();
  EXPECT_THAT(CheckJobHost("gpu-box/$(touch${IFS}INJECTED)"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("host \"gpu-box/$(touch${IFS}INJECTED)\" is refused: it contains '$'")));
  EXPECT_THAT(CheckJobHost("$(id)@gpu-box"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("user name")));
  EXPECT_THAT(CheckJobHost("-oProxyCommand=x"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("it starts with '-'")));
  EXPECT_THAT(CheckJobHost("local:/tmp/\x1b[2J"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("contains a control character")));
}

TEST(JobRefs, RegistryRefusesBadHostsAndIdsBeforeLookingUp) {
  TempDir tmp("jobref");
  JobRegistry reg(tmp.path() + "/jobs.json");
  ASSERT_TRUE(reg.Add(Record("gpu-box", "job-7")).ok());
  EXPECT_EQ(reg.Resolve("gpu-box/job-7")->id, "job-7");
  EXPECT_THAT(reg.Resolve(kInjected),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("host \"gpu-box/$(touch${IFS}INJECTED)\" is refused: it contains '$'")));
  EXPECT_THAT(reg.Resolve("gpu-box/job_7"),
              StatusIs(StatusCode::kNotFound, HasSubstr("'job_7' is not a job id (HOST/job-N)")));
  EXPECT_THAT(reg.Resolve("gpu-box/job-7\x1b[2J"),
              StatusIs(StatusCode::kNotFound, HasSubstr("unknown job 'gpu-box/job-7\\x1b[2J'")));
  // An id that is not a job id is never stored...
  EXPECT_THAT(reg.Add(Record("gpu-box", "job-8;touch x")),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unusable job id 'job-8;touch x'")));
  JobRecord multi = Record("gpu-box", "job-9");
  multi.nodes.push_back(Record("gpu-2", "$(id)").nodes[0]);
  EXPECT_THAT(reg.Add(multi), StatusIs(StatusCode::kInvalidArgument, HasSubstr("unusable job id '$(id)'")));
  // ...and one already in the file (a hand edit, an old sftctl) is ignored.
  std::ofstream(reg.path()) << R"json({"version": 1, "jobs": [
      {"host": "gpu-box", "id": "job-7", "name": "good"},
      {"host": "gpu-box", "id": "$(touch x)", "name": "bad"},
      {"host": "gpu-box", "id": "job-8", "name": "bad-node",
       "nodes": [{"host": "gpu-box", "id": "job-8"}, {"host": "b", "id": "job-8`id`"}]}]})json";
  auto all = reg.Load();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].name, "good");
  EXPECT_EQ(reg.Resolve("bad").status().code(), StatusCode::kNotFound);
}

TEST(JobRefs, ResolveJobChecksTheHostAndIdOfEveryForm) {
  TempDir tmp("jobref");
  JobRegistry reg(tmp.path() + "/jobs.json");
  RemoteOptions o;
  auto r = ResolveJob(kInjected, o, reg);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument,
                          StartsWith("job 'gpu-box/$(touch${IFS}INJECTED)/job-7': host "
                                     "\"gpu-box/$(touch${IFS}INJECTED)\" is refused: it contains '$'")));
  EXPECT_THAT(ResolveJob("a b/job-1", o, reg), StatusIs(StatusCode::kInvalidArgument, HasSubstr("a space")));
  EXPECT_THAT(ResolveJob("gpu-box/job-1;id", o, reg),
              StatusIs(StatusCode::kNotFound, HasSubstr("not a job id")));
  // A good reference the registry does not know: reached with the command's options.
  auto ok = ResolveJob("me@gpu-box:2222/job-3", o, reg);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->nodes.at(0).host, "me@gpu-box:2222");
  EXPECT_EQ(ok->nodes.at(0).id, "job-3");
  // With --host: the host and JOB (an agent's id) are checked too.
  o.hosts = {"gpu;touch${IFS}X"};
  EXPECT_THAT(ResolveJob("job-3", o, reg),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("host \"gpu;touch${IFS}X\" is refused")));
  o.hosts = {"gpu-box"};
  EXPECT_THAT(ResolveJob("$(id)", o, reg),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("JOB is the agent's job id (job-N)")));
  EXPECT_THAT(ResolveJob("gpu-box/job-x", o, reg),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("job-N")));
  EXPECT_TRUE(ResolveJob("gpu-box/job-3", o, reg).ok());
}

// The report: `Host *` + `ProxyCommand true %h %p` in ~/.ssh/config, and a job reference whose host
// part holds `$(...)`. sftctl must refuse it (exit 2, naming the host) and run nothing.
TEST(JobRefs, SftctlLogsNeverRunsACommandHiddenInAJobReference) {
  TempDir tmp("jobref-e2e");
  const std::string home = tmp.path();
  std::filesystem::create_directories(home + "/.ssh");
  std::ofstream(home + "/.ssh/config") << "Host *\n  ProxyCommand true %h %p\n";
  for (const std::string& cmd :
       {std::string("logs '") + kInjected + "'", std::string("status '$(touch${IFS}INJECTED)@gpu-box/job-7'"),
        std::string("logs --host 'gpu-box;touch${IFS}INJECTED' job-7")}) {
    const auto r = RunShell("cd '" + home + "' && HOME='" + home + "' XDG_CONFIG_HOME='" + home +
                            "/.config' SSH_AUTH_SOCK= " + Bin("sftctl") + " " + cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("is refused: it contains")) << cmd;
    EXPECT_FALSE(std::filesystem::exists(home + "/INJECTED")) << cmd << "\n" << r.output;
  }
}

}  // namespace
}  // namespace sftctl::client
