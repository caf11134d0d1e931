// FaultFileSystem: a FileSystem wrapper for tests that fails chosen operations, to simulate
// a full disk or a crash in the middle of a multi-file write.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/os/file_system.h"

namespace sftctl::testing {

class FaultFileSystem : public ForwardingFileSystem {
 public:
  explicit FaultFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}

  // Fail the Nth (1-based, counted from now) Append across all files; 0 disables.
  void FailAppendNumber(int n) {
    appends_ = 0;
    fail_append_ = n;
  }
  // Fail operations on paths for which `pred` returns true ("create", "rename" ...).
  void FailWhen(std::function<bool(const std::string& op, const std::string& path)> pred) {
    pred_ = std::move(pred);
  }

  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (Injected("create", path)) return UnavailableError("injected fault: create " + path);
    SFT_ASSIGN_OR_RETURN(auto f, base()->NewWritableFile(path));
    return std::unique_ptr<WritableFile>(new File(this, std::move(f), path));
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (Injected("rename", to)) return UnavailableError("injected fault: rename " + to);
    return base()->Rename(from, to);
  }

 private:
  class File : public WritableFile {
   public:
    File(FaultFileSystem* fs, std::unique_ptr<WritableFile> f, std::string path)
        : fs_(fs), f_(std::move(f)), path_(std::move(path)) {}
    Status Append(std::string_view data) override {
      ++fs_->appends_;
      if (fs_->fail_append_ > 0 && fs_->appends_ == fs_->fail_append_) {
        // Write half of the data, as a crash or a full disk would leave it.
        (void)f_->Append(data.substr(0, data.size() / 2));
        return ResourceExhaustedError("injected fault: write " + path_);
      }
      return f_->Append(data);
    }
    Status Sync() override { return f_->Sync(); }
    Status Close() override { return f_->Close(); }

   private:
    FaultFileSystem* fs_;
    std::unique_ptr<WritableFile> f_;
    std::string path_;
  };

  bool Injected(const std::string& op, const std::string& path) { return pred_ && pred_(op, path); }

  int appends_ = 0;
  int fail_append_ = 0;
  std::function<bool(const std::string&, const std::string&)> pred_;
};

}  // namespace sftctl::testing
