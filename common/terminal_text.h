// Text from another machine (an agent's log lines, job names, error messages) made safe to print
// on the user's terminal.
//
// A GPU host is not trusted by the laptop: a log line holding ESC sequences could rewrite the
// screen, the window title or the clipboard (OSC 52), or hide text. EscapeForTerminal keeps
// printable UTF-8, newline, tab and carriage return (so `\r` progress redraws still work), and
// replaces everything a terminal would act on with a visible escape:
//   - C0 controls other than \n \t \r, and DEL       -> "\x1b" style
//   - C1 controls (U+0080..U+009F, e.g. the 8-bit CSI) -> "\u009b" style
//   - Unicode bidirectional controls (embeddings and overrides U+202A..U+202E, isolates
//     U+2066..U+2069, the marks U+200E U+200F U+061C) -> "\u202e" style
//   - bytes that are not valid UTF-8                 -> "\xff" style
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace sftctl {

std::string EscapeForTerminal(std::string_view text);

// Whether `text` holds, as well-formed UTF-8, a C1 control or a bidirectional control: the code
// points EscapeForTerminal writes as "\u...". (C0 controls and invalid bytes are not counted.)
bool HoldsC1OrBidiControl(std::string_view text);

}  // namespace sftctl
