#include "common/checkpoint_name.h"

#include <cstdio>

namespace sftctl {
namespace {

constexpr std::string_view kPrefix = "checkpoint-";

}  // namespace

std::string CheckpointName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "checkpoint-%06lld", static_cast<long long>(step));
  return buf;
}

int64_t CheckpointStep(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix || name.size() == kPrefix.size() ||
      name.size() > kPrefix.size() + 18)
    return -1;
  int64_t step = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

}  // namespace sftctl
