// Small process helpers shared by the client's local rank launcher and the agent's supervisor.
// Stateless and thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace sftctl {

// The children that get a filtered copy of their launcher's environment.
enum class ChildKind {
  kRank,          // a trainer rank (the agent's, and `sftctl run --local --ranks N`)
  kStopCommand,   // the agent's stop action (`/bin/sh -c`, agent/process/command_runner.h)
  kSlurmCommand,  // the agent's Slurm commands (sbatch, srun, squeue, ...; agent/slurm/slurm_cli.h)
};
// Whether the variable `name` passes to a child of `kind`: the one allowlist of names and name
// prefixes (docs/agent.md lists it), so that the secrets an agent holds (HF_TOKEN, LAMBDA_API_KEY, AWS
// keys from ~/.config/sftd/env) reach only a child that uses them. Both get the basics (PATH, HOME,
// USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TMPDIR, TERM); a rank also the loader, GPU,
// collective, thread-pool and torch tuning variables and SFTCTL_*; a stop command the cloud APIs'
// variables (LAMBDA_*, RUNPOD_*, AWS_*, AZURE_*, GOOGLE_*, CLOUDSDK_*), proxies and CA bundles; a
// Slurm command the basics only (what sbatch or srun carries may reach a job: the agent adds
// SLURM_CONF itself, and a Slurm job's ranks get the rank allowlist from their job folder,
// agent/slurm/sbatch_script.h).
bool ChildEnvAllowed(std::string_view name, ChildKind kind);
// The allowlist's entries for `kind`, in its order: names ("PATH") and prefixes ending in '*' ("LC_*"),
// each of [A-Za-z0-9_*] (so that a shell `case` pattern can take them as they are).
std::vector<std::string> ChildEnvPatterns(ChildKind kind);
// The entries of `inherited` (NAME=value strings, null-terminated; nullptr: this process's environ)
// whose name ChildEnvAllowed passes, in their order.
std::vector<std::string> ChildEnvironment(ChildKind kind, const char* const* inherited = nullptr);

// "SIGKILL" etc. (the same names on Linux and macOS, from a table); "signal N" for a number without
// a name (e.g. real-time signals).
std::string SignalName(int sig);

// How a process ended, for messages: "exit code 1" or "killed by signal 9 (SIGKILL)".
// `sig` != 0 means it was killed by that signal (exit_code is then ignored).
std::string DescribeExit(int exit_code, int sig);

// A pidfd for `pid` (readable once the process has exited; the caller closes it), or -1 where the
// kernel has none, and always off Linux (callers then poll with waitpid, or use ChildExitWatch
// from common/os/child_exit_watch.h, which falls back to a SIGCHLD self-pipe).
int OpenPidFd(pid_t pid);

// A currently free TCP port (e.g. for MASTER_PORT): on 127.0.0.1, or with `any_interface` on every
// interface (a multi-node TCPStore is reached from other hosts). 29500 if none could be probed.
// Another process may take the port before it is used.
int FreeTcpPort(bool any_interface = false);

}  // namespace sftctl
