// TEMPORARY (lead's branch, removed at merge with srcid).
#include <cstdlib>

#include "common/source_id.h"
namespace sftctl {
const char* SourceId() {
  const char* e = std::getenv("SFTCTL_TEST_SOURCE_ID");
  return e != nullptr ? e : "unknown";
}
}  // namespace sftctl
