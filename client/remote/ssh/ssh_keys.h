// Key material helpers: base64, OpenSSH SHA256 fingerprints, and the key type of a public key blob
// or of a key file (its .pub, else the public half stored unencrypted in an "OPENSSH PRIVATE KEY").
// Pure functions, thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl::client::ssh {

std::string Base64Encode(std::string_view data, bool pad = true);
// INVALID_ARGUMENT on characters outside the alphabet; whitespace is skipped.
StatusOr<std::string> Base64Decode(std::string_view text);

// "SHA256:<base64 without padding>" of a raw 32-byte digest, as `ssh-keygen -l` prints it.
std::string FingerprintFromDigest(std::string_view sha256_digest);

// The algorithm name at the start of an SSH wire-format public key blob ("ssh-ed25519", "ssh-rsa",
// "ecdsa-sha2-nistp256", ...); empty if the blob is malformed.
std::string KeyTypeOfBlob(std::string_view blob);

// The algorithm name of a private key file: from "<path>.pub" when it exists, else from the key file
// itself ("OPENSSH PRIVATE KEY" public section; PEM "RSA/EC/DSA PRIVATE KEY" headers). Empty when it
// cannot tell (the file is missing or unreadable).
std::string KeyTypeOfFile(const std::string& private_key_path);

// True when the key file's PEM or OpenSSH container says it is passphrase-protected.
bool KeyFileIsEncrypted(const std::string& private_key_path);

inline bool IsRsaKeyType(const std::string& type) {
  return type == "ssh-rsa" || type.rfind("rsa-sha2", 0) == 0;
}

}  // namespace sftctl::client::ssh
