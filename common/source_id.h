// SourceId: which source this build of sftctl, sftd or sftctl-trainer was made from.
//
// The id is the sha256 of the source files (cmake/source_archive.cmake writes it, with the source
// archive `sftctl bootstrap` uploads, into <build or install prefix>/share/sftctl/SOURCE_ID). The
// binaries read it at run time from `$SFTCTL_SHARE_DIR/SOURCE_ID`, else from
// `<folder of the executable>/../share/sftctl/SOURCE_ID` (build/release/bin -> build/release/share,
// ~/.local/bin -> ~/.local/share), so a change to any file does not relink every binary. The client
// and the agent compare ids on connect (client/remote/ssh/remote_agent.cpp), and bootstrap decides with them
// whether a host is up to date.
//
// Thread safety: SourceId() reads the file once (thread-safe static) and returns the same string after.
#pragma once

#include <string>

namespace sftctl {

// 64 lowercase hex digits, or "unknown" when the file is missing or malformed.
const std::string& SourceId();
// The first 12 digits, as `--version` prints them ("unknown" stays whole).
std::string ShortSourceId(const std::string& id);

}  // namespace sftctl
