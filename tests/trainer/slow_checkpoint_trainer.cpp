// sftctl-trainer as shipped (trainer/tools/trainer_cli.h), with a file system that makes the first
// checkpoint this process writes take SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S seconds longer, as a
// large model's would (tests/trainer/distributed_test.cpp, zero_test.cpp: the other ranks wait for
// it longer than the collective timeout). The seam lives in this test program, not in the trainer.
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/os/file_system.h"
#include "trainer/tools/trainer_cli.h"

namespace {

class SlowFirstCheckpoint : public sftctl::ForwardingFileSystem {
 public:
  SlowFirstCheckpoint(sftctl::FileSystem* base, double delay_s)
      : ForwardingFileSystem(base), delay_s_(delay_s) {}
  // A checkpoint's folder is synced once, before it is renamed into place.
  sftctl::Status SyncDir(const std::string& path) override {
    if (!slept_ && path.find("/.tmp-checkpoint-") != std::string::npos) {
      slept_ = true;
      std::this_thread::sleep_for(std::chrono::duration<double>(delay_s_));
    }
    return ForwardingFileSystem::SyncDir(path);
  }

 private:
  double delay_s_;
  bool slept_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  const char* delay = std::getenv("SFTCTL_TEST_SLOW_FIRST_CHECKPOINT_S");
  SlowFirstCheckpoint fs(sftctl::FileSystem::Default(), delay != nullptr ? std::atof(delay) : 0.0);
  return sftctl::trainer::TrainerMain(argc, argv, &fs);
}
