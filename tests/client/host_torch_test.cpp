// The host script's LibTorch decision (torch_decide in deploy/host/sftctl-host.sh), which `sftctl
// bootstrap` gets in its probe before it uploads, installs or builds anything: a usable pip torch
// (any Python, a venv, conda), else a C++ LibTorch new enough, else (--install-torch) PyTorch into
// sftctl's own venv, a CUDA wheel matching the GPU driver, else one message (found, needed, fix).
//
// Each case runs the real script (`torch-plan`, `probe`, `worker`) in a sandbox that stands for a host:
// PATH holds only fakes (python3, a venv's python, nvidia-smi, apt-cache, apt-get, sudo) and links to
// the basic tools, SFTCTL_HOST_ROOT stands for / (a fake TorchConfig.cmake of a distribution's
// LibTorch goes there), HOME is temporary. Nothing of this machine's own torch is seen.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "client/bootstrap/host_probe.h"
#include "tests/util/command.h"
#include "tests/util/temp_dir.h"
#include "tests/util/test_paths.h"

namespace sftctl::client {
namespace {

using sftctl::testing::RunShell;
using sftctl::testing::TempDir;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kScript = std::string(SFTCTL_SOURCE_DIR) + "/deploy/host/sftctl-host.sh";
constexpr const char* kWheels = "https://download.pytorch.org/whl/";

// What the script may run besides the fakes: linked into the sandbox's PATH from this machine's.
constexpr const char* kTools[] = {
    "bash",    "sh",       "cat",      "cut",  "sort",  "head",  "tail",  "sed",     "grep",
    "dirname", "basename", "ls",       "tr",   "mkdir", "env",   "uname", "id",      "df",
    "nproc",   "awk",      "rm",       "mv",   "cp",    "cmp",   "tar",   "gzip",    "sha256sum",
    "flock",   "date",     "hostname", "stat", "wc",    "touch", "chmod", "readlink"};

class TorchPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    RunShell("mkdir -p " + Bin() + " " + Tools() + " " + Root() + " " + Home());
    for (const char* t : kTools) {
      RunShell("p=$(command -v " + std::string(t) + ") && ln -sf \"$p\" " + Tools() + "/" + t);
    }
  }
  std::string Bin() const { return dir_.path() + "/bin"; }
  std::string Tools() const { return dir_.path() + "/tools"; }
  std::string Root() const { return dir_.path() + "/root"; }
  std::string Home() const { return dir_.path() + "/home"; }
  std::string Venv() const { return Home() + "/.local/share/sftctl/torch-venv"; }

  // An executable shell script at `path` (its folder made).
  void Exec(const std::string& path, const std::string& body) {
    RunShell("mkdir -p \"$(dirname '" + path + "')\"");
    std::ofstream(path) << "#!/bin/sh\n" << body;
    RunShell("chmod +x '" + path + "'");
  }
  // A Python at `path` whose torch answers the script's questions (python_torch) with these values;
  // an empty version: a Python without torch.
  void Python(const std::string& path, const std::string& version, const std::string& cuda = "",
              const std::string& cmake = "") {
    if (version.empty()) {
      Exec(path, "cat >/dev/null\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n");
      return;
    }
    const std::string site = path.substr(0, path.rfind("/bin/")) + "/lib/python3.10/site-packages/torch";
    Exec(path, "cat >/dev/null\necho python_version=3.10.12\necho torch_version=" + version +
                   "\necho torch_cuda=" + cuda + "\necho torch_cmake=" + cmake +
                   "\necho torch_abi=1\necho torch_dir=" + site + "\n");
  }
  // nvidia-smi reporting one GPU with this driver.
  void Driver(const std::string& version) {
    Exec(Bin() + "/nvidia-smi", "case \"$*\" in *driver_version*) echo " + version + " ;; esac\n");
  }
  // A distribution's LibTorch (its CMake config and version file) under ROOT/usr/lib/x86_64-linux-gnu.
  void SystemTorch(const std::string& version, bool cuda) {
    const std::string lib = Root() + "/usr/lib/x86_64-linux-gnu";
    RunShell("mkdir -p " + lib + "/cmake/Torch");
    std::ofstream(lib + "/cmake/Torch/TorchConfig.cmake") << "# a stand-in\n";
    std::ofstream(lib + "/cmake/Torch/TorchConfigVersion.cmake")
        << "set(PACKAGE_VERSION \"" << version << "\")\n";
    if (cuda) std::ofstream(lib + "/libtorch_cuda.so") << "";
  }
  // apt-cache offering libtorch-dev at `version` (Debian's spelling, e.g. "1.7.1-7").
  void AptCandidate(const std::string& version) {
    Exec(Bin() + "/apt-cache",
         "echo 'libtorch-dev:'\necho '  Installed: (none)'\necho '  Candidate: " + version + "'\n");
  }

  // Where the worker finds the uploaded source archive and writes its status.
  std::string BootDir() const { return Home() + "/.local/share/sftctl/bootstrap"; }
  // A one-file source archive (id "id1") in BootDir(): its sha256.
  std::string StageSourceArchive() {
    const std::string boot = BootDir();
    RunShell("mkdir -p " + boot + " " + dir_.path() + "/src && cd " + dir_.path() +
             "/src && echo id1 > SOURCE_ID && echo SOURCE_ID > SOURCES && tar -czf " + boot +
             "/sftctl-src.tar.gz SOURCE_ID SOURCES");
    return RunShell("sha256sum " + boot + "/sftctl-src.tar.gz | cut -d' ' -f1 | tr -d '\\n'").output;
  }

  std::string Env() const {
    return "env -i HOME=" + Home() + " PATH=" + Bin() + ":" + Tools() + " SFTCTL_HOST_ROOT=" + Root() + " ";
  }
  // `sftctl-host.sh torch-plan ARGS` in the sandbox, parsed as a probe. Also checks it took under
  // 5 s: the decision imports nothing heavy and installs nothing.
  HostProbe Plan(const std::string& args = "") {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string out = RunShell(Env() + "bash " + kScript + " torch-plan " + args + " 2>&1").output;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    auto p = ParseHostProbe("probe=1\n" + out);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    last_output_ = out;
    return p.ok() ? *p : HostProbe{};
  }
  std::string last_output_;
  TempDir dir_{"host-torch"};
};

TEST_F(TorchPlan, NoTorchAnywhereStopsWithFoundNeededAndTheFix) {
  Python(Bin() + "/python3", "");
  HostProbe p = Plan();
  EXPECT_EQ(p.torch_plan, "none") << last_output_;
  EXPECT_EQ(p.TorchPrefix(), "");
  const std::string pip = Venv() + "/bin/python -m pip install torch --index-url " + kWheels + "cpu";
  EXPECT_THAT(
      p.torch_problem,
      ElementsAre(
          "no usable LibTorch for the trainer on this host; nothing was installed or built.",
          "found: no Python with torch (python, python3, venvs, conda) and no C++ LibTorch",
          "needed: PyTorch or LibTorch 1.13 or newer (no GPU here: a CPU build will do)",
          "fix: run sftctl bootstrap again with --install-torch (installs torch from " +
              std::string(kWheels) + "cpu into " + Venv() + ")",
          "  or on the host: python3 -m venv " + Venv() + " && " + pip + "; then sftctl bootstrap again",
          "  (this host's python3 cannot make a venv: sudo apt-get install -y python3-venv first)",
          "  or sftctl bootstrap --agent-only: sftd alone, no trainer on this host"));
  // The client shows it as one message, a line each, before uploading anything.
  const std::string why = BootstrapBlocker(p, true);
  EXPECT_THAT(why,
              StartsWith("no usable LibTorch for the trainer on this host; nothing was installed or built.\n"
                         "  found: no Python with torch"));
  EXPECT_THAT(why, HasSubstr("\n  fix: run sftctl bootstrap again with --install-torch"));
}

// Debian 11 (Ubuntu 22.04's generation): libtorch-dev 1.7.1, installed or offered by apt, is older than
// anything the trainer builds against; it is named with its version and never used or installed.
TEST_F(TorchPlan, AnOldDistributionLibTorchIsRejectedByName) {
  Python(Bin() + "/python3", "");
  AptCandidate("1.7.1-7");
  HostProbe offered = Plan();
  EXPECT_EQ(offered.torch_plan, "none") << last_output_;
  EXPECT_THAT(offered.torch_problem,
              Contains("found: the distribution's libtorch-dev 1.7.1 (apt): older than 1.13"));

  SystemTorch("1.7.1", false);
  HostProbe installed = Plan();
  EXPECT_EQ(installed.torch_plan, "none") << last_output_;
  EXPECT_EQ(installed.system_torch_cmake, "");
  EXPECT_THAT(installed.torch_problem, Contains("found: LibTorch 1.7.1 (CPU) at " + Root() +
                                                "/usr/lib/x86_64-linux-gnu/cmake: older than 1.13"));
}

// The same places with a new enough LibTorch: Debian 12's candidate is installed by apt, an installed
// one is used as it is.
TEST_F(TorchPlan, ANewEnoughDistributionLibTorchIsUsedOnACpuHost) {
  AptCandidate("1.13.1+dfsg-4");
  HostProbe offered = Plan();
  EXPECT_EQ(offered.torch_plan, "apt") << last_output_;
  EXPECT_EQ(offered.torch_plan_detail, "the distribution's libtorch-dev 1.13.1 (apt, CPU)");
  EXPECT_THAT(offered.torch_problem, IsEmpty());

  SystemTorch("2.6.0", false);
  HostProbe installed = Plan();
  EXPECT_EQ(installed.torch_plan, "system") << last_output_;
  EXPECT_EQ(installed.system_torch_cmake, Root() + "/usr/lib/x86_64-linux-gnu/cmake");
}

TEST_F(TorchPlan, APipTorchInAVenvIsUsedBeforeAnythingElse) {
  Python(Bin() + "/python3", "");  // the system's python3: no torch
  SystemTorch("1.7.1", false);     // and an old LibTorch, not a reason to stop
  const std::string cmake = Home() + "/.venv/lib/python3.10/site-packages/torch/share/cmake";
  Python(Home() + "/.venv/bin/python", "2.5.1+cu124", "12.4", cmake);
  HostProbe p = Plan();
  EXPECT_EQ(p.torch_plan, "python") << last_output_;
  EXPECT_EQ(p.python, Home() + "/.venv/bin/python");
  EXPECT_EQ(p.torch_version, "2.5.1+cu124");
  EXPECT_EQ(p.torch_cmake, cmake);
  EXPECT_EQ(p.TorchPrefix(), cmake);
  EXPECT_THAT(p.torch_problem, IsEmpty());
  EXPECT_EQ(BootstrapBlocker(p, true), "");
}

TEST_F(TorchPlan, ATorchTooOldOrWithoutCMakeConfigIsNamedNotUsed) {
  Python(Home() + "/miniconda3/bin/python", "1.12.1", "", "/x/share/cmake");
  Python(Home() + "/venv/bin/python", "2.1.0", "", "");
  HostProbe p = Plan();
  EXPECT_EQ(p.torch_plan, "none") << last_output_;
  EXPECT_THAT(p.torch_problem,
              Contains("found: " + Home() + "/miniconda3/bin/python: torch 1.12.1 (CPU): older than 1.13"));
  EXPECT_THAT(
      p.torch_problem,
      Contains("found: " + Home() +
               "/venv/bin/python: torch 2.1.0 (CPU): no LibTorch CMake config (torch.utils.cmake_prefix_path "
               "has no Torch/TorchConfig.cmake)"));
  // The probe table still shows the first torch it saw.
  EXPECT_EQ(p.torch_version, "2.1.0");
}

TEST_F(TorchPlan, SftctlsOwnVenvAndAnExplicitPythonAreFound) {
  Python(Venv() + "/bin/python", "2.11.0+cpu", "", "/venv/share/cmake");
  EXPECT_EQ(Plan().torch_cmake, "/venv/share/cmake") << last_output_;
  Python(dir_.path() + "/elsewhere/python", "2.6.0", "", "/elsewhere/share/cmake");
  auto out =
      RunShell(Env() + "SFTCTL_PYTHON=" + dir_.path() + "/elsewhere/python bash " + kScript + " torch-plan");
  EXPECT_THAT(out.output, HasSubstr("\ntorch_cmake=/elsewhere/share/cmake\ntorch_plan=python\n"));
}

// A GPU host (nvidia-smi reports a driver): only a CUDA build of PyTorch 2.4+ will do. Without one,
// --install-torch installs the wheel of the newest CUDA the driver runs; without the flag, it stops.
TEST_F(TorchPlan, AGpuHostWithoutTorchGetsTheDriversCudaWheelOnlyWhenAsked) {
  Driver("580.65.06");
  Python(Bin() + "/python3", "");
  SystemTorch("2.6.0", false);  // Debian's CPU LibTorch: useless on a GPU
  HostProbe p = Plan();
  EXPECT_EQ(p.torch_plan, "none") << last_output_;
  EXPECT_THAT(p.torch_problem,
              Contains("found: LibTorch 2.6.0 (CPU) at " + Root() +
                       "/usr/lib/x86_64-linux-gnu/cmake: a CPU build, and this is a GPU host"));
  EXPECT_THAT(p.torch_problem, Contains("found: an NVIDIA GPU, driver 580.65.06"));
  EXPECT_THAT(
      p.torch_problem,
      Contains("needed: a CUDA build of PyTorch 2.4 or newer (pip wheel: any Python, a venv, conda)"));
  EXPECT_THAT(p.torch_problem,
              Contains("fix: run sftctl bootstrap again with --install-torch (installs torch from " +
                       std::string(kWheels) + "cu130 into " + Venv() + ")"));

  HostProbe install = Plan("--install-torch");
  EXPECT_EQ(install.torch_plan, "install") << last_output_;
  EXPECT_EQ(install.torch_plan_detail, "PyTorch from " + std::string(kWheels) + "cu130 into " + Venv());
  EXPECT_THAT(install.torch_problem, IsEmpty());
  EXPECT_EQ(BootstrapBlocker(install, true), "");
  EXPECT_THAT(last_output_, HasSubstr("torch_wheel=cu130\n"));

  Driver("535.104.05");
  Plan("--install-torch");
  EXPECT_THAT(last_output_, HasSubstr("torch_wheel=cu121\n"));
}

TEST_F(TorchPlan, AGpuHostNeedsACudaTorchNewEnough) {
  Driver("550.54.15");
  Python(Home() + "/venv/bin/python", "2.6.0+cpu", "", "/cpu/share/cmake");
  HostProbe cpu = Plan();
  EXPECT_EQ(cpu.torch_plan, "none") << last_output_;
  EXPECT_THAT(cpu.torch_problem,
              Contains("found: " + Home() +
                       "/venv/bin/python: torch 2.6.0+cpu (CPU): a CPU build, and this is a GPU host"));
  Python(Home() + "/venv/bin/python", "2.3.1+cu121", "12.1", "/old/share/cmake");
  HostProbe old = Plan();
  EXPECT_EQ(old.torch_plan, "none") << last_output_;
  EXPECT_THAT(old.torch_problem, Contains("found: " + Home() +
                                          "/venv/bin/python: torch 2.3.1+cu121 (CUDA 12.1): older than 2.4"));
  Python(Home() + "/venv/bin/python", "2.11.0+cu130", "13.0", "/cuda/share/cmake");
  HostProbe good = Plan();
  EXPECT_EQ(good.torch_plan, "python") << last_output_;
  EXPECT_EQ(good.torch_cmake, "/cuda/share/cmake");
}

TEST_F(TorchPlan, ADriverTooOldForAnyWheelSaysToUpdateIt) {
  Driver("470.82.01");
  HostProbe p = Plan("--install-torch");
  EXPECT_EQ(p.torch_plan, "none") << last_output_;
  EXPECT_THAT(
      p.torch_problem,
      Contains("fix: driver 470.82.01 is older than 520, the oldest that runs a PyTorch 2.4 CUDA wheel "
               "(CUDA 11.8): update the NVIDIA driver, then run sftctl bootstrap again"));
}

TEST_F(TorchPlan, AgentOnlyNeedsNoTorch) {
  Driver("580.65.06");
  HostProbe p = Plan("--agent-only");
  EXPECT_EQ(p.torch_plan, "not-needed") << last_output_;
  EXPECT_THAT(p.torch_problem, IsEmpty());
}

// The probe (what the client reads) carries the decision for the flags it was given.
TEST_F(TorchPlan, TheProbeDecidesForTheWorkersFlags) {
  Driver("570.86.10");
  auto plain = ParseHostProbe(RunShell(Env() + "bash " + kScript + " probe").output);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->torch_plan, "none");
  EXPECT_EQ(plain->gpu_count, 1);
  EXPECT_THAT(BootstrapBlocker(*plain, true), StartsWith("no usable LibTorch for the trainer on this host"));
  auto install = ParseHostProbe(RunShell(Env() + "bash " + kScript + " probe --install-torch").output);
  ASSERT_TRUE(install.ok()) << install.status().ToString();
  EXPECT_EQ(install->torch_plan, "install");
  EXPECT_THAT(FormatHostProbe(*install),
              HasSubstr("LibTorch  not found; to install: PyTorch from " + std::string(kWheels) + "cu128"));
}

// The worker decides before it installs anything: on the Debian 11 stand-in (no PyTorch, apt offering
// libtorch-dev 1.7.1) it fails in its `torch` phase at once, and apt-get, sudo and cmake never run.
TEST_F(TorchPlan, TheWorkerStopsBeforeInstallingAnything) {
  AptCandidate("1.7.1-7");
  Python(Bin() + "/python3", "");
  const std::string ran = dir_.path() + "/ran";
  for (const char* tool : {"apt-get", "sudo", "cmake", "dpkg-query", "pip"}) {
    Exec(Bin() + "/" + tool, "echo " + std::string(tool) + " >> " + ran + "\nexit 1\n");
  }
  const std::string sha = StageSourceArchive();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunShell(Env() + "bash " + kScript + " worker --sha256 " + sha + " --source-id id1 2>&1");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string status = RunShell("cat " + BootDir() + "/status").output;
  EXPECT_THAT(status, StartsWith("failed torch: no usable LibTorch for the trainer on this host; nothing was "
                                 "installed or built. | found: "));
  EXPECT_THAT(status, HasSubstr("found: the distribution's libtorch-dev 1.7.1 (apt): older than 1.13"));
  EXPECT_THAT(r.output, HasSubstr("!! torch failed: "));
  EXPECT_THAT(r.output, Not(HasSubstr("== deps")));
  EXPECT_EQ(RunShell("cat " + ran + " 2>/dev/null").output, "");
}

// --install-torch on a GPU host without torch: after the packages, the worker makes sftctl's own venv,
// installs the wheel of the driver's CUDA there, decides again (the venv's torch is used) and goes on
// to the builds (which fail here: there is no cmake). python3 and the venv's python are fakes: `-m
// venv` makes the venv, its `-m pip install` records its arguments and then has it answer with torch.
TEST_F(TorchPlan, InstallTorchPutsTheDriversWheelIntoSftctlsVenvThenBuilds) {
  Driver("580.65.06");
  const std::string pip_log = dir_.path() + "/pip.log";
  const std::string venv_py = dir_.path() + "/venv-python";
  Exec(venv_py,
       "here=$(dirname \"$0\")\n"
       "case \"$1\" in\n"
       "  -m) echo \"$*\" >> " +
           pip_log +
           "; touch \"$here/installed\" ;;\n"
           "  *) cat >/dev/null; [ -f \"$here/installed\" ] || exit 1\n"
           "     echo python_version=3.12.3; echo torch_version=2.11.0+cu130; echo torch_cuda=13.0\n"
           "     echo torch_cmake=$here/../share/cmake; echo torch_abi=1; echo torch_dir=$here/torch ;;\n"
           "esac\n");
  Exec(Bin() + "/python3",
       "case \"$1\" in\n"
       "  -m) [ \"$2\" = venv ] && mkdir -p \"$3/bin\" && cp " +
           venv_py +
           " \"$3/bin/python\" ;;\n"
           "  -c) exit 0 ;;\n"
           "  *) cat >/dev/null; exit 1 ;;\n"
           "esac\n");
  const std::string sha = StageSourceArchive();
  auto r = RunShell(Env() + "bash " + kScript + " worker --install-torch --sha256 " + sha +
                    " --source-id id1 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(RunShell("cat " + pip_log).output,
            "-m pip install --index-url " + std::string(kWheels) + "cu130 torch\n");
  EXPECT_THAT(r.output,
              HasSubstr("LibTorch: install: PyTorch from " + std::string(kWheels) + "cu130 into " + Venv()));
  EXPECT_THAT(r.output, HasSubstr("== torch-install: installing PyTorch"));
  EXPECT_THAT(r.output, HasSubstr("LibTorch: " + Venv() + "/bin/python: torch 2.11.0+cu130 (CUDA 13.0)"));
  EXPECT_THAT(RunShell("cat " + BootDir() + "/status").output, StartsWith("failed build-agent: "));
}

}  // namespace
}  // namespace sftctl::client
