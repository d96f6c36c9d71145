// The options the collective benchmarks share (bagua-allreduce-bench, bagua-nccl-comm-bench):
// --sizes LIST, --iters N, --reps N, parsed once so the tools accept the same values. No CUDA, no
// process group: any tool may link it. Pure functions: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "bagua/base/status.h"

namespace bagua::demo {

// A comma-separated list of byte sizes ("4K,64K,1M"; each as bagua::parseBytes reads it), each at
// least `min`. InvalidArgument "bad size '<item>'" for the first item that is not (an empty list
// or an empty item included).
Result<std::vector<size_t>> parseByteList(std::string_view text, uint64_t min);

// The options' values; a tool sets its defaults before parsing.
struct BenchArgs {
  std::vector<size_t> sizes;  // --sizes: message sizes in bytes, each >= 4
  int iters = 0;              // --iters: timed iterations (1..100000)
  int reps = 3;               // --reps: repetitions of each measurement (1..100000)
};

// If argv[*i] is one of the options above and a value follows, reads the value into `a`, moves
// *i to it and returns 1. Returns 0 (nothing read) for any other argument or a missing value, and
// -1 after "<tool>: <what is wrong>" on stderr for a bad value.
int parseBenchArg(const char* tool, int argc, char** argv, int* i, BenchArgs* a);

}  // namespace bagua::demo
