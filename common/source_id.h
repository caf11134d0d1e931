// TEMPORARY (lead's branch, replaced by the srcid branch at merge).
#pragma once
namespace sftctl {
const char* SourceId();
}
