#include "common/os/net_addr.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

namespace sftctl {

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, std::string(host).c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

}  // namespace sftctl
