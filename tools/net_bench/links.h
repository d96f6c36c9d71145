// bagua-net-bench's shaped-link mode (--netns RECV_NS,SEND_NS): see links.cc.
#pragma once

#include "driver.h"

namespace bagua::netbench {

// Runs the mode on the bench's own arguments; returns the exit code (errors exit the process
// with a message, like the rest of the bench).
int linksMain(int argc, char** argv, const DefaultPlugin& defaultPlugin);

}  // namespace bagua::netbench
