// Which processes a test started, so that none outlives it (issue 49: a test that is killed leaves
// nothing running).
//
// A test program (tests/util/tmpdir_guard.cpp) or a test session (tests/util/test_session.cpp, the
// wrapper of the script tests) appends its owner token, "<pid>.<start time>", to the environment
// variable SFTCTL_TEST_OWNER (a comma-separated list: a test run by another test carries both tokens).
// Every process it starts from then on inherits the variable, whatever it does next: a daemon that
// detaches (setsid and a second fork, as `sftd start --detach`), a server a script leaves in the
// background (moto, slurmd), an sshd session's commands (the test sshd configurations pass it on with
// SetEnv), a trainer rank (the agent passes SFTCTL_* to its ranks). So "the processes of test T" is
// "the processes whose initial environment names T", found through /proc whatever their parent now is.
//
// StartWatchdog leaves one small process outside the test's process tree (ctest kills the tree of a
// test that ran past its limit, and a detached daemon is no longer in it): once the test is gone, for
// any reason, SIGKILL included, it kills what carries the test's token and writes what it killed into
// a report (sftctl-survivors-<pid>.txt) that the next test program prints (SweepLeftovers).
//
// Linux only (/proc); elsewhere (macOS) every function is a no-op that finds nothing, and the tests
// rely on their own teardown. A process that clears its environment (env -i) is not found. The
// processes of this uid only (another user's environment cannot be read). Thread-compatible: call from
// one thread; StartWatchdog forks, so call it before the test starts threads.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace sftctl::testing {

inline constexpr char kTestOwnerVar[] = "SFTCTL_TEST_OWNER";

struct OwnedProcess {
  pid_t pid = 0;
  std::string command;  // its command line, arguments joined by spaces (cut at 300 characters)
};

// "<pid>.<start time in clock ticks since boot>" of a running process; "" when it is not running (or
// off Linux). The start time tells a reused pid apart.
std::string OwnerToken(pid_t pid);

// Whether the process a token names still runs (not a zombie). False for a malformed token.
bool OwnerAlive(const std::string& token);

// Appends this process's token to SFTCTL_TEST_OWNER in its own environment (the children it starts
// from now on carry it) and returns the token; "" (and nothing set) off Linux.
std::string MarkChildren();

// The running processes other than this one whose SFTCTL_TEST_OWNER names `token`.
std::vector<OwnedProcess> OwnedProcesses(const std::string& token);

// The running processes whose SFTCTL_TEST_OWNER names a test that is gone: what a killed test left.
std::vector<OwnedProcess> OrphanedProcesses();

// SIGKILLs what OwnedProcesses(token) finds, again until two scans in a row find nothing (a process
// forked meanwhile carries the token too; one in the middle of an exec may not show its environment
// for an instant) or `patience` passed; returns each process it signalled, once.
std::vector<OwnedProcess> KillOwned(const std::string& token,
                                    std::chrono::milliseconds patience = std::chrono::seconds(5));

// Waits up to `grace` for the processes of `token` to end by themselves (two scans in a row find none);
// returns those still running.
std::vector<OwnedProcess> WaitOwnedGone(const std::string& token, std::chrono::milliseconds grace);

// One line per process, "    pid N: command", each ending in a newline.
std::string DescribeProcesses(const std::vector<OwnedProcess>& procs);

// Starts the watchdog of `token` (this process's): a grandchild in a session of its own, with no
// descriptor of the test's (ctest waits for the test's output to close), that checks four times a
// second whether the owner still runs; once it does not, it kills the owner's processes, writes
// <report_dir>/sftctl-survivors-<owner pid>.txt naming them when there were any, and exits. False when
// it could not be started (or off Linux).
bool StartWatchdog(const std::string& token, const std::string& report_dir);

// What a test killed before this one left, cleaned up under `base` (the tests' $TMPDIR base): kills the
// orphaned processes, then prints (to stderr, naming them) both those and the watchdogs' reports, and
// removes the reports. `who` names the caller in the message ("the test program", ...).
void SweepLeftovers(const std::string& base, const std::string& who);

// A test program's folder: <base>/sftctl-proc-<pid>-XXXXXX, made; "" when it could not be made. Its
// program points $TMPDIR there and removes it at exit.
std::string MakeProgramFolder(const std::string& base);

// Removes the program folders under `base` whose programs died before they could (killed at a
// timeout): those whose pid no longer runs. One whose pid was reused stays until the next time.
void RemoveOrphanFolders(const std::string& base);

}  // namespace sftctl::testing
