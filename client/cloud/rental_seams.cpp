// DefaultRentalSeams (rental.h): the new host reached over real SSH and set up by the real bootstrap.
#include <memory>

#include "client/bootstrap/bootstrap.h"
#include "client/cloud/rental.h"
#include "client/remote/ssh/remote_agent.h"

namespace sftctl::client::cloud {
namespace {

Status Ready(const ConnectOptions& opts) {
  ConnectOptions o = opts;
  o.connect_timeout_s = 10;
  auto session = OpenSshSession(o);
  return session.ok() ? OkStatus() : session.status();
}

// Only `sftd start --detach` with the agent's flags (an image that has sftd: --no-bootstrap).
Status StartAgent(const ConnectOptions& opts, const std::vector<std::string>& agent_args) {
  // The environment file is loaded as the bootstrap script loads it (the stop action's keys).
  std::string cmd = "f=" + HostAgentEnvFile() + "; if [ -r \"$f\" ]; then set -a; . \"$f\"; set +a; fi; ";
  cmd += opts.sftd.empty() ? "S=$(command -v sftd || echo \"$HOME/.local/bin/sftd\"); \"$S\""
                           : ShellQuote(opts.sftd);
  cmd += " start --detach";
  if (!opts.agent_data_dir.empty()) cmd += " --data-dir " + ShellQuote(opts.agent_data_dir);
  for (const auto& a : agent_args) cmd += " " + ShellQuote(a);
  auto shell = NewSshHostShell(opts);
  SFT_ASSIGN_OR_RETURN(ssh::ExecResult r, shell->Run(cmd, "", 120));
  if (r.exit_code != 0) {
    return FailedPreconditionError(opts.host + ": starting the agent failed (exit " +
                                   std::to_string(r.exit_code) + "): " + r.err.substr(0, 2000));
  }
  return OkStatus();
}

Status Setup(const ConnectOptions& opts, bool bootstrap, const std::vector<std::string>& agent_args) {
  if (!bootstrap) return StartAgent(opts, agent_args);
  BootstrapOptions bo;
  bo.agent_args = agent_args;
  bo.out = &std::cerr;
  auto r = Bootstrap(opts, bo);
  return r.ok() ? OkStatus() : r.status();
}

// Replaces the lines of the same names in the agent's environment file (keeping the others).
Status SetAgentEnv(const ConnectOptions& opts, const std::vector<std::string>& lines) {
  std::string names, content;
  for (const auto& l : lines) {
    names += (names.empty() ? "" : "|") + l.substr(0, l.find('='));
    content += l + "\n";
  }
  const std::string cmd =
      "umask 077; f=" + HostAgentEnvFile() +
      "; mkdir -p \"$(dirname \"$f\")\" && { if [ -f \"$f\" ]; then grep -v -E '^(" + names +
      ")=' \"$f\" || true; fi; cat; } >\"$f.tmp\" && chmod 600 \"$f.tmp\" && mv -f \"$f.tmp\" \"$f\"";
  auto shell = NewSshHostShell(opts);
  SFT_ASSIGN_OR_RETURN(ssh::ExecResult r, shell->Run(cmd, content, 60));
  if (r.exit_code != 0) {
    return FailedPreconditionError(opts.host + ": writing the agent's environment file failed (exit " +
                                   std::to_string(r.exit_code) + "): " + r.err.substr(0, 2000));
  }
  return OkStatus();
}

}  // namespace

RentalSeams DefaultRentalSeams() { return RentalSeams{Ready, Setup, SetAgentEnv}; }

}  // namespace sftctl::client::cloud
