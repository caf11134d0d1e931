#include "client/remote/registry_file.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "common/os/file_lock.h"
#include "common/os/file_system.h"

namespace sftctl::client {

std::string ClientConfigDir() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/sftctl";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.config/sftctl";
}

StatusOr<std::string> ReadRegistryText(const std::string& path) {
  FileSystem* fs = FileSystem::Default();
  if (!fs->Exists(path)) return std::string();
  return fs->ReadFile(path);
}

Status UpdateRegistryFile(const std::string& path,
                          const std::function<StatusOr<std::string>(const std::string& text)>& change) {
  FileSystem* fs = FileSystem::Default();
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (!dir.empty()) SFT_RETURN_IF_ERROR(fs->CreateDirs(dir));
  // A short poll: a registry update holds the lock for a read and a write, milliseconds.
  SFT_ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(path + ".lock", /*cancelled=*/nullptr,
                                                        /*on_wait=*/nullptr, std::chrono::milliseconds(5)));
  SFT_ASSIGN_OR_RETURN(std::string text, ReadRegistryText(path));
  SFT_ASSIGN_OR_RETURN(std::string changed, change(text));
  return WriteFileAtomic(fs, path, changed);
}

}  // namespace sftctl::client
