// What `sftctl bootstrap` learns about a GPU host in one SSH round trip: the key=value lines of
// `sftctl-host.sh probe` (deploy/host/sftctl-host.sh), parsed into a HostProbe, shown as a table.
//
// The host is not trusted: values are bounded, unknown keys are ignored, and everything shown on the
// terminal goes through EscapeForTerminal. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace sftctl::client {

struct HostProbe {
  std::string os_id, os_version, os_name, arch, user;
  std::string sudo;  // "root", "yes" (password-less sudo) or "no"
  std::string pid1;  // "systemd", "bash", ...
  std::string home;
  int gpu_count = 0;
  std::vector<std::string> gpus;  // "NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"
  std::string python, python_version, torch_version, torch_cuda, torch_cmake, torch_abi;
  std::string system_torch_cmake;  // a C++ LibTorch (Debian's libtorch-dev) when there is one
  // The host script's LibTorch decision for the worker flags the probe was given (torch_decide in
  // deploy/host/sftctl-host.sh): "python", "system", "install" (--install-torch), "apt", "none" or
  // "not-needed" (--agent-only); empty from an older script. torch_plan_detail says what it uses or
  // installs. With "none", torch_problem holds the lines of the message: what was found, what is
  // needed, the commands that fix it.
  std::string torch_plan, torch_plan_detail;
  std::vector<std::string> torch_problem;
  std::string cxx, cmake, ninja, ccache;
  std::string nvcc;  // the CUDA toolkit's version, empty when there is none
  int nproc = 1;
  int64_t home_free_mib = -1;
  std::vector<std::string> missing_packages;
  std::string package_manager;  // "apt" or "none"
  std::string storage;          // storage that survives the instance (/workspace, /lambda/nfs/x)
  int64_t storage_free_mib = -1;
  std::string installed;       // source id of the installed sftd/sftctl-trainer, empty if none
  std::string archive_sha256;  // of the archive already uploaded, empty if none
  std::string status;          // the bootstrap worker's status line
  std::string worker;          // pid of a live worker, empty if none
  std::string agent_json;      // `sftd status --json` of the installed sftd
  std::string data_dir_config;

  // The LibTorch CMake prefix the trainer will be built against (empty: none found).
  std::string TorchPrefix() const { return !torch_cmake.empty() ? torch_cmake : system_torch_cmake; }
};

// Parses the probe's output. INTERNAL (quoting the start of the output) when it is not a probe:
// no "probe=1" line (e.g. the shell printed a banner and failed).
StatusOr<HostProbe> ParseHostProbe(const std::string& output);

// The probe as a two-column table for humans (escaped), e.g.
//   OS       Debian GNU/Linux 13 (trixie), x86_64
//   GPUs     2 x NVIDIA H100 80GB HBM3, 81559 MiB (driver 550.54.15)
std::string FormatHostProbe(const HostProbe& p);

// Problems that stop a bootstrap before anything is uploaded, as one message (empty when none):
// not Linux, no usable LibTorch and none to install (the probe's torch_problem lines, one a line),
// no way to install missing packages, too little disk.
std::string BootstrapBlocker(const HostProbe& p, bool install_deps);

}  // namespace sftctl::client
