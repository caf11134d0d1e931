// Fuzz target: a known_hosts file (client/remote/ssh/known_hosts.h) checked and appended to with a bare
// libssh2 session (no connection), plus the key helpers it relies on (client/remote/ssh/ssh_keys.h:
// Base64Decode, KeyTypeOfBlob) on each line's key field.
//
// Input: the file's bytes. Three fixed host keys (two ed25519, one ECDSA; the seeds name them)
// are checked for a few host:port names; then an entry is recorded with AddKnownHost.
//
// Properties checked: after AddKnownHost, the recorded key is a match for that host (or revoked by
// an "@revoked" line, which always wins) — whatever the file held before.
#include <libssh2.h>

#include <sstream>

#include "client/remote/ssh/known_hosts.h"
#include "client/remote/ssh/ssh_keys.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;
using namespace sftctl::client::ssh;

namespace {

HostKey Key(const char* type, const char* b64, int libssh2_type) {
  auto blob = Base64Decode(b64);
  FUZZ_CHECK(blob.ok(), "bad built-in key");
  HostKey k;
  k.blob = *blob;
  k.type_name = type;
  k.libssh2_type = libssh2_type;
  return k;
}

struct Fixture {
  LIBSSH2_SESSION* session = nullptr;
  HostKey a, b, c;
  Fixture() {
    FUZZ_CHECK(libssh2_init(0) == 0, "libssh2_init");
    session = libssh2_session_init();
    FUZZ_CHECK(session != nullptr, "libssh2_session_init");
    a = Key("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIECA4rRIbUQKhfh8HGpB0R9IbZjg2YN64AcEt5pDJ/1M",
            LIBSSH2_HOSTKEY_TYPE_ED25519);
    b = Key("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIKSkX7pSE07aomuMzxP5AHPF7kjZNWel2FfXNa7JLbfV",
            LIBSSH2_HOSTKEY_TYPE_ED25519);
    c = Key("ecdsa-sha2-nistp256",
            "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBGTMK/3dl+pTqdScA2tv+/"
            "G3uZknSPbH8rv7c9mdS5ir8WCNxPJr"
            "ecjxFLYj8jzGpXzklJlcoHSujEediiNWZOc=",
            LIBSSH2_HOSTKEY_TYPE_ECDSA_256);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fx = new Fixture();  // the session lives as long as the process
  const std::string_view text = fuzz::AsView(data, size);
  const std::string file = fuzz::ScratchDir() + "/known_hosts";
  fuzz::WriteFile(file, text);

  // The key fields, as ssh_keys.h reads them.
  for (std::string_view line : fuzz::Split(text, "\n")) {
    std::istringstream ss{std::string(line)};
    std::string f1, f2, f3;
    ss >> f1 >> f2 >> f3;
    for (const std::string* f : {&f2, &f3}) {
      auto blob = Base64Decode(*f);
      if (blob.ok()) (void)KeyTypeOfBlob(*blob);
    }
  }

  struct Probe {
    const char* host;
    int port;
    const HostKey* key;
  };
  const Probe probes[] = {{"127.0.0.1", 2222, &fx->a},
                          {"gpu-box", 22, &fx->b},
                          {"10.1.2.3", 2200, &fx->c},
                          {"elsewhere", 22, &fx->a},
                          {"127.0.0.1", 2222, &fx->c}};
  for (const Probe& p : probes) {
    auto st = CheckKnownHost(fx->session, file, p.host, p.port, *p.key);
    fuzz::Log(std::string("CheckKnownHost ") + p.host, st.status());
  }

  Status added = AddKnownHost(fx->session, file, "new-host.example", 2200, fx->b);
  fuzz::Log("AddKnownHost", added);
  FUZZ_CHECK(added.ok(), "AddKnownHost failed: " + added.ToString());
  auto after = CheckKnownHost(fx->session, file, "new-host.example", 2200, fx->b);
  FUZZ_CHECK(after.ok(), "CheckKnownHost after AddKnownHost: " + after.status().ToString());
  FUZZ_CHECK(
      *after == HostKeyState::kMatch || *after == HostKeyState::kRevoked,
      "the host just recorded is not a match (state " + std::to_string(static_cast<int>(*after)) + ")");
  return 0;
}
