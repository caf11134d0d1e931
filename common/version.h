// The version of sftctl, shared by every binary so the client can detect a mismatched agent.
#pragma once

namespace sftctl {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace sftctl
