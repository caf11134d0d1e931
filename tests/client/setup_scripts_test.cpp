// The project's own scripts install everything its tests and its hosts need: a test that passes only
// where something else installed a package earlier is a test that fails on a newcomer's fresh machine
// (HostScript.ProbeDescribesThisMachine did, for ccache). Reads the package lists of
// deploy/install-deps.sh and deploy/host/sftctl-host.sh as bash itself reads them.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

#include "tests/util/command.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl::client {
namespace {

using sftctl::testing::RunShell;

const std::string kSource = SFTCTL_SOURCE_DIR;

std::set<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::set<std::string> out;
  for (std::string w; in >> w;) out.insert(w);
  return out;
}

// The packages `deploy/install-deps.sh` installs for a build and the tests (both arrays, comments
// dropped by bash).
// With build-essential, what it depends on (g++, make, ...), as dpkg lists it.
std::set<std::string> InstallDepsPackages() {
  const std::string cmd = "eval \"$(sed -n '/^BUILD_PKGS=(/,/^)/p;/^TEST_PKGS=(/,/^)/p' '" + kSource +
                          "/deploy/install-deps.sh')\" && echo \"${BUILD_PKGS[@]} ${TEST_PKGS[@]}\"";
  std::set<std::string> out = Words(RunShell(cmd).output);
  if (out.count("build-essential") > 0) {
    const std::string deps =
        RunShell("dpkg-query -W -f='${Depends}' build-essential | tr ',|' '\\n\\n' | sed 's/(.*//'").output;
    for (const std::string& d : Words(deps)) out.insert(d);
  }
  return out;
}

TEST(SetupScripts, InstallDepsCoversEveryHostPackage) {
  const std::set<std::string> installed = InstallDepsPackages();
  ASSERT_GT(installed.size(), 20u) << "the lists of install-deps.sh were not found";
  const std::string host_cmd = "eval \"$(sed -n '/^HOST_PKGS=\"/,/\"$/p' '" + kSource +
                               "/deploy/host/sftctl-host.sh')\" && echo \"$HOST_PKGS\"";
  const std::set<std::string> host = Words(RunShell(host_cmd).output);
  ASSERT_GT(host.size(), 10u) << "HOST_PKGS of sftctl-host.sh was not found";
  // HostScript.ProbeDescribesThisMachine wants none of them missing on a machine set up by setup.sh.
  for (const std::string& p : host)
    EXPECT_EQ(installed.count(p), 1u) << p << " (HOST_PKGS) is not in install-deps.sh";
}

// setup.sh ends its build with one short line (it printed the names of all ~90 programs of bin/):
// the three binaries a user types or a host runs, and a count of the rest.
TEST(SetupScripts, BuildSummaryNamesTheThreeBinariesAndCountsTheRest) {
  const std::string dir = sftctl::testing::MakeTempDir("setup-summary");
  const std::string fn = "eval \"$(sed -n '/^built_summary() {/,/^}/p' '" + kSource + "/deploy/setup.sh')\"";
  auto r = RunShell("cd " + dir +
                    " && touch sftctl sftd sftctl-trainer spec_test demo_test agent_bench notes.txt" +
                    " && chmod +x sftctl sftd sftctl-trainer spec_test demo_test agent_bench && " + fn +
                    " && built_summary " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "setup: built sftctl, sftd, sftctl-trainer in " + dir + " (and 3 test and tool programs)\n");
  r = RunShell("cd " + dir + " && rm sftd sftctl-trainer && " + fn + " && built_summary " + dir);
  EXPECT_EQ(r.output, "setup: built sftctl in " + dir + " (and 3 test and tool programs)\n");
}

}  // namespace
}  // namespace sftctl::client
