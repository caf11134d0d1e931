#include "client/cloud/provider.h"

namespace sftctl::client::cloud {

const char* InstanceStateName(InstanceState s) {
  switch (s) {
    case InstanceState::kStarting:
      return "starting";
    case InstanceState::kRunning:
      return "running";
    case InstanceState::kStopping:
      return "stopping";
    case InstanceState::kTerminated:
      return "terminated";
    case InstanceState::kUnhealthy:
      return "unhealthy";
    case InstanceState::kOther:
      break;
  }
  return "other";
}

}  // namespace sftctl::client::cloud
