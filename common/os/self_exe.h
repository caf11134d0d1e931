// SelfExePath: the absolute, symlink-free path of the running executable (to find sibling binaries
// such as sftctl-trainer next to sftctl). Linux reads /proc/self/exe; macOS asks dyld
// (_NSGetExecutablePath) and resolves the answer with realpath. Stateless and thread-safe.
#pragma once

#include <string>

#include "common/status.h"

namespace sftctl {

// NOT_FOUND when the system cannot tell (e.g. the file was deleted, or an unsupported system);
// UNIMPLEMENTED on a system with neither way.
StatusOr<std::string> SelfExePath();

// The folder part of `path` with its trailing '/': "/a/b/sftctl" -> "/a/b/"; "" when it has none.
std::string DirWithSlash(const std::string& path);

}  // namespace sftctl
