#include "client/bootstrap/host_probe.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "common/terminal_text.h"

namespace sftctl::client {
namespace {

constexpr size_t kMaxValue = 4096;       // a longer value is cut
constexpr size_t kMaxGpus = 64;          // more lines are ignored
constexpr size_t kMaxProblemLines = 32;  // of torch_problem; more are ignored
constexpr int64_t kMinFreeMib = 3072;    // source, two builds and the binaries

int64_t ToInt(const std::string& v, int64_t fallback) {
  if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos) return fallback;
  return std::strtoll(v.c_str(), nullptr, 10);
}

std::vector<std::string> Words(const std::string& v) {
  std::istringstream in(v);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

void Set(HostProbe* p, const std::string& key, const std::string& v) {
  static const std::pair<const char*, std::string HostProbe::*> kStrings[] = {
      {"os_id", &HostProbe::os_id},
      {"os_version", &HostProbe::os_version},
      {"os_name", &HostProbe::os_name},
      {"arch", &HostProbe::arch},
      {"user", &HostProbe::user},
      {"sudo", &HostProbe::sudo},
      {"pid1", &HostProbe::pid1},
      {"home", &HostProbe::home},
      {"python", &HostProbe::python},
      {"python_version", &HostProbe::python_version},
      {"torch_version", &HostProbe::torch_version},
      {"torch_cuda", &HostProbe::torch_cuda},
      {"torch_cmake", &HostProbe::torch_cmake},
      {"torch_abi", &HostProbe::torch_abi},
      {"system_torch_cmake", &HostProbe::system_torch_cmake},
      {"torch_plan", &HostProbe::torch_plan},
      {"torch_plan_detail", &HostProbe::torch_plan_detail},
      {"cxx", &HostProbe::cxx},
      {"cmake", &HostProbe::cmake},
      {"ninja", &HostProbe::ninja},
      {"ccache", &HostProbe::ccache},
      {"nvcc", &HostProbe::nvcc},
      {"package_manager", &HostProbe::package_manager},
      {"storage", &HostProbe::storage},
      {"installed", &HostProbe::installed},
      {"archive_sha256", &HostProbe::archive_sha256},
      {"status", &HostProbe::status},
      {"worker", &HostProbe::worker},
      {"agent", &HostProbe::agent_json},
      {"data_dir_config", &HostProbe::data_dir_config},
  };
  for (const auto& [name, field] : kStrings) {
    if (key == name) {
      p->*field = v;
      return;
    }
  }
  if (key == "gpu_count") p->gpu_count = static_cast<int>(std::min<int64_t>(ToInt(v, 0), 1024));
  if (key == "gpu" && p->gpus.size() < kMaxGpus) p->gpus.push_back(v);
  if (key == "torch_problem" && p->torch_problem.size() < kMaxProblemLines) p->torch_problem.push_back(v);
  if (key == "nproc") p->nproc = static_cast<int>(std::clamp<int64_t>(ToInt(v, 1), 1, 4096));
  if (key == "home_free_mib") p->home_free_mib = ToInt(v, -1);
  if (key == "storage_free_mib") p->storage_free_mib = ToInt(v, -1);
  if (key == "missing_packages") p->missing_packages = Words(v);
}

std::string Gib(int64_t mib) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(mib) / 1024.0);
  return buf;
}

std::string Or(const std::string& v, const char* none) { return v.empty() ? none : v; }

}  // namespace

StatusOr<HostProbe> ParseHostProbe(const std::string& output) {
  HostProbe p;
  bool seen = false;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0 || eq > 64) continue;
    std::string key = line.substr(0, eq), value = line.substr(eq + 1, kMaxValue);
    while (!value.empty() && (value.back() == '\r' || value.back() == ' ')) value.pop_back();
    if (key == "probe" && value == "1") seen = true;
    Set(&p, key, value);
  }
  if (!seen) {
    return InternalError("the host's probe printed no probe=1 line; its output begins: " +
                         EscapeForTerminal(output.substr(0, 300)));
  }
  return p;
}

std::string FormatHostProbe(const HostProbe& p) {
  std::vector<std::pair<std::string, std::string>> rows;
  std::string os = Or(p.os_name, "unknown") + ", " + Or(p.arch, "?");
  rows.push_back({"OS", os});
  rows.push_back({"user", Or(p.user, "?") +
                              (p.sudo == "root"  ? " (root)"
                               : p.sudo == "yes" ? " (sudo)"
                                                 : " (no sudo)") +
                              ", init " + Or(p.pid1, "?")});
  std::string gpus = "none (the trainer runs on the CPU)";
  if (p.gpu_count > 0) {
    gpus = std::to_string(p.gpu_count) + " x " + (p.gpus.empty() ? std::string("?") : p.gpus.front());
  }
  rows.push_back({"GPUs", gpus});
  std::string torch = "none";
  if (!p.torch_version.empty()) {
    torch = "torch " + p.torch_version + (p.torch_cuda.empty() ? " (CPU)" : " (CUDA " + p.torch_cuda + ")") +
            ", C++ ABI " + Or(p.torch_abi, "?") + ", " + Or(p.python, "python") + " " + p.python_version;
  }
  rows.push_back({"PyTorch", torch});
  std::string libtorch = p.TorchPrefix().empty() ? "not found" : p.TorchPrefix();
  if (p.TorchPrefix().empty() && (p.torch_plan == "install" || p.torch_plan == "apt")) {
    libtorch += "; to install: " + p.torch_plan_detail;
  }
  if (!p.torch_cuda.empty()) {
    libtorch += p.nvcc.empty() ? "; no CUDA toolkit (nvcc) found: a CUDA LibTorch's CMake config may need it"
                               : "; CUDA toolkit " + p.nvcc;
  }
  rows.push_back({"LibTorch", libtorch});
  rows.push_back({"compiler", Or(p.cxx, "none") + "; cmake " + Or(p.cmake, "none") + "; " +
                                  (p.ccache.empty() ? "no ccache" : "ccache") + "; " +
                                  std::to_string(p.nproc) + " cores"});
  rows.push_back({"disk", p.home_free_mib >= 0 ? Gib(p.home_free_mib) + " free in " + Or(p.home, "~") : "?"});
  rows.push_back({"storage", p.storage.empty()
                                 ? "none that survives the instance"
                                 : p.storage + " (" + Gib(p.storage_free_mib) + " free, survives)"});
  rows.push_back({"packages", p.package_manager != "apt" ? "no apt: packages are not checked"
                              : p.missing_packages.empty()
                                  ? "all present"
                                  : std::to_string(p.missing_packages.size()) + " missing"});
  std::string installed = "not installed";
  if (!p.installed.empty()) {
    installed = "source " + p.installed.substr(0, 12);
    if (p.installed.find(" agent-only") != std::string::npos) installed += " (sftd only)";
  }
  rows.push_back({"sftctl", installed});
  std::string out;
  for (const auto& [k, v] : rows) {
    std::string key = k;
    key.resize(10, ' ');
    out += "  " + key + EscapeForTerminal(v) + "\n";
  }
  return out;
}

std::string BootstrapBlocker(const HostProbe& p, bool install_deps) {
  if (!p.os_id.empty() && p.os_id != "debian" && p.os_id != "ubuntu" && p.package_manager != "apt") {
    if (!p.missing_packages.empty() || p.cxx.empty() || p.cmake.empty()) {
      return "the host runs " + p.os_id + ", and sftctl installs packages only with apt (Debian, Ubuntu)";
    }
  }
  if (p.torch_plan == "none") {
    std::string why;
    for (const auto& line : p.torch_problem) why += (why.empty() ? "" : "\n  ") + line;
    return why.empty()
               ? "no usable LibTorch for the trainer on the host (bootstrap with --agent-only for sftd alone)"
               : why;
  }
  if (!p.missing_packages.empty()) {
    std::string list;
    for (const auto& m : p.missing_packages) list += " " + m;
    if (!install_deps)
      return "packages are missing (and --no-install-deps was given): sudo apt-get install -y" + list;
    if (p.sudo == "no") {
      return "packages are missing and " + Or(p.user, "the user") +
             " has neither root nor password-less sudo; ask an administrator to run: sudo apt-get install "
             "-y" +
             list;
    }
  }
  if (p.home_free_mib >= 0 && p.home_free_mib < kMinFreeMib) {
    return "only " + Gib(p.home_free_mib) + " free in " + Or(p.home, "~") + "; the build needs about " +
           Gib(kMinFreeMib);
  }
  return "";
}

}  // namespace sftctl::client
