// The wheel stand-in's poisoned definitions (CMakeLists.txt here generates one per symbol).
#ifndef SFTCTL_TESTS_TRAINER_WHEEL_STANDIN_POISONED_FILESYSTEM_H_
#define SFTCTL_TESTS_TRAINER_WHEEL_STANDIN_POISONED_FILESYSTEM_H_

#ifdef __cplusplus
extern "C" {
#endif

// Prints that `symbol` (a mangled name) was called through the stand-in, then aborts.
__attribute__((noreturn)) void sftctl_poisoned_call(const char* symbol);

#ifdef __cplusplus
}
#endif

// SFTCTL_POISON(N, "mangled"): a strong, default-visibility, unversioned function named `mangled`
// (an assembler label: the C name is poison_N) whose body reports the call and aborts.
#define SFTCTL_POISON(n, sym)                \
  void sftctl_poison_##n(void) __asm__(sym); \
  void sftctl_poison_##n(void) { sftctl_poisoned_call(sym); }

#endif  // SFTCTL_TESTS_TRAINER_WHEEL_STANDIN_POISONED_FILESYSTEM_H_
