#include "common/tokenizer/bpe_pre_tokenizer.h"

namespace sftctl {
namespace bpe_internal {

MatchResources::MatchResources() {
  match_data = pcre2_match_data_create(1, nullptr);
  context = pcre2_match_context_create(nullptr);
  jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
}

MatchResources::~MatchResources() {
  pcre2_match_data_free(match_data);
  pcre2_match_context_free(context);
  if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
}

std::unique_ptr<Regex> Regex::Compile(const std::string& pattern, bool literal, std::string* error) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL does not combine with PCRE2_UCP (which only affects escapes anyway).
  const uint32_t options =
      literal ? PCRE2_UTF | PCRE2_NO_UTF_CHECK | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                   &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error_code, buffer, sizeof(buffer));
    *error = "PCRE2 error at offset " + std::to_string(error_offset) + ": " +
             reinterpret_cast<const char*>(buffer);
    return nullptr;
  }
  auto regex = std::unique_ptr<Regex>(new Regex());
  regex->code_ = code;
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex;
}

Regex::~Regex() { pcre2_code_free(code_); }

}  // namespace bpe_internal
}  // namespace sftctl
