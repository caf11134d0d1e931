#include "agent/jobs/gpu_discovery.h"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

namespace sftctl::agent {
namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

bool ParseIndex(const std::string& s, int* out) {
  if (s.empty() || s.size() > 4) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  *out = std::atoi(s.c_str());
  return true;
}

}  // namespace

StatusOr<std::vector<GpuInfo>> ParseGpuList(const std::string& list) {
  std::vector<GpuInfo> out;
  std::string t = Trim(list);
  if (t.empty() || t == "none") return out;
  std::stringstream ss(t);
  std::string item;
  std::set<int> seen;
  while (std::getline(ss, item, ',')) {
    GpuInfo g;
    if (!ParseIndex(Trim(item), &g.index)) return InvalidArgumentError("gpus: bad GPU index '" + item + "'");
    if (!seen.insert(g.index).second) return InvalidArgumentError("gpus: GPU " + item + " listed twice");
    g.name = "override";
    out.push_back(g);
  }
  return out;
}

StatusOr<std::vector<GpuInfo>> ParseNvidiaSmi(const std::string& csv) {
  std::vector<GpuInfo> out;
  std::stringstream ss(csv);
  std::string line;
  while (std::getline(ss, line)) {
    if (Trim(line).empty()) continue;
    std::stringstream ls(line);
    std::string idx, name, mem;
    std::getline(ls, idx, ',');
    std::getline(ls, name, ',');
    std::getline(ls, mem, ',');
    GpuInfo g;
    if (!ParseIndex(Trim(idx), &g.index)) return InvalidArgumentError("nvidia-smi: bad line '" + line + "'");
    g.name = Trim(name);
    g.memory_mib = std::strtoull(Trim(mem).c_str(), nullptr, 10);
    out.push_back(g);
  }
  return out;
}

std::vector<GpuInfo> DiscoverGpus() {
  FILE* p = ::popen(
      "command -v nvidia-smi >/dev/null 2>&1 && "
      "nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits 2>/dev/null",
      "r");
  if (p == nullptr) return {};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0) return {};
  auto parsed = ParseNvidiaSmi(out);
  return parsed.ok() ? *parsed : std::vector<GpuInfo>{};
}

}  // namespace sftctl::agent
