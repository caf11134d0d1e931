// Relative paths named by another machine, made safe to use beneath a folder the user chose.
//
// The laptop does not trust the GPU host: `sftctl pull` writes files whose names the agent
// lists. This is the one policy for turning such a name into a local path:
//   - CheckRelativePath accepts only a relative path made of plain names: not empty, not
//     absolute, no "." or ".." component, no empty component ("a//b", a trailing "/"), no NUL or
//     other C0 control or DEL, no C1 or bidirectional control in UTF-8 (common/terminal_text.h),
//     no backslash, at most 4096 bytes.
//   - PathBeneath joins an accepted path to `root` and also refuses it when a component that
//     already exists beneath `root` is a symbolic link (the write would land elsewhere) or a
//     non-folder where a folder is needed. `root` itself may be a link: the user named it.
// Neither creates anything. The check is made before writing; writers still open their files
// with O_NOFOLLOW and rename into place (client/transfer/puller.cpp). Thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace sftctl {

// OK, or INVALID_ARGUMENT naming the (escaped) path and what is wrong with it.
Status CheckRelativePath(std::string_view rel);

// root + "/" + rel; INVALID_ARGUMENT as above; FAILED_PRECONDITION naming the linked component.
StatusOr<std::string> PathBeneath(const std::string& root, std::string_view rel);

}  // namespace sftctl
