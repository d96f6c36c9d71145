// bagua-net-bench's ring mode (--ring N): see ring.cc.
#pragma once

#include "driver.h"

namespace bagua::netbench {

// Runs the mode on the bench's own arguments; returns the exit code (errors exit the process
// with a message, like the rest of the bench).
int ringMain(int argc, char** argv, const DefaultPlugin& defaultPlugin);

}  // namespace bagua::netbench
