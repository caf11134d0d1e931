// The body of every poisoned std::filesystem symbol of the wheel stand-in (see CMakeLists.txt
// here): says which symbol was reached and why that is a bug, then aborts. Plain C and write(2):
// nothing here may itself call into libstdc++.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/trainer/wheel_standin/poisoned_filesystem.h"

static void Say(const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

void sftctl_poisoned_call(const char* symbol) {
  Say("sftctl wheel stand-in: poisoned std::filesystem symbol ");
  Say(symbol);
  Say(" called: the call bound to LibTorch's copy of libstdc++ instead of the system's "
      "(see trainer/libstdcxx_first.cmake)\n");
  abort();
}
