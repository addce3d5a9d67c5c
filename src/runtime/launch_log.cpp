#include "epilog/runtime/launch_log.h"

namespace epilog {

namespace {
thread_local LaunchLog* installed = nullptr;
}  // namespace

LaunchLog::LaunchLog() : previous_(installed) {
  installed = this;
}

LaunchLog::~LaunchLog() {
  installed = previous_;
}

LaunchLog* LaunchLog::current() {
  return installed;
}

}  // namespace epilog
