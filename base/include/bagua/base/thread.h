// Thread naming: every bagua thread is named ("bagua-net-tx3", "bagua-bucket") so logs, top -H
// and gdb agree. Names longer than the kernel's 15 characters are truncated.
//
// Thread safety: acts on the calling thread only.
#pragma once

#include <string>
#include <string_view>

namespace bagua {

// Names the calling thread (kernel name and the name used in log prefixes).
void setThreadName(std::string_view name);

// The name given by setThreadName, else the kernel's name of the thread.
std::string threadName();

// The kernel thread id of the calling thread.
int threadId();

}  // namespace bagua
