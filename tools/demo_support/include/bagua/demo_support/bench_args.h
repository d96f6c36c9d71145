// The options the collective benchmarks share (bagua-allreduce-bench, bagua-nccl-comm-bench):
// --sizes LIST, --iters N, --reps N, declared once so the tools accept the same values. No CUDA, no
// process group: any tool may link it. Pure functions: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "bagua/base/status.h"

namespace CLI {
class App;
}

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

// Adds --sizes, --iters and --reps to a tool's command line (tools/cli_support conventions),
// writing into `a` (its values before the parse are the defaults): a bad value is a usage error
// naming the option and the value.
void addBenchOptions(CLI::App& app, BenchArgs* a);

}  // namespace bagua::demo
