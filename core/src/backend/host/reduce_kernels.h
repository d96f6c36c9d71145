// Element-wise reductions for the host backend: dst = dst (op) src over `count` elements.
// Loops are written so the compiler vectorises them (this file's .cc is built with -O3);
// f16 and bf16 are converted through f32 in small blocks. ReduceEngine splits large calls over
// a few helper threads.
//
// Thread safety: the free functions are pure. A ReduceEngine is used by one thread at a time
// (the communicator's worker); its helpers are private to it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "bagua/core/types.h"

namespace bagua::core::host {

// Avg reduces like Sum; finish with divideBy().
void reduceInto(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);
// data /= n (integers: truncating division).
void divideBy(void* data, size_t count, DataType dtype, int n);

class ReduceEngine {
 public:
  // threads <= 1: everything on the caller's thread.
  explicit ReduceEngine(int threads);
  ~ReduceEngine();
  ReduceEngine(const ReduceEngine&) = delete;
  ReduceEngine& operator=(const ReduceEngine&) = delete;

  void reduce(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

 private:
  void helperLoop(std::stop_token stop, int index);

  int threads_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::condition_variable doneCv_;
  std::function<void(int)> job_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  std::vector<std::jthread> helpers_;
};

}  // namespace bagua::core::host
