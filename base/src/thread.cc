#include "bagua/base/thread.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace bagua {

namespace {
thread_local std::string tlsName;
}  // namespace

void setThreadName(std::string_view name) {
  tlsName = std::string(name);
  // The kernel keeps 15 characters plus the terminator.
  std::string kernelName = tlsName.substr(0, 15);
  pthread_setname_np(pthread_self(), kernelName.c_str());
}

std::string threadName() {
  if (!tlsName.empty()) {
    return tlsName;
  }
  char buf[16] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof(buf)) == 0) {
    return buf;
  }
  return {};
}

int threadId() {
  return static_cast<int>(::syscall(SYS_gettid));
}

}  // namespace bagua
