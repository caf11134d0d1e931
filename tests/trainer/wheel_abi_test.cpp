// A pip wheel's libtorch exports its own copy of libstdc++'s std::filesystem (pytorch#133437); on an
// H100 host every trainer test crashed in it. This program links the stand-in library
// (tests/trainer/wheel_standin/) whose std::filesystem functions abort, in LibTorch's place: a
// checkpoint save, rotation and resume pass only while trainer/libstdcxx_first.cmake puts the
// system libstdc++ first.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "tests/trainer/test_util.h"
#include "trainer/training/trainer.h"

namespace sftctl::trainer {
namespace {

using sftctl::testing::MakeTempDir;
using sftctl::testing::StepLosses;
using sftctl::testing::TinySpec;

constexpr char kStandIn[] = "libsftctl_wheel_stdfs_standin.so";
// std::filesystem::remove_all(const path&, error_code&), the new C++ ABI's and the old one's.
constexpr char kRemoveAllNewAbi[] = "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code";
constexpr char kRemoveAllOldAbi[] = "_ZNSt10filesystem10remove_allERKNS_4pathERSt10error_code";

using RemoveAllFn = std::uintmax_t (*)(const std::filesystem::path&, std::error_code&);

// The stand-in is loaded, and its remove_all is the poisoned one: the other tests prove nothing
// without this.
TEST(WheelStandIn, IsLoadedAndItsFilesystemAborts) {
  void* h = dlopen(kStandIn, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr) << kStandIn << " is not loaded in this process: " << dlerror();
  void* sym = dlsym(h, _GLIBCXX_USE_CXX11_ABI ? kRemoveAllNewAbi : kRemoveAllOldAbi);
  ASSERT_NE(sym, nullptr) << "the stand-in defines no remove_all (its generator listed no symbol?)";
  // fast: the child is forked from this process as it is (a re-executed one would set up its own
  // $TMPDIR and, aborting, leave it behind).
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_DEATH(
      {
        std::error_code ec;
        reinterpret_cast<RemoveAllFn>(sym)(std::filesystem::path("/nonexistent"), ec);
      },
      "poisoned std::filesystem symbol _ZNSt10filesystem10remove_all");
  dlclose(h);
}

// This program's own std::filesystem calls resolve into the system libstdc++, not the stand-in.
TEST(WheelStandIn, OurCallsBindToTheSystemLibstdcxx) {
  RemoveAllFn ours = &std::filesystem::remove_all;
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(ours), &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  EXPECT_NE(std::string(info.dli_fname).find("libstdc++"), std::string::npos)
      << "std::filesystem::remove_all binds to " << info.dli_fname;
}

// What a user's job does on a wheel host: checkpoints every 2 steps, keeps 1 (each save removes
// the one before), is stopped, resumes, and matches the uninterrupted run.
TEST(WheelStandIn, CheckpointsRotateAndResumeExactly) {
  const std::string dir = MakeTempDir("wheel");
  auto spec_for = [&](const std::string& sub) {
    JobSpec s = TinySpec(dir + "/" + sub, 8);
    s.checkpoint.interval = 2;
    s.checkpoint.keep = 1;
    return s;
  };
  const JobSpec full = spec_for("full");
  auto r_full = Train(full, {});
  ASSERT_TRUE(r_full.ok()) << r_full.status().ToString();

  const JobSpec part = spec_for("part");
  TrainOptions stop;
  stop.hooks.stop_after_step = 5;
  ASSERT_TRUE(Train(part, stop).ok());
  auto resumed = Train(part, {});
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->resumed_from_step, 4);
  EXPECT_EQ(StepLosses(full.output_dir).back(), StepLosses(part.output_dir).back());

  std::vector<std::string> checkpoints;
  for (const auto& e : std::filesystem::directory_iterator(part.output_dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0 || name.rfind(".tmp-", 0) == 0) checkpoints.push_back(name);
  }
  EXPECT_EQ(checkpoints, std::vector<std::string>{"checkpoint-000008"});
}

}  // namespace
}  // namespace sftctl::trainer
