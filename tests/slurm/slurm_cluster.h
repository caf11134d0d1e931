// A real 2-node Slurm cluster on 127.0.0.1 for tests (tests/slurm/slurm_cluster.sh): munged,
// slurmctld and two slurmd (n1, n2) as the user running the test, on free ports, in a folder of
// MakeTempDir (removed at exit), stopped by the destructor. No accounting storage (sacct says so).
// Needs the packages munge slurmctld slurmd slurm-client (deploy/install-deps.sh TEST_PKGS).
//
// Thread-compatible: one test thread uses it.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>

#include "common/os/process_util.h"
#include "tests/util/command.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl::testing {

class SlurmCluster {
 public:
  // Starts a cluster with `cpus` CPU slots per node; nullptr after an ADD_FAILURE with the script's
  // output when it cannot start.
  static std::unique_ptr<SlurmCluster> Start(int cpus = 1) {
    auto c = std::unique_ptr<SlurmCluster>(new SlurmCluster(MakeTempDir("slurm")));
    const int node_port = TwoFreePorts();
    const CommandResult r =
        c->Script({"start", std::to_string(FreeTcpPort()), std::to_string(node_port), std::to_string(cpus)});
    if (r.exit_code != 0) {
      ADD_FAILURE() << "the Slurm test cluster did not start:\n" << r.output;
      return nullptr;
    }
    return c;
  }
  // Stops the cluster; after a failed test, first prints the daemons' last errors (why a job did
  // not launch, a node went down, ...).
  ~SlurmCluster() {
    if (::testing::Test::HasFailure()) {
      std::cerr << "the Slurm test cluster's last errors:\n" << Script({"errors"}).output;
    }
    Script({"stop"});
  }

  const std::string& dir() const { return dir_; }
  std::string conf() const { return dir_ + "/etc/slurm.conf"; }
  std::string env() const { return "SLURM_CONF=" + conf(); }
  // `bash -c command` with this cluster's SLURM_CONF.
  CommandResult Shell(const std::string& command) const {
    return RunCommand({"bash", "-c", command}, {env()});
  }
  // A dead machine: SIGKILL of the node's slurmd, its slurmstepd and their tasks.
  CommandResult KillNode(const std::string& node) const { return Script({"kill-node", node}); }
  CommandResult StartNode(const std::string& node) const { return Script({"start-node", node}); }

 private:
  explicit SlurmCluster(std::string dir) : dir_(std::move(dir)) {}

  CommandResult Script(std::vector<std::string> args) const {
    args.insert(args.begin(),
                {"bash", std::string(SFTCTL_SOURCE_DIR) + "/tests/slurm/slurm_cluster.sh", dir_});
    return RunCommand(args);
  }

  static bool PortFree(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (fd >= 0) ::close(fd);
    return ok;
  }
  // A port P with P and P+1 free (the two slurmd).
  static int TwoFreePorts() {
    for (int i = 0; i < 50; ++i) {
      const int p = FreeTcpPort(true);
      if (p < 65535 && PortFree(p) && PortFree(p + 1)) return p;
    }
    return 17001;
  }

  std::string dir_;
};

}  // namespace sftctl::testing
