// Unit tests of the SSH transport's pure parts: host specs, ~/.ssh/config lookup, base64 and
// fingerprints, key types of key files, known_hosts checks (with a bare libssh2 session).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <libssh2.h>

#include <algorithm>

#include "client/remote/ssh/known_hosts.h"
#include "client/remote/ssh/ssh_config.h"
#include "client/remote/ssh/ssh_keys.h"
#include "tests/ssh/sshd_fixture.h"
#include "tests/util/status_matchers.h"

namespace sftctl::client::ssh {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(HostSpec, ParsesUserHostPort) {
  auto a = ParseHostSpec("ubuntu@gpu-box:2222");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->user, "ubuntu");
  EXPECT_EQ(a->host, "gpu-box");
  EXPECT_EQ(a->port, 2222);
  auto b = ParseHostSpec("box");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->user, "");
  EXPECT_FALSE(b->port.has_value());
  auto c = ParseHostSpec("root@[::1]:22");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 22);
  auto d = ParseHostSpec("fe80::1");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->host, "fe80::1");
}

TEST(HostSpec, RejectsBadPortsAndEmptyParts) {
  for (const char* bad : {"box:0", "box:70000", "box:x", "box:", "@box", "user@", ""}) {
    auto r = ParseHostSpec(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseHostSpec("box:70000"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("bad port")));
}

TEST(SshConfig, PatternsMatchLikeOpenSsh) {
  EXPECT_TRUE(MatchHostPattern("*", "anything"));
  EXPECT_TRUE(MatchHostPattern("gpu-*", "gpu-a100"));
  EXPECT_TRUE(MatchHostPattern("gpu-?", "gpu-1"));
  EXPECT_FALSE(MatchHostPattern("gpu-?", "gpu-10"));
  EXPECT_TRUE(MatchHostPattern("*.example.com", "a.b.Example.COM"));
  EXPECT_FALSE(MatchHostPattern("box", "box2"));
}

TEST(SshConfig, FirstValueWinsAndIdentityFilesAccumulate) {
  const char* cfg = R"(# comment
Host lambda gpu-*
  HostName 10.0.0.5
  User ubuntu
  IdentityFile ~/.ssh/id_lambda
Host gpu-2 !gpu-3
  HostName 10.0.0.99
  Port 2222
Host *
  User nobody
  Port=22
  IdentityFile "~/.ssh/id_all"
Match host foo
  User matched
)";
  auto e = LookupSshConfig(cfg, "gpu-2", "/home/me");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->hostname, "10.0.0.5");  // first obtained value wins
  EXPECT_EQ(e->user, "ubuntu");
  EXPECT_EQ(e->port, 2222);
  ASSERT_EQ(e->identity_files.size(), 2u);
  EXPECT_EQ(e->identity_files[0], "/home/me/.ssh/id_lambda");
  EXPECT_EQ(e->identity_files[1], "/home/me/.ssh/id_all");

  auto other = LookupSshConfig(cfg, "gpu-3", "/home/me");  // negated in the second block
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->port, 22);
  auto none = LookupSshConfig(cfg, "foo", "/home/me");  // Match host foo comes after Host *: its User loses
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->user, "nobody");
  EXPECT_EQ(none->hostname, "");
}

TEST(SshConfig, BadPortNamesFileAndLine) {
  auto e = LookupSshConfig("Host x\n  Port abc\n", "x", "/h", "/h/.ssh/config");
  EXPECT_THAT(e, StatusIs(StatusCode::kInvalidArgument, HasSubstr("/h/.ssh/config:2")));
}

TEST(SshConfig, ResolveHostCombinesSpecAndConfig) {
  std::string dir = ::testing::TempDir() + "/sshcfg-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  sshtest::WriteWholeFile(dir + "/config", "Host box\n HostName 127.0.0.1\n User alice\n Port 2200\n");
  auto r = ResolveHost("box", dir + "/config", "/home/me", "me");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Display(), "alice@127.0.0.1:2200");
  auto r2 = ResolveHost("bob@box:2300", dir + "/config", "/home/me", "me");
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->Display(), "bob@127.0.0.1:2300");  // the spec wins over the config
  auto r3 = ResolveHost("plain", dir + "/missing", "/home/me", "me");
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->Display(), "me@plain:22");
  std::filesystem::remove_all(dir);
}

TEST(SshKeys, Base64RoundTripAndFingerprintFormat) {
  for (std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    auto d = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, s);
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode("fo", false), "Zm8");
  std::string digest(32, '\0');
  std::string fp = FingerprintFromDigest(digest);
  EXPECT_EQ(fp, "SHA256:" + std::string(43, 'A'));  // 32 bytes -> 43 characters, no padding
  EXPECT_EQ(Base64Decode("Zm9v!").status().code(), StatusCode::kInvalidArgument);
}

TEST(SshKeys, KeyTypeOfFilesWithAndWithoutPub) {
  std::string dir = ::testing::TempDir() + "/sshkeys-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  for (auto [type, want] : std::vector<std::pair<std::string, std::string>>{
           {"ed25519", "ssh-ed25519"}, {"rsa", "ssh-rsa"}, {"ecdsa", "ecdsa-sha2-nistp256"}}) {
    std::string path = dir + "/k_" + type;
    auto r = sshtest::RunCommand({"ssh-keygen", "-q", "-t", type, "-N", "", "-f", path});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(KeyTypeOfFile(path), want);
    std::filesystem::remove(path + ".pub");  // from the private key's public section
    EXPECT_EQ(KeyTypeOfFile(path), want);
    EXPECT_FALSE(KeyFileIsEncrypted(path));
  }
  auto r = sshtest::RunCommand({"ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", dir + "/enc"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(KeyFileIsEncrypted(dir + "/enc"));
  EXPECT_EQ(KeyTypeOfFile(dir + "/missing"), "");
  std::filesystem::remove_all(dir);
}

// A new host key made by ssh-keygen in `dir` (type "ed25519" or "ecdsa"), and its known_hosts text
// ("<type> <base64>").
std::pair<HostKey, std::string> KeyPair(const std::string& dir, const std::string& name,
                                        const std::string& type) {
  auto r = sshtest::RunCommand({"ssh-keygen", "-q", "-t", type, "-N", "", "-f", dir + "/" + name});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream ss(sshtest::ReadWholeFile(dir + "/" + name + ".pub"));
  std::string t, b64;
  ss >> t >> b64;
  HostKey k;
  k.blob = *Base64Decode(b64);
  k.type_name = t;
  k.libssh2_type = t == "ssh-ed25519" ? LIBSSH2_HOSTKEY_TYPE_ED25519 : LIBSSH2_HOSTKEY_TYPE_ECDSA_256;
  return {k, t + " " + b64};
}

TEST(KnownHosts, PlainHashedMismatchOtherTypeAndAdd) {
  std::string dir = ::testing::TempDir() + "/knownhosts-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto keygen = [&](const std::string& name, const std::string& type) { return KeyPair(dir, name, type); };
  auto [key, line] = keygen("a", "ed25519");
  auto [other, other_line] = keygen("b", "ed25519");
  auto [ecdsa, ecdsa_line] = keygen("c", "ecdsa");
  ASSERT_EQ(libssh2_init(0), 0);
  LIBSSH2_SESSION* s = libssh2_session_init();
  std::string kh = dir + "/known_hosts";
  auto check = [&](const HostKey& k, int port) { return CheckKnownHost(s, kh, "127.0.0.1", port, k); };

  EXPECT_EQ(*check(key, 2222), HostKeyState::kUnknown);  // missing file
  sshtest::WriteWholeFile(kh, "@cert-authority *.x ssh-ed25519 AAAA\n[127.0.0.1]:2222 " + line + "\n");
  EXPECT_EQ(*check(key, 2222), HostKeyState::kMatch);
  EXPECT_EQ(*check(key, 22), HostKeyState::kUnknown);  // "[host]:port" is only for that port
  EXPECT_EQ(*check(other, 2222), HostKeyState::kMismatch);
  EXPECT_EQ(*check(ecdsa, 2222), HostKeyState::kOtherTypeKnown);
  // Hashed entries.
  ASSERT_EQ(sshtest::RunCommand({"ssh-keygen", "-H", "-f", kh}).exit_code, 0);
  EXPECT_THAT(sshtest::ReadWholeFile(kh), Not(HasSubstr("127.0.0.1")));
  EXPECT_EQ(*check(key, 2222), HostKeyState::kMatch);
  EXPECT_EQ(*check(other, 2222), HostKeyState::kMismatch);
  // Recording creates the folder (0700) and appends a line OpenSSH reads.
  std::string kh2 = dir + "/newdir/known_hosts";
  ASSERT_TRUE(AddKnownHost(s, kh2, "127.0.0.1", 2200, key).ok());
  ASSERT_TRUE(AddKnownHost(s, kh2, "gpu-box", 22, other).ok());
  EXPECT_EQ(std::filesystem::status(dir + "/newdir").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  std::string text = sshtest::ReadWholeFile(kh2);
  EXPECT_THAT(text, HasSubstr("[127.0.0.1]:2200 " + line));
  EXPECT_THAT(text, HasSubstr("gpu-box " + other_line));
  EXPECT_EQ(*CheckKnownHost(s, kh2, "127.0.0.1", 2200, key), HostKeyState::kMatch);
  auto found = sshtest::RunCommand({"ssh-keygen", "-F", "[127.0.0.1]:2200", "-f", kh2});
  EXPECT_EQ(found.exit_code, 0) << found.output;
  libssh2_session_free(s);
  std::filesystem::remove_all(dir);
}

TEST(KnownHosts, RevokedKeysAreRefusedAndHashedFilesGetHashedEntries) {
  std::string dir = ::testing::TempDir() + "/knownhosts-rev-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  auto keygen = [&](const std::string& name) { return KeyPair(dir, name, "ed25519"); };
  auto [key, line] = keygen("a");
  auto [other, other_line] = keygen("b");
  ASSERT_EQ(libssh2_init(0), 0);
  LIBSSH2_SESSION* s = libssh2_session_init();
  const std::string kh = dir + "/known_hosts";

  // A revoked key is refused even where a plain entry for the host holds it, and for any host.
  sshtest::WriteWholeFile(kh, "[127.0.0.1]:2222 " + line + "\n@revoked * " + line + "\n");
  EXPECT_EQ(*CheckKnownHost(s, kh, "127.0.0.1", 2222, key), HostKeyState::kRevoked);
  EXPECT_EQ(*CheckKnownHost(s, kh, "elsewhere", 22, key), HostKeyState::kRevoked);
  EXPECT_EQ(*CheckKnownHost(s, kh, "127.0.0.1", 2222, other), HostKeyState::kMismatch);

  // A file of hashed entries gets a hashed entry: the host name is not written, and both
  // libssh2 and OpenSSH find it.
  sshtest::WriteWholeFile(kh, "gpu-box " + other_line + "\n");
  ASSERT_EQ(sshtest::RunCommand({"ssh-keygen", "-H", "-f", kh}).exit_code, 0);
  ASSERT_TRUE(AddKnownHost(s, kh, "10.1.2.3", 2200, key).ok());
  const std::string text = sshtest::ReadWholeFile(kh);
  EXPECT_THAT(text, Not(HasSubstr("10.1.2.3")));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_EQ(*CheckKnownHost(s, kh, "10.1.2.3", 2200, key), HostKeyState::kMatch);
  auto found = sshtest::RunCommand({"ssh-keygen", "-F", "[10.1.2.3]:2200", "-f", kh});
  EXPECT_EQ(found.exit_code, 0) << found.output;
  libssh2_session_free(s);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sftctl::client::ssh
