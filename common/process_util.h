// Small process helpers shared by the client's local rank launcher and the agent's supervisor.
// Stateless and thread-safe.
#pragma once

#include <sys/types.h>

#include <string>

namespace sftctl {

// "SIGKILL" etc. (the same names on Linux and macOS, from a table); "signal N" for a number without
// a name (e.g. real-time signals).
std::string SignalName(int sig);

// How a process ended, for messages: "exit code 1" or "killed by signal 9 (SIGKILL)".
// `sig` != 0 means it was killed by that signal (exit_code is then ignored).
std::string DescribeExit(int exit_code, int sig);

// A pidfd for `pid` (readable once the process has exited; the caller closes it), or -1 where the
// kernel has none, and always off Linux (callers then poll with waitpid, or use ChildExitWatch
// from common/child_exit_watch.h, which falls back to a SIGCHLD self-pipe).
int OpenPidFd(pid_t pid);

// A currently free TCP port (e.g. for MASTER_PORT): on 127.0.0.1, or with `any_interface` on every
// interface (a multi-node TCPStore is reached from other hosts). 29500 if none could be probed.
// Another process may take the port before it is used.
int FreeTcpPort(bool any_interface = false);

}  // namespace sftctl
