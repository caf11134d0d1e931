// Linked into every executable of a -fsanitize=thread build (the tsan preset; see the top-level
// CMakeLists.txt), so that the suppressions hold wherever a binary runs: also sftd started by
// another test through sshd, which passes no TSAN_OPTIONS. The list is tests/sanitizers/tsan.supp,
// embedded at build time.
extern "C" const char* __tsan_default_suppressions() {
  return
#include "tsan_supp.inc"
      ;
}
