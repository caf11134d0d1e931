#include "common/source_id.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/os/self_exe.h"

namespace sftctl {
namespace {

std::string ShareDir() {
  if (const char* env = std::getenv("SFTCTL_SHARE_DIR"); env != nullptr && *env) return env;
  StatusOr<std::string> self = SelfExePath();
  if (!self.ok()) return "";
  const std::string bin = self->substr(0, self->rfind('/'));
  return bin.substr(0, bin.rfind('/')) + "/share/sftctl";
}

std::string ReadId() {
  std::ifstream in(ShareDir() + "/SOURCE_ID");
  std::string id;
  if (!(in >> id) || id.size() != 64 || id.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return "unknown";
  }
  return id;
}

}  // namespace

const std::string& SourceId() {
  static const std::string id = ReadId();
  return id;
}

std::string ShortSourceId(const std::string& id) { return id.size() == 64 ? id.substr(0, 12) : id; }

}  // namespace sftctl
