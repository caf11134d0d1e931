// Fuzz target: ~/.ssh/config and the "[user@]host[:port]" a user types (client/remote/ssh/ssh_config.h):
// ParseHostSpec, LookupSshConfig, ResolveHost (the config read from a file), MatchHostPattern,
// ExpandTilde.
//
// Input: "<host spec>\n<ssh config text>".
//
// Properties checked: a resolved host has a non-empty host name and a port in 1..65535, and the
// config's identity files are kept in order without duplicates.
#include <algorithm>

#include "client/remote/ssh/ssh_config.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;
using namespace sftctl::client::ssh;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = fuzz::AsView(data, size);
  const size_t nl = in.find('\n');
  const std::string spec(in.substr(0, nl));
  const std::string config(nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1));
  const std::string home = "/home/me";

  auto hs = ParseHostSpec(spec);
  fuzz::Log("ParseHostSpec", hs.status());
  if (hs.ok()) {
    FUZZ_CHECK(!hs->host.empty(), "an empty host");
    FUZZ_CHECK(!hs->port || (*hs->port >= 1 && *hs->port <= 65535), "port out of range");
  }
  const std::string alias = hs.ok() ? hs->host : spec;
  auto e = LookupSshConfig(config, alias, home, "fuzz/config");
  fuzz::Log("LookupSshConfig", e.status());
  if (e.ok()) {
    FUZZ_CHECK(!e->port || (*e->port >= 1 && *e->port <= 65535), "config port out of range");
    for (size_t i = 0; i < e->identity_files.size(); ++i) {
      FUZZ_CHECK(std::count(e->identity_files.begin(), e->identity_files.end(), e->identity_files[i]) == 1,
                 "a duplicated IdentityFile");
    }
  }
  (void)MatchHostPattern(spec, "gpu-a100.example.com");
  (void)MatchHostPattern("gpu-*.example.?om", spec);
  (void)ExpandTilde(spec, home);

  const std::string file = fuzz::ScratchDir() + "/config";
  fuzz::WriteFile(file, config);
  auto r = ResolveHost(spec, file, home, "me");
  fuzz::Log("ResolveHost", r.status());
  if (r.ok()) {
    FUZZ_CHECK(!r->hostname.empty(), "resolved to an empty host name");
    FUZZ_CHECK(r->port >= 1 && r->port <= 65535, "resolved port out of range");
    FUZZ_CHECK(!r->user.empty(), "resolved to an empty user");
    (void)r->Display();
  }
  return 0;
}
